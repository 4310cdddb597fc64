"""Foundation: accounts, API keys, the model catalog, list prices and account rates.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 21:14:01.903719
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("billing", sa.String(length=16), nullable=False),
        sa.Column("balance_microcents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("billing IN ('prepaid', 'unbilled')", name=op.f("ck_accounts_billing")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
    )
    op.create_table(
        "catalog_models",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("id_key", sa.String(length=100), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("owned_by", sa.String(length=100), nullable=False),
        sa.Column("context_length", sa.Integer(), nullable=False),
        sa.Column("max_output_tokens", sa.Integer(), nullable=True),
        sa.Column("reasoning_headroom_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("hidden", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("deprecation_date", sa.Date(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "context_length > 0", name=op.f("ck_catalog_models_context_length_positive")
        ),
        sa.CheckConstraint(
            "max_output_tokens IS NULL OR max_output_tokens > 0",
            name=op.f("ck_catalog_models_max_output_positive"),
        ),
        sa.CheckConstraint(
            "reasoning_headroom_tokens >= 0", name=op.f("ck_catalog_models_headroom_non_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_catalog_models")),
        sa.UniqueConstraint("id_key", name=op.f("uq_catalog_models_id_key")),
    )
    op.create_table(
        "account_rates",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("effective_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_microcents_per_million", sa.BigInteger(), nullable=True),
        sa.Column("output_microcents_per_million", sa.BigInteger(), nullable=True),
        sa.Column("cache_read_microcents_per_million", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(input_microcents_per_million IS NULL AND output_microcents_per_million IS NULL AND cache_read_microcents_per_million IS NULL) OR (input_microcents_per_million IS NOT NULL AND output_microcents_per_million IS NOT NULL AND cache_read_microcents_per_million IS NOT NULL)",
            name=op.f("ck_account_rates_all_or_none"),
        ),
        sa.CheckConstraint(
            "input_microcents_per_million IS NULL OR (input_microcents_per_million >= 0 AND output_microcents_per_million >= 0 AND cache_read_microcents_per_million >= 0)",
            name=op.f("ck_account_rates_rates_non_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_account_rates_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["catalog_models.id"],
            name=op.f("fk_account_rates_model_id_catalog_models"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_account_rates")),
        sa.UniqueConstraint(
            "account_id",
            "model_id",
            "effective_at",
            name=op.f("uq_account_rates_account_id_model_id_effective_at"),
        ),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("monthly_spend_limit_microcents", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_api_keys_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_keys_secret_hash")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_account_id"), ["account_id"], unique=False)

    op.create_table(
        "price_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("effective_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_microcents_per_million", sa.BigInteger(), nullable=False),
        sa.Column("output_microcents_per_million", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_microcents_per_million", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "input_microcents_per_million >= 0 AND output_microcents_per_million >= 0 AND cache_read_microcents_per_million >= 0",
            name=op.f("ck_price_versions_rates_non_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["catalog_models.id"],
            name=op.f("fk_price_versions_model_id_catalog_models"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_price_versions")),
        sa.UniqueConstraint(
            "model_id", "effective_at", name=op.f("uq_price_versions_model_id_effective_at")
        ),
    )


def downgrade() -> None:
    op.drop_table("price_versions")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_account_id"))

    op.drop_table("api_keys")
    op.drop_table("account_rates")
    op.drop_table("catalog_models")
    op.drop_table("accounts")
