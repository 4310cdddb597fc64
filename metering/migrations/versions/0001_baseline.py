"""The baseline: the whole schema, as migrations 0001–0036 left it, in one step.

Every table, column, constraint, index and trigger of the service, with their names, on SQLite and
PostgreSQL (a Citus coordinator then distributes them: metering.citus). It holds no PostgreSQL
function of the programs: ``metering migrate`` installs those from ``metering/functions/`` after
this (metering.migrate). The migrations it replaces are in the git history (up to commit 446101b);
each migration after it makes one change to the schema and is named for it.

What the models do not say, and this does:

* SQLite refuses a non-integer in every integer column (``CHECK (typeof(x) = 'integer')``, or
  ``IN ('integer', 'null')`` when nullable, named ``ck_<table>_<column>_integer``): its integer
  arithmetic would turn an overflowing value into a REAL, silently (metering.kit.ranges).
  PostgreSQL's column types refuse by themselves.
* PostgreSQL keeps the checks of the tables written on the gateway's path as one ``text[]``
  constant (``status::text = ANY ('{…}'::text[])``), which a statement folds far faster than the
  ``IN (…)`` list of VARCHARs it stands for: the same values, the same names (all of them but
  ``ck_credit_allocation_days_kind``, made after the others were compacted).
* ``usage_events`` has no foreign keys: the ingest writes the account, key and model it read in
  the same transaction, and none is ever deleted (checked per row, they were half of the
  insert's cost); ``metering verify`` names any orphan. ``ledger_entries``' idempotency index
  holds only the entries that have a key.
* ``usage_rollups`` (PostgreSQL): fillfactor 50, so the upserts that add to its rows are HOT.
* ``audit_events`` is append-only: a trigger refuses any UPDATE or DELETE, on both backends.
* ``credit_rollforward`` holds one row: the roll-forward starts on the day the schema is made.

Revision ID: 0001
Revises:
Create Date: 2026-12-04 12:00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from alembic.operations import ops

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# An auto-incrementing 64-bit key: SQLite only auto-increments an INTEGER PRIMARY KEY.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
APPEND_ONLY = "audit_events is append-only"


def _dialect() -> str:
    return op.get_bind().dialect.name


def _check(condition: str, name: str, postgresql: str | None = None) -> sa.CheckConstraint:
    """A named check; ``postgresql``: its compact form there (the module's docstring)."""
    if postgresql is not None and _dialect() == "postgresql":
        condition = postgresql
    return sa.CheckConstraint(condition, name=op.f(name))


def _create_table(name: str, *elements: Any) -> None:
    """``op.create_table``, with SQLite's integer checks for every integer column outside the
    primary key (the columns metering.kit.ranges names; a rowid key is always an integer)."""
    table = sa.Table(name, sa.MetaData(), *elements)
    if _dialect() == "sqlite":
        for column in table.columns:
            if isinstance(column.type, sa.Integer) and not column.primary_key:
                condition = (
                    f"typeof({column.name}) IN ('integer', 'null')"
                    if column.nullable
                    else f"typeof({column.name}) = 'integer'"
                )
                table.append_constraint(
                    sa.CheckConstraint(condition, name=op.f(f"ck_{name}_{column.name}_integer"))
                )
    op.invoke(ops.CreateTableOp.from_table(table))


def _when(condition: str) -> dict[str, Any]:
    """A partial index's condition, on both backends."""
    return {"sqlite_where": sa.text(condition), "postgresql_where": sa.text(condition)}


def upgrade() -> None:
    _accounts_and_catalog()
    _holds_and_ledger()
    _usage()
    _exports()
    _audit_log()
    _webhooks()
    _portal()


def _accounts_and_catalog() -> None:
    _create_table(
        "accounts",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("billing", sa.String(length=16), nullable=False),
        sa.Column("balance_microcents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("held_microcents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("held_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
        sa.Column("restricts_models", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("deficit_microcents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("next_expiry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("low_balance_threshold_microcents", sa.BigInteger(), nullable=True),
        _check(
            "billing IN ('prepaid', 'unbilled')",
            "ck_accounts_billing",
            postgresql="billing::text = ANY ('{prepaid,unbilled}'::text[])",
        ),
        _check(
            "max_concurrent_requests IS NULL OR max_concurrent_requests >= 1",
            "ck_accounts_max_concurrent_requests_positive",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_accounts"),
    )
    _create_table(
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
        _check("context_length > 0", "ck_catalog_models_context_length_positive"),
        _check(
            "max_output_tokens IS NULL OR max_output_tokens > 0",
            "ck_catalog_models_max_output_positive",
        ),
        _check("reasoning_headroom_tokens >= 0", "ck_catalog_models_headroom_non_negative"),
        sa.PrimaryKeyConstraint("id", name="pk_catalog_models"),
        sa.UniqueConstraint("id_key", name="uq_catalog_models_id_key"),
    )
    _create_table(
        "price_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("effective_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_microcents_per_million", sa.BigInteger(), nullable=False),
        sa.Column("output_microcents_per_million", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_microcents_per_million", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _check(
            "input_microcents_per_million >= 0 AND output_microcents_per_million >= 0 "
            "AND cache_read_microcents_per_million >= 0",
            "ck_price_versions_rates_non_negative",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["catalog_models.id"], name="fk_price_versions_model_id_catalog_models"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_price_versions"),
        sa.UniqueConstraint(
            "model_id", "effective_at", name="uq_price_versions_model_id_effective_at"
        ),
    )
    _create_table(
        "account_rates",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("effective_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_microcents_per_million", sa.BigInteger(), nullable=True),
        sa.Column("output_microcents_per_million", sa.BigInteger(), nullable=True),
        sa.Column("cache_read_microcents_per_million", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _check(
            "(input_microcents_per_million IS NULL AND output_microcents_per_million IS NULL "
            "AND cache_read_microcents_per_million IS NULL) OR (input_microcents_per_million "
            "IS NOT NULL AND output_microcents_per_million IS NOT NULL "
            "AND cache_read_microcents_per_million IS NOT NULL)",
            "ck_account_rates_all_or_none",
        ),
        _check(
            "input_microcents_per_million IS NULL OR (input_microcents_per_million >= 0 "
            "AND output_microcents_per_million >= 0 AND cache_read_microcents_per_million >= 0)",
            "ck_account_rates_rates_non_negative",
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_account_rates_account_id_accounts"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["catalog_models.id"], name="fk_account_rates_model_id_catalog_models"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_account_rates"),
        sa.UniqueConstraint(
            "account_id",
            "model_id",
            "effective_at",
            name="uq_account_rates_account_id_model_id_effective_at",
        ),
    )
    _create_table(
        "api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("monthly_spend_limit_microcents", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "spend_limit_window", sa.String(length=8), server_default="month", nullable=False
        ),
        sa.Column("restricts_models", sa.Boolean(), server_default="0", nullable=False),
        _check("spend_limit_window IN ('day', 'week', 'month')", "ck_api_keys_spend_limit_window"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_api_keys_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    )
    op.create_index("ix_api_keys_account_id", "api_keys", ["account_id"])
    _create_table(
        "account_models",
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_account_models_account_id_accounts"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["catalog_models.id"], name="fk_account_models_model_id_catalog_models"
        ),
        sa.PrimaryKeyConstraint("account_id", "model_id", name="pk_account_models"),
    )
    _create_table(
        "api_key_models",
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_api_key_models_account_id_accounts"
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name="fk_api_key_models_api_key_id_api_keys"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["catalog_models.id"], name="fk_api_key_models_model_id_catalog_models"
        ),
        sa.PrimaryKeyConstraint("api_key_id", "model_id", name="pk_api_key_models"),
    )


def _holds_and_ledger() -> None:
    _create_table(
        "authorizations",
        sa.Column("id", sa.String(length=64), nullable=False),
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
        sa.Column("counted", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("unused_noticed", sa.Boolean(), server_default="0", nullable=False),
        _check(
            "status IN ('active', 'settled', 'voided', 'expired')",
            "ck_authorizations_status",
            postgresql="status::text = ANY ('{active,settled,voided,expired}'::text[])",
        ),
        _check("estimate_microcents >= 0", "ck_authorizations_estimate_non_negative"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_authorizations_account_id_accounts"
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name="fk_authorizations_api_key_id_api_keys"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["catalog_models.id"], name="fk_authorizations_model_id_catalog_models"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_authorizations"),
        sa.UniqueConstraint(
            "account_id", "request_id", name="uq_authorizations_account_id_request_id"
        ),
    )
    op.create_index(
        "ix_authorizations_active_account",
        "authorizations",
        ["account_id", "expires_at"],
        **_when("status = 'active'"),
    )
    op.create_index(
        "ix_authorizations_active_key",
        "authorizations",
        ["api_key_id", "expires_at"],
        **_when("status = 'active'"),
    )
    op.create_index(
        "ix_authorizations_released",
        "authorizations",
        ["account_id"],
        **_when("counted AND status <> 'active'"),
    )
    op.create_index(
        "ix_authorizations_status_expires_at", "authorizations", ["status", "expires_at"]
    )
    op.create_index(
        "ix_authorizations_unnoticed_expiry",
        "authorizations",
        ["id"],
        **_when("status = 'expired' AND NOT unused_noticed"),
    )
    _create_table(
        "ledger_entries",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount_microcents", sa.BigInteger(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("usage_event_id", sa.BigInteger(), nullable=True),
        sa.Column("api_key_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("grant_id", sa.String(length=32), nullable=True),
        sa.Column("effective_at", sa.DateTime(timezone=True), nullable=True),
        _check(
            "(kind = 'grant' AND amount_microcents > 0) "
            "OR (kind = 'adjustment' AND amount_microcents <> 0) "
            "OR (kind = 'charge' AND amount_microcents <= 0) "
            "OR (kind IN ('expiry', 'void') AND amount_microcents < 0)",
            "ck_ledger_entries_amount_sign",
            postgresql="kind::text = 'grant' AND amount_microcents > 0"
            " OR kind::text = 'adjustment' AND amount_microcents <> 0"
            " OR kind::text = 'charge' AND amount_microcents <= 0"
            " OR kind::text = ANY ('{expiry,void}'::text[]) AND amount_microcents < 0",
        ),
        _check(
            "kind IN ('grant', 'adjustment', 'charge', 'expiry', 'void')",
            "ck_ledger_entries_kind",
            postgresql="kind::text = ANY ('{grant,adjustment,charge,expiry,void}'::text[])",
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_ledger_entries_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_ledger_entries"),
    )
    op.create_index("ix_ledger_entries_account_id_id", "ledger_entries", ["account_id", "id"])
    op.create_index(
        "uq_ledger_entries_account_id_idempotency_key",
        "ledger_entries",
        ["account_id", "idempotency_key"],
        unique=True,
        **_when("idempotency_key IS NOT NULL"),
    )
    _create_table(
        "credit_grants",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("entry_id", sa.BigInteger(), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("amount_microcents", sa.BigInteger(), nullable=False),
        sa.Column("remaining_microcents", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("expiring_noticed", sa.Boolean(), server_default="0", nullable=False),
        _check(
            "category IN ('paid', 'promotional', 'adjustment')",
            "ck_credit_grants_category",
            postgresql="category::text = ANY ('{paid,promotional,adjustment}'::text[])",
        ),
        _check(
            "status IN ('active', 'expired', 'voided')",
            "ck_credit_grants_status",
            postgresql="status::text = ANY ('{active,expired,voided}'::text[])",
        ),
        _check("amount_microcents > 0", "ck_credit_grants_amount_positive"),
        _check("priority >= 0 AND priority <= 100", "ck_credit_grants_priority"),
        _check(
            "remaining_microcents >= 0 AND remaining_microcents <= amount_microcents",
            "ck_credit_grants_remaining_within_amount",
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_credit_grants_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_credit_grants"),
        sa.UniqueConstraint("entry_id", name="uq_credit_grants_entry_id"),
    )
    op.create_index(
        "ix_credit_grants_account_id_entry_id", "credit_grants", ["account_id", "entry_id"]
    )
    op.create_index(
        "ix_credit_grants_active",
        "credit_grants",
        ["account_id", "expires_at"],
        **_when("status = 'active'"),
    )
    op.create_index(
        "ix_credit_grants_expiring_unnoticed",
        "credit_grants",
        ["expires_at"],
        **_when("expires_at IS NOT NULL AND NOT expiring_noticed"),
    )
    _create_table(
        "credit_allocation_days",
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("allocation_date", sa.Date(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("grant_id", sa.String(length=32), nullable=False),
        sa.Column("amount_microcents", sa.BigInteger(), nullable=False),
        _check("kind IN ('spend', 'deficit', 'payoff')", "ck_credit_allocation_days_kind"),
        _check("amount_microcents > 0", "ck_credit_allocation_days_amount_positive"),
        _check("(kind = 'deficit') = (grant_id = '')", "ck_credit_allocation_days_grant_named"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_credit_allocation_days_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint(
            "account_id", "allocation_date", "kind", "grant_id", name="pk_credit_allocation_days"
        ),
    )
    _create_table(
        "credit_rollforward",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("start_date", sa.Date(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_credit_rollforward"),
    )
    op.bulk_insert(
        sa.table("credit_rollforward", sa.column("id"), sa.column("start_date")),
        [{"id": 1, "start_date": datetime.now(UTC).date()}],
    )


def _usage() -> None:
    _create_table(
        "usage_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.Column("api", sa.String(length=20), nullable=False),
        sa.Column("outcome", sa.String(length=10), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("authorization_id", sa.String(length=64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("reasoning_tokens", sa.Integer(), nullable=False),
        sa.Column("input_microcents", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_microcents", sa.BigInteger(), nullable=False),
        sa.Column("output_microcents", sa.BigInteger(), nullable=False),
        sa.Column("total_microcents", sa.BigInteger(), nullable=False),
        sa.Column("price_version_id", sa.String(length=32), nullable=True),
        _check(
            "api IN ('chat_completions', 'responses', 'messages')",
            "ck_usage_events_api",
            postgresql="api::text = ANY ('{chat_completions,responses,messages}'::text[])",
        ),
        _check(
            "outcome IN ('completed', 'failed')",
            "ck_usage_events_outcome",
            postgresql="outcome::text = ANY ('{completed,failed}'::text[])",
        ),
        _check(
            "total_microcents = input_microcents + cache_read_microcents + output_microcents",
            "ck_usage_events_total_is_sum",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_usage_events"),
        sa.UniqueConstraint(
            "account_id", "request_id", name="uq_usage_events_account_id_request_id"
        ),
    )
    op.create_index(
        "ix_usage_events_price_version_id_occurred_at",
        "usage_events",
        ["price_version_id", "occurred_at"],
    )
    _create_table(
        "quarantined_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
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
        sa.PrimaryKeyConstraint("id", name="pk_quarantined_events"),
        sa.UniqueConstraint("raw_sha256", name="uq_quarantined_events_raw_sha256"),
    )
    op.create_index(
        "ix_quarantined_events_account_id_id", "quarantined_events", ["account_id", "id"]
    )
    op.create_index("ix_quarantined_events_code_id", "quarantined_events", ["code", "id"])
    _create_table(
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
        _check(
            "bucket_width IN ('1h', '1d')",
            "ck_usage_rollups_bucket_width",
            postgresql="bucket_width::text = ANY ('{1h,1d}'::text[])",
        ),
        _check(
            "grouping IN ('key_model', 'key', 'model')",
            "ck_usage_rollups_grouping",
            postgresql="\"grouping\"::text = ANY ('{key_model,key,model}'::text[])",
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_usage_rollups_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint(
            "account_id",
            "bucket_width",
            "grouping",
            "bucket_start",
            "api_key_id",
            "model_id",
            name="pk_usage_rollups",
        ),
    )
    op.create_index(
        "ix_usage_rollups_day_key_model",
        "usage_rollups",
        ["bucket_start"],
        **_when("bucket_width = '1d' AND grouping = 'key_model'"),
    )
    if _dialect() == "postgresql":
        op.execute("ALTER TABLE usage_rollups SET (fillfactor = 50)")
    _create_table(
        "spend_limit_notices",
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("spend_limit_window", sa.String(length=8), nullable=False),
        sa.Column("window_starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("limit_microcents", sa.BigInteger(), nullable=False),
        sa.Column("spent_microcents", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _check("percent IN (80, 100)", "ck_spend_limit_notices_percent"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_spend_limit_notices_account_id_accounts"
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name="fk_spend_limit_notices_api_key_id_api_keys"
        ),
        sa.PrimaryKeyConstraint(
            "account_id",
            "api_key_id",
            "spend_limit_window",
            "window_starts_at",
            "percent",
            name="pk_spend_limit_notices",
        ),
    )


def _exports() -> None:
    _create_table(
        "export_days",
        sa.Column("export_date", sa.Date(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("newest_event_id", sa.BigInteger(), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("credits_exported_at", sa.DateTime(timezone=True), nullable=True),
        _check("status IN ('pending', 'succeeded', 'failed')", "ck_export_days_status"),
        sa.PrimaryKeyConstraint("export_date", name="pk_export_days"),
    )
    _create_table(
        "export_runs",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
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
        _check("status IN ('succeeded', 'failed')", "ck_export_runs_status"),
        _check("trigger IN ('scheduled', 'manual')", "ck_export_runs_trigger"),
        sa.PrimaryKeyConstraint("id", name="pk_export_runs"),
    )
    op.create_index("ix_export_runs_export_date_id", "export_runs", ["export_date", "id"])


def _audit_log() -> None:
    _create_table(
        "audit_events",
        sa.Column("seq", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_type", sa.String(length=32), nullable=False),
        sa.Column("target_id", sa.String(length=200), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=True),
        sa.Column("request_id", sa.String(length=32), nullable=True),
        sa.Column("changes", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_audit_events"),
        sa.UniqueConstraint("id", name="uq_audit_events_id"),
    )
    op.create_index("ix_audit_events_account_id_seq", "audit_events", ["account_id", "seq"])
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    if _dialect() == "postgresql":
        op.execute(
            f"""
            CREATE FUNCTION metering_audit_append_only() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '{APPEND_ONLY}';
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
                f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
            )


def _webhooks() -> None:
    _create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("event_types", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=True),
        sa.Column("secret_sealed", sa.Text(), nullable=False),
        sa.Column("previous_secret_sealed", sa.Text(), nullable=True),
        sa.Column("previous_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_webhook_endpoints_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_endpoints"),
    )
    op.create_index("ix_webhook_endpoints_account_id", "webhook_endpoints", ["account_id"])
    _create_table(
        "webhook_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("public_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched", sa.Boolean(), server_default=sa.text("(false)"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_events"),
        sa.UniqueConstraint("public_id", name="uq_webhook_events_public_id"),
    )
    op.create_index("ix_webhook_events_account_id", "webhook_events", ["account_id"])
    op.create_index(
        "ix_webhook_events_undispatched", "webhook_events", ["id"], **_when("NOT dispatched")
    )
    _create_table(
        "webhook_deliveries",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("endpoint_id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name="fk_webhook_deliveries_endpoint_id_webhook_endpoints",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["webhook_events.id"],
            name="fk_webhook_deliveries_event_id_webhook_events",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        **_when("status = 'pending'"),
    )
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries", ["endpoint_id", "id"])
    op.create_index(
        "uq_webhook_deliveries_event_endpoint",
        "webhook_deliveries",
        ["event_id", "endpoint_id"],
        unique=True,
    )


def _portal() -> None:
    _create_table(
        "portal_sessions",
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_portal_sessions_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("secret_hash", name="pk_portal_sessions"),
        sa.UniqueConstraint("id", name="uq_portal_sessions_id"),
    )
    op.create_index("ix_portal_sessions_account_id", "portal_sessions", ["account_id"])
    _create_table(
        "portal_sign_in_tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_portal_sign_in_tokens_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("token_hash", name="pk_portal_sign_in_tokens"),
    )
    op.create_index("ix_portal_sign_in_tokens_account_id", "portal_sign_in_tokens", ["account_id"])


# Every table, each after the tables it refers to: dropped in the reverse order.
TABLES = (
    "accounts",
    "catalog_models",
    "price_versions",
    "account_rates",
    "api_keys",
    "account_models",
    "api_key_models",
    "authorizations",
    "ledger_entries",
    "credit_grants",
    "credit_allocation_days",
    "credit_rollforward",
    "usage_events",
    "quarantined_events",
    "usage_rollups",
    "spend_limit_notices",
    "export_days",
    "export_runs",
    "audit_events",
    "webhook_endpoints",
    "webhook_events",
    "webhook_deliveries",
    "portal_sessions",
    "portal_sign_in_tokens",
)


def downgrade() -> None:
    for name in reversed(TABLES):
        op.drop_table(name)  # with its indexes and triggers
    if _dialect() == "postgresql":
        op.execute("DROP FUNCTION metering_audit_append_only()")
