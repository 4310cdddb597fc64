"""Ledger entries and credit holds (authorizations).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 21:21:44.842793
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount_microcents", sa.BigInteger(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("usage_event_id", sa.BigInteger(), nullable=True),
        sa.Column("api_key_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(kind = 'grant' AND amount_microcents > 0) OR (kind = 'adjustment' AND amount_microcents <> 0) OR (kind = 'charge' AND amount_microcents <= 0)",
            name=op.f("ck_ledger_entries_amount_sign"),
        ),
        sa.CheckConstraint(
            "kind IN ('grant', 'adjustment', 'charge')", name=op.f("ck_ledger_entries_kind")
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_ledger_entries_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint(
            "account_id",
            "idempotency_key",
            name=op.f("uq_ledger_entries_account_id_idempotency_key"),
        ),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_entries_account_id_id", ["account_id", "id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_ledger_entries_usage_event_id"), ["usage_event_id"], unique=False
        )

    op.create_table(
        "authorizations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("api", sa.String(length=20), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("requested_max_tokens", sa.Integer(), nullable=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("reasoning", sa.Boolean(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("estimate_microcents", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("usage_event_id", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "status IN ('active', 'settled', 'voided', 'expired')",
            name=op.f("ck_authorizations_status"),
        ),
        sa.CheckConstraint(
            "estimate_microcents >= 0", name=op.f("ck_authorizations_estimate_non_negative")
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_authorizations_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name=op.f("fk_authorizations_api_key_id_api_keys")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["catalog_models.id"],
            name=op.f("fk_authorizations_model_id_catalog_models"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_authorizations")),
        sa.UniqueConstraint(
            "account_id", "request_id", name=op.f("uq_authorizations_account_id_request_id")
        ),
    )
    with op.batch_alter_table("authorizations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_authorizations_active_account",
            ["account_id", "expires_at"],
            unique=False,
            sqlite_where=sa.text("status = 'active'"),
            postgresql_where=sa.text("status = 'active'"),
        )
        batch_op.create_index(
            "ix_authorizations_active_key",
            ["api_key_id", "expires_at"],
            unique=False,
            sqlite_where=sa.text("status = 'active'"),
            postgresql_where=sa.text("status = 'active'"),
        )
        batch_op.create_index(
            "ix_authorizations_status_expires_at", ["status", "expires_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("authorizations", schema=None) as batch_op:
        batch_op.drop_index("ix_authorizations_status_expires_at")
        batch_op.drop_index(
            "ix_authorizations_active_key",
            sqlite_where=sa.text("status = 'active'"),
            postgresql_where=sa.text("status = 'active'"),
        )
        batch_op.drop_index(
            "ix_authorizations_active_account",
            sqlite_where=sa.text("status = 'active'"),
            postgresql_where=sa.text("status = 'active'"),
        )

    op.drop_table("authorizations")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_entries_usage_event_id"))
        batch_op.drop_index("ix_ledger_entries_account_id_id")

    op.drop_table("ledger_entries")
