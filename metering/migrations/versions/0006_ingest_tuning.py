"""Ingest tuning: the tables every usage event writes keep only the indexes something reads.

* ``ix_usage_events_account_id_occurred_at``: no query reads it (reports and exports read the
  rollups; lookups by account go through the unique (account_id, request_id) index).
* ``ix_usage_events_model_id_occurred_at`` and ``ix_usage_events_price_version_id`` become one
  index on (price_version_id, occurred_at): the catalog import's two refusal checks (a version
  that priced a charge; list-priced charges of a model from an instant on, i.e. charges of the
  model's versions) both start from price versions.
* The foreign keys to accounts, api_keys and catalog_models: the ingest writes the ids it read
  in the same transaction, and none of those rows is ever deleted. Checked per row, they were
  half of the insert's cost and took a share lock on the account row (the row every
  authorization of the account locks) once per event. ``metering verify`` names orphans.
* ``ledger_entries``: the idempotency key's unique index only holds entries that have a key
  (grants and adjustments), not the charges (one per usage event); the index on
  usage_event_id goes (no query reads it).
* ``usage_rollups`` (PostgreSQL): fillfactor 50, so the upserts that add each batch to its rows
  (every row updated again and again, never its key) are HOT updates that skip the index.

Measured on 1000-event batches, PostgreSQL backend CPU: the usage_events insert 28 ms before,
15 ms after; the ledger_entries insert 12 ms before, 8 ms after.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FOREIGN_KEYS = (
    ("fk_usage_events_account_id_accounts", "accounts", "account_id"),
    ("fk_usage_events_api_key_id_api_keys", "api_keys", "api_key_id"),
    ("fk_usage_events_model_id_catalog_models", "catalog_models", "model_id"),
)


def upgrade() -> None:
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_events_account_id_occurred_at")
        batch_op.drop_index("ix_usage_events_model_id_occurred_at")
        batch_op.drop_index("ix_usage_events_price_version_id")
        batch_op.create_index(
            "ix_usage_events_price_version_id_occurred_at",
            ["price_version_id", "occurred_at"],
            unique=False,
        )
        for name, _, _ in _FOREIGN_KEYS:
            batch_op.drop_constraint(name, type_="foreignkey")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_entries_usage_event_id")
        batch_op.drop_constraint("uq_ledger_entries_account_id_idempotency_key", type_="unique")
        batch_op.create_index(
            "uq_ledger_entries_account_id_idempotency_key",
            ["account_id", "idempotency_key"],
            unique=True,
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE usage_rollups SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE usage_rollups RESET (fillfactor)")
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("uq_ledger_entries_account_id_idempotency_key")
        batch_op.create_unique_constraint(
            "uq_ledger_entries_account_id_idempotency_key", ["account_id", "idempotency_key"]
        )
        batch_op.create_index("ix_ledger_entries_usage_event_id", ["usage_event_id"], unique=False)
    with op.batch_alter_table("usage_events", schema=None) as batch_op:
        for name, referred, column in _FOREIGN_KEYS:
            batch_op.create_foreign_key(name, referred, [column], ["id"])
        batch_op.drop_index("ix_usage_events_price_version_id_occurred_at")
        batch_op.create_index(
            "ix_usage_events_price_version_id", ["price_version_id"], unique=False
        )
        batch_op.create_index(
            "ix_usage_events_model_id_occurred_at", ["model_id", "occurred_at"], unique=False
        )
        batch_op.create_index(
            "ix_usage_events_account_id_occurred_at", ["account_id", "occurred_at"], unique=False
        )
