"""Usage events with their charges, quarantined events, usage rollups for reports.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 21:21:46.030466
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quarantined_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("account_id", sa.String(length=32), nullable=True),
        sa.Column("api_key_id", sa.String(length=64), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("code", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("raw_event", sa.Text(), nullable=False),
        sa.Column("raw_sha256", sa.String(length=64), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantined_events")),
        sa.UniqueConstraint("raw_sha256", name=op.f("uq_quarantined_events_raw_sha256")),
    )
    with op.batch_alter_table("quarantined_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_quarantined_events_account_id_id", ["account_id", "id"], unique=False
        )
        batch_op.create_index("ix_quarantined_events_code_id", ["code", "id"], unique=False)

    op.create_table(
        "usage_rollups",
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("bucket_width", sa.String(length=2), nullable=False),
        sa.Column("grouping", sa.String(length=10), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_microcents", sa.BigInteger(), nullable=False),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "bucket_width IN ('1h', '1d')", name=op.f("ck_usage_rollups_bucket_width")
        ),
        sa.CheckConstraint(
            "grouping IN ('key_model', 'key', 'model')", name=op.f("ck_usage_rollups_grouping")
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_usage_rollups_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint(
            "account_id",
            "bucket_width",
            "grouping",
            "bucket_start",
            "api_key_id",
            "model_id",
            name=op.f("pk_usage_rollups"),
        ),
    )
    op.create_table(
        "usage_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("api", sa.String(length=20), nullable=False),
        sa.Column("outcome", sa.String(length=10), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("authorization_id", sa.String(length=32), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("reasoning_tokens", sa.Integer(), nullable=False),
        sa.Column("input_microcents", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_microcents", sa.BigInteger(), nullable=False),
        sa.Column("output_microcents", sa.BigInteger(), nullable=False),
        sa.Column("total_microcents", sa.BigInteger(), nullable=False),
        sa.Column("price_version_id", sa.String(length=32), nullable=True),
        sa.CheckConstraint(
            "api IN ('chat_completions', 'responses', 'messages')", name=op.f("ck_usage_events_api")
        ),
        sa.CheckConstraint(
            "outcome IN ('completed', 'failed')", name=op.f("ck_usage_events_outcome")
        ),
        sa.CheckConstraint(
            "total_microcents = input_microcents + cache_read_microcents + output_microcents",
            name=op.f("ck_usage_events_total_is_sum"),
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_usage_events_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name=op.f("fk_usage_events_api_key_id_api_keys")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["catalog_models.id"],
            name=op.f("fk_usage_events_model_id_catalog_models"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_events")),
        sa.UniqueConstraint(
            "account_id", "request_id", name=op.f("uq_usage_events_account_id_request_id")
        ),
    )
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_usage_events_account_id_occurred_at", ["account_id", "occurred_at"], unique=False
        )
        batch_op.create_index(
            "ix_usage_events_model_id_occurred_at", ["model_id", "occurred_at"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_usage_events_price_version_id"), ["price_version_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usage_events_price_version_id"))
        batch_op.drop_index("ix_usage_events_model_id_occurred_at")
        batch_op.drop_index("ix_usage_events_account_id_occurred_at")

    op.drop_table("usage_events")
    op.drop_table("usage_rollups")
    with op.batch_alter_table("quarantined_events", schema=None) as batch_op:
        batch_op.drop_index("ix_quarantined_events_code_id")
        batch_op.drop_index("ix_quarantined_events_account_id_id")

    op.drop_table("quarantined_events")
