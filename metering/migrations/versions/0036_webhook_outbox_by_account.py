"""The webhook outbox is account data: ``webhook_events.account_id`` and
``webhook_deliveries.account_id`` are never NULL (an event of no account is stored under ``''``).

On Citus the two tables were reference tables, since a row could have no account: every event a
debit wrote (a balance crossing, a grant's expiry, a spend limit reached) made the debit's
transaction, delegated to the account's worker, write every node. With the account always there
``metering migrate`` shards them by account beside the rest of the account's rows
(metering.citus re-places a table whose placement the rule changed), so the debit's events are
written on its own shard. The downgrade puts NULL back for ``''``.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-02 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0036"
down_revision: str | Sequence[str] | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("webhook_events", "webhook_deliveries")


def upgrade() -> None:
    for name in TABLES:
        op.execute(f"UPDATE {name} SET account_id = '' WHERE account_id IS NULL")
        with op.batch_alter_table(name) as batch:
            batch.alter_column("account_id", existing_type=sa.String(32), nullable=False)


def downgrade() -> None:
    for name in TABLES:
        with op.batch_alter_table(name) as batch:
            batch.alter_column("account_id", existing_type=sa.String(32), nullable=True)
        op.execute(f"UPDATE {name} SET account_id = NULL WHERE account_id = ''")
