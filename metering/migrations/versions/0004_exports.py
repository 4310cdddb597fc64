"""Daily exports: each day's export state (the row schedulers lock) and the record of every run.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 21:38:44.480783
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "export_days",
        sa.Column("export_date", sa.Date(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("newest_event_id", sa.BigInteger(), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exported_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'succeeded', 'failed')", name=op.f("ck_export_days_status")
        ),
        sa.PrimaryKeyConstraint("export_date", name=op.f("pk_export_days")),
    )
    op.create_table(
        "export_runs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("export_date", sa.Date(), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=True),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("runner", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("newest_event_id", sa.BigInteger(), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("files", sa.Integer(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("status IN ('succeeded', 'failed')", name=op.f("ck_export_runs_status")),
        sa.CheckConstraint(
            "trigger IN ('scheduled', 'manual')", name=op.f("ck_export_runs_trigger")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_export_runs")),
    )
    with op.batch_alter_table("export_runs", schema=None) as batch_op:
        batch_op.create_index("ix_export_runs_export_date_id", ["export_date", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("export_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_export_runs_export_date_id")

    op.drop_table("export_runs")
    op.drop_table("export_days")
