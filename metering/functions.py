"""The PostgreSQL functions the service calls, each generated from its program's one definition
(metering.programs). A migration freezes their text; ``tests/test_functions.py`` holds the
functions in a migrated database equal to what these definitions produce now.

Each program has two forms: as written (rows of any accounts, one call for all), and for one
account's rows on a Citus cluster (``…_of_account``: every statement limited to the account's
shard, the call sent to the node holding it; metering.citus). Every PostgreSQL database has
both, so a database made on one server can move onto a cluster.

``python -m metering.functions`` prints their ``CREATE FUNCTION`` statements (to freeze into a
new migration when a definition changes); ``python -m metering.functions --step NAME LINE``
says which step a line of a function renders, and where that step was built (a PL/pgSQL
error's ``CONTEXT`` names the function and the line)."""

from __future__ import annotations

import argparse

from metering.ledger.placement.program import PLACE_HOLDS, PLACE_HOLDS_OF_ACCOUNT
from metering.ledger.spending import SPEND_CREDIT, SPEND_CREDIT_OF_ACCOUNT
from metering.programs import Program
from metering.usage.recording import (
    RECORD_USAGE,
    RECORD_USAGE_OF_ACCOUNT,
    SETTLE_USAGE,
    SETTLE_USAGE_OF_ACCOUNT,
)

PROGRAMS: tuple[Program, ...] = (
    PLACE_HOLDS,
    SETTLE_USAGE,
    RECORD_USAGE,
    SPEND_CREDIT,
    PLACE_HOLDS_OF_ACCOUNT,
    SETTLE_USAGE_OF_ACCOUNT,
    RECORD_USAGE_OF_ACCOUNT,
    SPEND_CREDIT_OF_ACCOUNT,
)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m metering.functions")
    parser.add_argument("--step", nargs=2, metavar=("FUNCTION", "LINE"))
    args = parser.parse_args(argv)
    if args.step is not None:
        print(step_at(args.step[0], int(args.step[1])))
        return
    for program in PROGRAMS:
        print(program.plpgsql)


if __name__ == "__main__":
    main()
