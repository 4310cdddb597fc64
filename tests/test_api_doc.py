"""``docs/api.md``, the project's own API reference, stays true: its route table is the app's
routes, every route is described beyond the table, its audit actions are the service's, and
it (like the README) sends a reader to nothing a clone does not have."""

from __future__ import annotations

import re
from pathlib import Path

from metering.audit.service import ACTIONS
from metering.web.routes import http_routes
from tests.conftest import Api

ROOT = Path(__file__).resolve().parent.parent
API_DOC = ROOT / "docs" / "api.md"
ROW = re.compile(r"^\| (GET|POST|PUT|PATCH|DELETE) \| `([^`]+)` \| ([^|]+) \|$", re.MULTILINE)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_route_table_is_the_apps_routes(api: Api) -> None:
    text = API_DOC.read_text()
    documented = {(method, path) for method, path, _ in ROW.findall(_section(text, "Routes"))}
    served = {
        (method, route.path)
        for route in http_routes(api.client.app)  # type: ignore[arg-type]
        for method in route.methods
        if method != "HEAD"
    }
    assert documented == served, (
        f"served, not documented: {sorted(served - documented)}; "
        f"documented, not served: {sorted(documented - served)}"
    )


def test_every_route_is_described_beyond_the_table() -> None:
    text = API_DOC.read_text()
    body = text.replace(_section(text, "Routes"), "")
    for method, path, _ in ROW.findall(_section(text, "Routes")):
        assert f"{method} {path}" in body or f"`{path}`" in body or path in body, (method, path)


def test_the_audit_actions_are_the_services() -> None:
    rows = re.findall(
        r"^\| `([a-z_]+\.[a-z]+)` \|", _section(API_DOC.read_text(), "Audit actions"), re.M
    )
    assert rows == list(ACTIONS)


# What only a document outside this repository would explain: a section sign, or that document's
# name. Spelt so that this file does not hold them itself.
SECTION_SIGN = "\N{SECTION SIGN}"
OUTSIDE_DOCUMENT = re.compile(rf"{SECTION_SIGN}|\b{'contract'.upper()}\b")
# Where the project's own code and configuration live; vendored third-party files (their licences
# may say "contract" as loudly as they like) and what tools leave behind are not the project's.
SOURCES = ("metering", "tests", "bench", "scripts", "clients", "dashboards", ".ci")
TOP_FILES = ("Makefile", "Dockerfile", "docker-compose.yml", "pyproject.toml", "alembic.ini")
NOT_OURS = {"vendor", "__pycache__", "node_modules"}


def _pages() -> list[Path]:
    """The README and every document under docs/ (the decision records included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_no_reference_to_files_a_clone_does_not_have() -> None:
    for path in _pages():
        text = path.read_text()
        assert not OUTSIDE_DOCUMENT.search(text), path
        assert "../shared" not in text, path


def test_the_command_points_at_the_projects_docs() -> None:
    import subprocess
    import sys

    metering = Path(sys.executable).with_name("metering")
    shown = subprocess.run([str(metering), "--help"], capture_output=True, text=True, check=True)
    assert "docs/api.md" in shown.stdout and "/docs" in shown.stdout
    assert not OUTSIDE_DOCUMENT.search(shown.stdout)
    for path in ("docs/api.md", "docs/operations.md", "README.md"):
        assert (ROOT / path).is_file(), path


def _sources() -> list[Path]:
    """Every text file of the project's code, tests, benchmarks, scripts, clients and build."""
    found = [ROOT / name for name in TOP_FILES if (ROOT / name).is_file()]
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if not path.is_file() or parts & NOT_OURS:
                continue
            if any(part.endswith(".egg-info") or part.startswith(".venv") for part in parts):
                continue
            found.append(path)
    return found


def test_code_cites_the_projects_docs_never_a_document_outside_it() -> None:
    """A reference in code names a file of this repository (``docs/api.md#ranges``), never a
    section of a document a clone does not have."""
    citing = []
    for path in _sources():
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # not text: an image, a font, a Parquet file
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_DOCUMENT.search(line):
                citing.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not citing, "\n".join(citing)
    assert len(_sources()) > 300


# Created by the metrics work, which lands beside this one.
NOT_YET_HERE = {"docs/operations-metrics.md"}


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_docs_lead_somewhere() -> None:
    checked = 0
    for page in _pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file_part, _, anchor = target.partition("#")
            path = (page.parent / file_part).resolve() if file_part else page
            relative = path.relative_to(ROOT).as_posix()
            if relative in NOT_YET_HERE:
                continue
            assert path.is_file(), f"{page.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
                assert anchor in {_anchor(h) for h in headings}, f"{page.name}: {target}"
            checked += 1
    assert checked > 20


def test_the_readme_is_read_in_minutes() -> None:
    """Under 200 lines, and nothing a newcomer cannot follow: no commit hash, no issue number
    (history lives in docs/decisions/ and docs/performance.md)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    assert not re.search(r"\bissues? \d+", text, re.IGNORECASE)
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", text)
    assert not hashes, hashes
