"""The PostgreSQL functions the service calls, each generated from its program's one definition
(metering.programs) and committed beside this module as ``<name>.sql``, so that a change of a
rule shows in review as the lines of generated text it changes. ``metering migrate`` installs
each one whose text the database does not hold yet (metering.migrate); ``tests/test_functions.py``
holds the files equal to what these definitions generate now, and a migrated database's
functions equal to the files.

Each program has two forms: as written (rows of any accounts, one call for all), and for one
account's rows on a Citus cluster (``…_of_account``: every statement limited to the account's
shard, the call sent to the node holding it; metering.citus). Every PostgreSQL database has
both, so a database made on one server can move onto a cluster. A single event's lookup read one
table at a time (metering.usage.lookup_apart) has only its one-account form: one server reads
the join.

``python -m metering.functions --write`` writes the files anew after a definition changed;
without ``--write`` it names the files that differ from their definitions.
``python -m metering.functions --step NAME LINE`` says which step a line of a function renders,
and where that step was built (a PL/pgSQL error's ``CONTEXT`` names the function and the
line)."""

from __future__ import annotations

from pathlib import Path

from metering.ledger.placement.program import PLACE_HOLDS, PLACE_HOLDS_OF_ACCOUNT, VOID_OF_ACCOUNT
from metering.ledger.spending import SPEND_CREDIT, SPEND_CREDIT_OF_ACCOUNT
from metering.migrate import FUNCTIONS_DIR, committed_functions
from metering.programs import Program
from metering.usage.lookup_apart import LOOKUP_OF_ACCOUNT, RECORD_USAGE_CONFIRMED_OF_ACCOUNT
from metering.usage.recording import (
    RECORD_GATHERED,
    RECORD_GATHERED_OF_ACCOUNT,
    RECORD_USAGE,
    RECORD_USAGE_OF_ACCOUNT,
    SETTLE_USAGE,
    SETTLE_USAGE_OF_ACCOUNT,
)
from metering.usage.repository import LOOKUP_PAIRS_OF_ACCOUNT

PROGRAMS: tuple[Program, ...] = (
    PLACE_HOLDS,
    SETTLE_USAGE,
    RECORD_USAGE,
    RECORD_GATHERED,
    SPEND_CREDIT,
    PLACE_HOLDS_OF_ACCOUNT,
    SETTLE_USAGE_OF_ACCOUNT,
    RECORD_USAGE_OF_ACCOUNT,
    RECORD_USAGE_CONFIRMED_OF_ACCOUNT,
    RECORD_GATHERED_OF_ACCOUNT,
    SPEND_CREDIT_OF_ACCOUNT,
    LOOKUP_OF_ACCOUNT,
    LOOKUP_PAIRS_OF_ACCOUNT,
    VOID_OF_ACCOUNT,
)


def generated() -> dict[str, str]:
    """Each function's name and its text as its program generates it now."""
    return {program.name: program.plpgsql for program in PROGRAMS}


def path_of(name: str) -> Path:
    return FUNCTIONS_DIR / f"{name}.sql"


def stale() -> dict[Path, str]:
    """Each file that is not what its program generates now, and why: it differs, it is
    missing, or no program generates its function any more."""
    committed, wanted = committed_functions(), generated()
    reasons = {}
    for name in sorted(committed.keys() | wanted.keys()):
        if name not in committed:
            reasons[path_of(name)] = "missing"
        elif name not in wanted:
            reasons[path_of(name)] = "no program generates this function any more"
        elif committed[name] != wanted[name]:
            reasons[path_of(name)] = "differs from what its program generates"
    return reasons


def write() -> list[Path]:
    """Write every stale file anew (remove the ones no program generates); the files written."""
    wanted = generated()
    written = list(stale())
    for path in written:
        if path.stem in wanted:
            path.write_text(wanted[path.stem], encoding="utf-8", newline="\n")
        else:
            path.unlink()
    return written


def step_at(name: str, line: int) -> str:
    """Line ``line`` of the function ``name`` (counted as a PL/pgSQL error's ``CONTEXT`` counts
    them), the step it renders and the Python function that built that step."""
    found = {program.name: program for program in PROGRAMS}
    if name not in found:
        raise SystemExit(f"no program {name}; the programs: {', '.join(sorted(found))}")
    try:
        text, step = found[name].step_at(line)
    except IndexError as error:
        raise SystemExit(str(error)) from None
    said = f"{name} line {line}: {text.strip()}"
    if step is None:
        return f"{said}\n  the function's own line (its declarations, BEGIN or END)"
    into = getattr(step, "into", None)
    writes = [] if into is None else list(into) if isinstance(into, tuple) else [into]
    kind = type(step).__name__ + (" into " + ", ".join(v.name for v in writes) if writes else "")
    return f"{said}\n  step: {kind}\n  built by: {step.origin}"
