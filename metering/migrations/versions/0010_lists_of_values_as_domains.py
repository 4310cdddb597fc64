"""PostgreSQL: the lists of values the gateway's statements write are domains, not table checks
— the same values allowed.

PostgreSQL reads a table's checks back from their stored text at every statement that writes the
table, and a domain's check once per connection (docs/performance.md): an authorization and its
void read the hold's status check three times and the account's billing check once, a single
usage event the checks of its event, its ledger entry, its grant and its account. Each of these
columns becomes a domain of its own type, whose check is the table's check it replaces.

The domain is made without its check, the column's type changed to it (the same VARCHAR: no
table is rewritten), then the check added to the domain, which reads each table once to
validate it. SQLite keeps its table checks.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 19:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table, column, its length, its domain, the values allowed (as at this revision)
COLUMNS = (
    ("accounts", "billing", 16, "account_billing", ("prepaid", "unbilled")),
    ("authorizations", "status", 16, "hold_status", ("active", "settled", "voided", "expired")),
    ("credit_grants", "category", 16, "grant_category", ("paid", "promotional", "adjustment")),
    ("credit_grants", "status", 16, "grant_status", ("active", "expired", "voided")),
    (
        "ledger_entries",
        "kind",
        16,
        "ledger_entry_kind",
        ("grant", "adjustment", "charge", "expiry", "void", "refund"),
    ),
    ("usage_events", "api", 20, "usage_api", ("chat_completions", "responses", "messages")),
    ("usage_events", "outcome", 10, "usage_outcome", ("completed", "failed")),
)


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, length, domain, values in COLUMNS:
        op.execute(f"CREATE DOMAIN {domain} AS VARCHAR({length})")
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{column}")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {domain}")
        op.execute(
            f"ALTER DOMAIN {domain} ADD CONSTRAINT {domain} CHECK (VALUE IN ({_listed(values)}))"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, length, domain, values in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE VARCHAR({length})")
        array = "'{" + ",".join(values) + "}'::text[]"
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{column} "
            f"CHECK ({column}::text = ANY ({array}))"
        )
        op.execute(f"DROP DOMAIN {domain}")
