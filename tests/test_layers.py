"""The layers of ``metering/``, and the import graph held to them: no circle of imports, and no
import that runs back up a layer.

``LAYERS`` lists them from the ground up. Each layer holds one or more parts (a package or a
module); a module belongs to the most specific part that names it. A module may import its own
part and any part of a lower layer; never a part of a higher layer, and never another part of
its own layer (the parts of one layer know nothing of each other). Every import counts: at the
top of a module, inside a function, or only for the type checker.

Read from the ground up: shared helpers; the state machines and the pure money rules; the
tables; the programs compiler; configuration, the database and the Citus cluster; the HTTP
plumbing every route uses (``web``: a domain's routes and its request dependencies live in the
domain, as ``accounts/deps.py``); the domains, each above the ones it asks (audit and accounts
first, usage above the ledger it settles in, reports and exports last); the billing portal,
whose pages show what the routes answer; and the processes that put it all together.

A new module inside a declared part needs no change here; a new package or top-level module
needs its place in ``LAYERS``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "metering"

# From the ground up; "a | b" in words: the parts of one layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("metering",),  # the package's face: its version
    ("metering.kit",),  # helpers that are no domain's rules
    ("metering.states", "metering.pricing"),  # the state machines; the pure money rules
    ("metering.models",),  # the tables
    ("metering.programs",),  # the programs compiler (its types are the tables')
    # which node of a Citus cluster holds an account, and a unit of work's statements sent there
    ("metering.nodes",),
    ("metering.settings", "metering.db"),
    ("metering.runtime", "metering.citus"),
    # metering.forms: each statement and program in the form of the database's kind
    ("metering.metrics", "metering.migrate", "metering.forms"),
    ("metering.web",),  # the HTTP plumbing every route uses
    ("metering.audit", "metering.health"),
    ("metering.accounts",),
    ("metering.notifications",),
    ("metering.catalog",),
    ("metering.ledger",),
    ("metering.usage",),
    ("metering.payments",),  # customers' payments: credit granted through the ledger
    ("metering.reports", "metering.exports"),
    ("metering.portal",),  # the billing portal's pages, which show what the routes answer
    (  # what puts it together
        "metering.app",
        "metering.demo",
        "metering.functions",
        "metering.scheduler",
        "metering.migrations",
    ),
    ("metering.cli", "metering.asgi"),  # the entry points
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / PACKAGE).rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """The modules of the package ``name`` imports (``from a import b``: the module ``a.b``
    when there is one, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                yield Import(name, target, node.lineno)


def graph() -> list[Import]:
    known = modules()
    found = {i for name, path in known.items() for i in imports_of(name, path, known)}
    return sorted(found, key=lambda i: (i.importer, i.line, i.imported))


def part_of(module: str) -> str | None:
    """The most specific declared part that holds ``module`` (the root names only itself)."""
    found = [
        part
        for layer in LAYERS
        for part in layer
        if module == part or (part != PACKAGE and module.startswith(part + "."))
    ]
    return max(found, key=len, default=None)


LAYER_OF = {part: index for index, layer in enumerate(LAYERS) for part in layer}


def circles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected sets of modules of more than one (Tarjan's algorithm)."""
    edges: dict[str, set[str]] = {}
    for found in imports:
        edges.setdefault(found.importer, set()).add(found.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found_circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found_circles.append(sorted(members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found_circles


def test_every_module_has_its_layer_and_every_part_its_modules() -> None:
    names = modules()
    unplaced = sorted(name for name in names if part_of(name) is None)
    assert not unplaced, f"modules in no layer (give them their place in LAYERS): {unplaced}"
    empty = [part for layer in LAYERS for part in layer if part not in names]
    empty = [part for part in empty if not any(n.startswith(part + ".") for n in names)]
    assert not empty, f"parts of LAYERS that name no module of {PACKAGE}/: {empty}"


def test_no_import_circle() -> None:
    imports = graph()
    found = circles(imports)
    described = [
        "circle: "
        + " ↔ ".join(members)
        + "\n  "
        + "\n  ".join(str(i) for i in imports if i.importer in members and i.imported in members)
        for members in found
    ]
    assert not found, "\n".join(described)


def test_no_import_runs_back_up_a_layer() -> None:
    offending = []
    for found in graph():
        importer, imported = part_of(found.importer), part_of(found.imported)
        assert importer is not None and imported is not None
        if importer == imported:
            continue
        above, below = LAYER_OF[imported], LAYER_OF[importer]
        if above > below:
            offending.append(f"{found}: runs back up from {importer} to {imported}")
        elif above == below:
            offending.append(f"{found}: {importer} and {imported} share a layer")
    assert not offending, "\n".join(offending)
