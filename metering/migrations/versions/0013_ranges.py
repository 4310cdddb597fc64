"""Ranges (contract §1): SQLite refuses, never coerces, an integer column's value to a float.

SQLite's integer arithmetic turns a result beyond a signed 64-bit integer into a REAL, silently:
a balance pushed past the range became ``1.8e19`` and every read of it after was wrong
(``GET /v1/usage`` wrote invalid JSON, ``verify`` failed). Every integer column of every table
(amounts, counters, counts, rates, limits) now carries ``CHECK (typeof(x) = 'integer')`` (or
``IN ('integer', 'null')`` when nullable), named ``ck_<table>_<column>_integer`` (the naming convention), so such a
write fails as PostgreSQL's ``BIGINT`` does (metering.kit.ranges), and the ingest quarantines
the event that caused it. SQLite adds a CHECK only by rebuilding the table (batch mode, which
keeps the table's other constraints and indexes). PostgreSQL needs nothing: its column types
refuse by themselves.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 12:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every table's integer columns, as of this revision: (name, nullable).
_COLUMNS: dict[str, tuple[tuple[str, bool], ...]] = {
    "accounts": (("balance_microcents", False), ("held_microcents", False)),
    "catalog_models": (
        ("context_length", False),
        ("max_output_tokens", True),
        ("reasoning_headroom_tokens", False),
    ),
    "export_days": (("newest_event_id", True), ("requests", True), ("attempts", False)),
    "export_runs": (("newest_event_id", True), ("requests", True), ("files", False)),
    "quarantined_events": (("attempts", False),),
    "usage_events": (
        ("prompt_tokens", False),
        ("cached_tokens", False),
        ("output_tokens", False),
        ("reasoning_tokens", False),
        ("input_microcents", False),
        ("cache_read_microcents", False),
        ("output_microcents", False),
        ("total_microcents", False),
    ),
    "account_rates": (
        ("input_microcents_per_million", True),
        ("output_microcents_per_million", True),
        ("cache_read_microcents_per_million", True),
    ),
    "api_keys": (("monthly_spend_limit_microcents", True),),
    "ledger_entries": (("amount_microcents", False), ("usage_event_id", True)),
    "price_versions": (
        ("input_microcents_per_million", False),
        ("output_microcents_per_million", False),
        ("cache_read_microcents_per_million", False),
    ),
    "usage_rollups": (
        ("requests", False),
        ("input_tokens", False),
        ("cache_read_tokens", False),
        ("output_tokens", False),
        ("reasoning_tokens", False),
        ("cost_microcents", False),
        ("last_event_id", False),
    ),
    "authorizations": (
        ("prompt_tokens", False),
        ("requested_max_tokens", True),
        ("n", False),
        ("max_tokens", False),
        ("estimate_microcents", False),
        ("usage_event_id", True),
    ),
}


def _condition(column: str, nullable: bool) -> str:
    if nullable:
        return f"typeof({column}) IN ('integer', 'null')"
    return f"typeof({column}) = 'integer'"


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table, recreate="always") as batch_op:
            for column, nullable in columns:
                batch_op.create_check_constraint(f"{column}_integer", _condition(column, nullable))


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table, recreate="always") as batch_op:
            for column, _nullable in columns:
                batch_op.drop_constraint(f"{column}_integer", type_="check")
