"""Ranges (contract §1) for the tables and columns added since migration 0013: SQLite refuses,
never coerces, a non-integer in each of their integer columns (``CHECK (typeof(x) = 'integer')``,
as 0013 gave every column then; metering.kit.ranges). PostgreSQL needs nothing.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 14:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The integer columns without their check at the previous revision: (name, nullable).
_COLUMNS: dict[str, tuple[tuple[str, bool], ...]] = {
    "accounts": (
        ("held_count", False),
        ("max_concurrent_requests", True),
        ("deficit_microcents", False),
        ("low_balance_threshold_microcents", True),
    ),
    "credit_allocations": (("amount_microcents", False),),
    "credit_grants": (
        ("entry_id", False),
        ("priority", False),
        ("amount_microcents", False),
        ("remaining_microcents", False),
    ),
    "webhook_deliveries": (
        ("event_id", False),
        ("attempts", False),
        ("last_status", True),
    ),
}


def _condition(column: str, nullable: bool) -> str:
    if nullable:
        return f"typeof({column}) IN ('integer', 'null')"
    return f"typeof({column}) = 'integer'"


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table, recreate="always") as batch_op:
            for column, nullable in columns:
                batch_op.create_check_constraint(f"{column}_integer", _condition(column, nullable))


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table, recreate="always") as batch_op:
            for column, _nullable in columns:
                batch_op.drop_constraint(f"{column}_integer", type_="check")
