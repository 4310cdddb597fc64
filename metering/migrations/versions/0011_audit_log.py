"""The audit log: every change made through /admin/v1/ and the CLI, append-only.

Triggers refuse any UPDATE or DELETE of a row on both backends, so the log can only grow.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MESSAGE = "audit_events is append-only"


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_type", sa.String(length=32), nullable=False),
        sa.Column("target_id", sa.String(length=200), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=True),
        sa.Column("request_id", sa.String(length=32), nullable=True),
        sa.Column("changes", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_events")),
        sa.UniqueConstraint("id", name=op.f("uq_audit_events_id")),
    )
    op.create_index(
        "ix_audit_events_account_id_seq", "audit_events", ["account_id", "seq"], unique=False
    )
    op.create_index(op.f("ix_audit_events_at"), "audit_events", ["at"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"""
            CREATE FUNCTION metering_audit_append_only() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '{_MESSAGE}';
            END $$;
            CREATE TRIGGER audit_events_append_only
            BEFORE UPDATE OR DELETE ON audit_events
            FOR EACH ROW EXECUTE FUNCTION metering_audit_append_only();
            """
        )
    else:
        for verb in ("update", "delete"):
            op.execute(
                f"CREATE TRIGGER audit_events_no_{verb} BEFORE {verb.upper()} ON audit_events "
                f"BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_events_append_only ON audit_events")
        op.execute("DROP FUNCTION metering_audit_append_only()")
    else:
        for verb in ("update", "delete"):
            op.execute(f"DROP TRIGGER audit_events_no_{verb}")
    op.drop_index(op.f("ix_audit_events_at"), table_name="audit_events")
    op.drop_index("ix_audit_events_account_id_seq", table_name="audit_events")
    op.drop_table("audit_events")
