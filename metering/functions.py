"""The PostgreSQL functions the service calls, each generated from its program's one definition
(metering.programs). A migration freezes their text; ``tests/test_functions.py`` holds the
functions in a migrated database equal to what these definitions produce now.

Each program has two forms: as written (rows of any accounts, one call for all), and for one
account's rows on a Citus cluster (``…_of_account``: every statement limited to the account's
shard, the call sent to the node holding it; metering.citus). Every PostgreSQL database has
both, so a database made on one server can move onto a cluster.

``python -m metering.functions`` prints their ``CREATE FUNCTION`` statements (to freeze into a
new migration when a definition changes)."""

from __future__ import annotations

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

if __name__ == "__main__":
    for program in PROGRAMS:
        print(program.plpgsql)
