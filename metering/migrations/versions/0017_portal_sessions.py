"""The customer portal: single-use sign-in links and server-side sessions.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "portal_sign_in_tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_portal_sign_in_tokens_account_id_accounts"),
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_portal_sign_in_tokens")),
    )
    op.create_index("ix_portal_sign_in_tokens_account_id", "portal_sign_in_tokens", ["account_id"])
    op.create_table(
        "portal_sessions",
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_portal_sessions_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("secret_hash", name=op.f("pk_portal_sessions")),
        sa.UniqueConstraint("id", name=op.f("uq_portal_sessions_id")),
    )
    op.create_index("ix_portal_sessions_account_id", "portal_sessions", ["account_id"])


def downgrade() -> None:
    op.drop_index("ix_portal_sessions_account_id", table_name="portal_sessions")
    op.drop_table("portal_sessions")
    op.drop_index("ix_portal_sign_in_tokens_account_id", table_name="portal_sign_in_tokens")
    op.drop_table("portal_sign_in_tokens")
