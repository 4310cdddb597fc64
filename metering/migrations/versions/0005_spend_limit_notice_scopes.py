"""Spend-limit notices of every scope: a project's and a member's thresholds are noted beside a
key's, so ``spend_limit.threshold_reached`` fires once per project, member or key, window and
percent (metering.notifications.spend_limits).

A notice gains ``limit_scope`` and ``scope_id`` (the project's, member's or key's id) and is keyed
by the scope's id in place of the key's; ``api_key_id`` stays, the key whose charge reached it.
The notices there were are keys' (``scope_id``: their key), so none fires again.

An account gains ``scope_limits``, set once a project or a member of it has a spend limit: the
ingest reads their limits only for such accounts (metering.usage.repository).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 03:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "spend_limit_notices"
PK = "pk_spend_limit_notices"
WINDOW = ("spend_limit_window", "window_starts_at", "percent")
SCOPE_CHECK = "limit_scope IN ('project', 'member', 'key')"


def upgrade() -> None:
    op.add_column(
        "accounts",
        sa.Column("scope_limits", sa.Boolean(), server_default="0", nullable=False),
    )
    for owners in ("projects", "members"):
        op.execute(
            "UPDATE accounts SET scope_limits = true WHERE id IN (SELECT account_id FROM "
            f"{owners} WHERE spend_limit_microcents IS NOT NULL)"
        )
    op.add_column(TABLE, sa.Column("limit_scope", sa.String(length=8), nullable=True))
    op.add_column(TABLE, sa.Column("scope_id", sa.String(length=32), nullable=True))
    op.execute(f"UPDATE {TABLE} SET limit_scope = 'key', scope_id = api_key_id")
    # SQLite: the table made again (its checks are named, so they are kept).
    with op.batch_alter_table(TABLE) as batch:
        batch.alter_column("limit_scope", existing_type=sa.String(length=8), nullable=False)
        batch.alter_column("scope_id", existing_type=sa.String(length=32), nullable=False)
        batch.create_check_constraint(op.f("ck_spend_limit_notices_limit_scope"), SCOPE_CHECK)
        batch.drop_constraint(PK, type_="primary")
        batch.create_primary_key(PK, ["account_id", "scope_id", *WINDOW])


def downgrade() -> None:
    op.execute(f"DELETE FROM {TABLE} WHERE limit_scope <> 'key'")
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_constraint(PK, type_="primary")
        batch.create_primary_key(PK, ["account_id", "api_key_id", *WINDOW])
        batch.drop_constraint(op.f("ck_spend_limit_notices_limit_scope"), type_="check")
        batch.drop_column("scope_id")
        batch.drop_column("limit_scope")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("scope_limits")
