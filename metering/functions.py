"""The PostgreSQL functions the service calls, each generated from its program's one definition
(metering.kit.programs). A migration freezes their text; ``tests/test_functions.py`` holds the
functions in a migrated database equal to what these definitions produce now.

``python -m metering.functions`` prints their ``CREATE FUNCTION`` statements (to freeze into a
new migration when a definition changes)."""

from __future__ import annotations

from metering.kit.programs import Program
from metering.ledger.placement.program import PLACE_HOLDS
from metering.ledger.spending import SPEND_CREDIT
from metering.usage.recording import RECORD_USAGE, SETTLE_USAGE

PROGRAMS: tuple[Program, ...] = (PLACE_HOLDS, SETTLE_USAGE, RECORD_USAGE, SPEND_CREDIT)

if __name__ == "__main__":
    for program in PROGRAMS:
        print(program.plpgsql)
