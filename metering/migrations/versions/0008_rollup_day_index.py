"""The day rows of ``usage_rollups`` indexed by day, across accounts.

The scheduler asks on every tick which ended days have usage (and how much, to spot late
events), and a day's export which accounts have usage that day: both read the ``1d`` /
``key_model`` rows of every account, and the primary key starts with the account, so each was a
scan of the whole table. On 2,000,000 events (1.6 million rollup rows, 831 MB with fillfactor
50): the due-days query 124 ms reading 500 MB, now 26 ms from cache; one day's accounts 111 ms,
now 0.1 ms. The index is partial and holds no column an upsert changes, so updates of the
rollup rows stay HOT; only a new key × model × day row adds an entry.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DAY_ROWS = "bucket_width = '1d' AND grouping = 'key_model'"


def upgrade() -> None:
    with op.batch_alter_table("usage_rollups", schema=None) as batch_op:
        batch_op.create_index(
            "ix_usage_rollups_day_key_model",
            ["bucket_start"],
            unique=False,
            sqlite_where=sa.text(_DAY_ROWS),
            postgresql_where=sa.text(_DAY_ROWS),
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_rollups", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_usage_rollups_day_key_model",
            sqlite_where=sa.text(_DAY_ROWS),
            postgresql_where=sa.text(_DAY_ROWS),
        )
