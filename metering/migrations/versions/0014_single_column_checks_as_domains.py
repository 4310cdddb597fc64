"""PostgreSQL: the checks of one column that the gateway's statements meet are domains, not
table checks — the same values allowed.

PostgreSQL reads every check of a table back from its stored text at every statement that
writes the table, whichever columns the statement sets, and a domain's check once per
connection, evaluated only where a value is written to the column (docs/performance.md).
Every single event updates its account's balance (which read the concurrency limit's check),
its grant's remainder (the grant's priority and amount checks), its hold's status (the
estimate's check) and adds to its allocation day (the amount's check). Migrations 0010 and
0013 made the lists of values domains; the checks across columns stay the tables'.

The domain is made without its check, the column's type changed to it (the same base type: no
rewrite, the indexes kept), then the check added to the domain, which reads each table once to
validate it. SQLite keeps its table checks.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 07:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each domain: its type and its check of VALUE (as at this revision).
DOMAINS = {
    "concurrency_limit": ("INTEGER", "VALUE >= 1"),
    "non_negative_microcents": ("BIGINT", "VALUE >= 0"),
    "grant_priority": ("INTEGER", "VALUE >= 0 AND VALUE <= 100"),
    "positive_microcents": ("BIGINT", "VALUE > 0"),
}
# table, column, its domain, and the table check it replaces: its name without the
# ck_<table>_ prefix, and its text (as at this revision)
COLUMNS = (
    (
        "accounts",
        "max_concurrent_requests",
        "concurrency_limit",
        "max_concurrent_requests_positive",
        "max_concurrent_requests IS NULL OR max_concurrent_requests >= 1",
    ),
    (
        "authorizations",
        "estimate_microcents",
        "non_negative_microcents",
        "estimate_non_negative",
        "estimate_microcents >= 0",
    ),
    (
        "credit_grants",
        "priority",
        "grant_priority",
        "priority",
        "priority >= 0 AND priority <= 100",
    ),
    (
        "credit_grants",
        "amount_microcents",
        "positive_microcents",
        "amount_positive",
        "amount_microcents > 0",
    ),
    (
        "credit_allocation_days",
        "amount_microcents",
        "positive_microcents",
        "amount_positive",
        "amount_microcents > 0",
    ),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for domain, (kind, _check) in DOMAINS.items():
        op.execute(f"CREATE DOMAIN {domain} AS {kind}")
    for table, column, domain, name, _text in COLUMNS:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{name}")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {domain}")
    for domain, (_kind, check) in DOMAINS.items():
        op.execute(f"ALTER DOMAIN {domain} ADD CONSTRAINT {domain} CHECK ({check})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, domain, name, text in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {DOMAINS[domain][0]}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{name} CHECK ({text})")
    for domain in DOMAINS:
        op.execute(f"DROP DOMAIN {domain}")
