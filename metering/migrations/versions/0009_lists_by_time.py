"""The ledger's and the grants' lists are newest first by the time a row was recorded, then its
id, and their indexes follow: on Citus a worker numbers the rows it inserts (the charges of the
gateway's calls delegated there) in a range of its own, so ids alone do not say which came first. For the same reason the webhook fan-out takes
undispatched events by the time they were made, then id (its partial index follows), so that an
endpoint's deliveries are made in the order of their events.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, old index and its columns, new index and its columns)
INDEXES = (
    (
        "ledger_entries",
        ("ix_ledger_entries_account_id_id", ["account_id", "id"]),
        ("ix_ledger_entries_account_id_created_at_id", ["account_id", "created_at", "id"]),
    ),
    (
        "credit_grants",
        ("ix_credit_grants_account_id_entry_id", ["account_id", "entry_id"]),
        (
            "ix_credit_grants_account_id_created_at_entry_id",
            ["account_id", "created_at", "entry_id"],
        ),
    ),
)


UNDISPATCHED = "ix_webhook_events_undispatched"
NOT_DISPATCHED = sa.text("NOT dispatched")


def _undispatched(columns: list[str]) -> None:
    op.drop_index(UNDISPATCHED, table_name="webhook_events")
    op.create_index(
        UNDISPATCHED,
        "webhook_events",
        columns,
        postgresql_where=NOT_DISPATCHED,
        sqlite_where=NOT_DISPATCHED,
    )


def upgrade() -> None:
    for table, (old, _), (new, columns) in INDEXES:
        op.create_index(new, table, columns)
        op.drop_index(old, table_name=table)
    _undispatched(["created_at", "id"])


def downgrade() -> None:
    for table, (old, columns), (new, _) in INDEXES:
        op.create_index(old, table, columns)
        op.drop_index(new, table_name=table)
    _undispatched(["id"])
