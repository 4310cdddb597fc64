"""PostgreSQL: the lists of values a usage event's rollup rows and allocation days write are
domains, not table checks, as migration 0010 made the others — the same values allowed.

PostgreSQL reads a table's checks back from their stored text at every statement that writes
the table, and a domain's check once per connection (docs/performance.md). Every single event
writes the rollups' six rows (one statement on one server, six on a Citus worker, each reading
the bucket width's and the grouping's checks again) and its allocation day. The columns are
in their tables' primary keys; a domain over the same VARCHAR changes no storage and keeps the
indexes (their operator class is the VARCHAR's).

The domain is made without its check, the column's type changed to it, then the check added to
the domain, which reads each table once to validate it. SQLite keeps its table checks.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 04:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table, column, its length, its domain, the values allowed (as at this revision)
COLUMNS = (
    ("usage_rollups", "bucket_width", 2, "rollup_bucket_width", ("1h", "1d")),
    ("usage_rollups", "grouping", 10, "rollup_grouping", ("key_model", "key", "model")),
    (
        "credit_allocation_days",
        "kind",
        16,
        "allocation_kind",
        ("spend", "deficit", "payoff", "refund"),
    ),
)


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, length, domain, values in COLUMNS:
        op.execute(f"CREATE DOMAIN {domain} AS VARCHAR({length})")
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{column}")
        op.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" TYPE {domain}')
        op.execute(
            f"ALTER DOMAIN {domain} ADD CONSTRAINT {domain} CHECK (VALUE IN ({_listed(values)}))"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, length, domain, values in COLUMNS:
        op.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" TYPE VARCHAR({length})')
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{column} "
            f'CHECK ("{column}" IN ({_listed(values)}))'
        )
        op.execute(f"DROP DOMAIN {domain}")
