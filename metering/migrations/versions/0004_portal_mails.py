"""The portal's outbox of sign-in mails (``portal_mails``), and members found by their address
alone (the sign-in page's "email me a sign-in link" looks in every account).

The new table has no account of its own on a sign-in row, so on Citus it is a reference table,
placed by ``metering migrate`` after the migrations (metering.citus.placement).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05 03:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    checks = []
    if op.get_bind().dialect.name == "sqlite":  # as the baseline makes every integer column
        checks.append(
            sa.CheckConstraint(
                "typeof(attempts) = 'integer'", name=op.f("ck_portal_mails_attempts_integer")
            )
        )
    op.create_table(
        "portal_mails",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=320), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=True),
        sa.Column("member_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.CheckConstraint(
            "kind IN ('sign_in', 'member_added')", name=op.f("ck_portal_mails_kind")
        ),
        sa.CheckConstraint(
            "outcome IN ('sent', 'no_member', 'failed')", name=op.f("ck_portal_mails_outcome")
        ),
        *checks,
        sa.PrimaryKeyConstraint("id", name="pk_portal_mails"),
    )
    op.create_index("ix_portal_mails_address_created_at", "portal_mails", ["address", "created_at"])
    op.create_index("ix_portal_mails_next_attempt_at", "portal_mails", ["next_attempt_at"])
    op.create_index("ix_members_email_key", "members", ["email_key"])


def downgrade() -> None:
    op.drop_index("ix_members_email_key", table_name="members")
    op.drop_table("portal_mails")
