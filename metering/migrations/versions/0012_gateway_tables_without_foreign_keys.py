"""The tables every gateway request writes lose their foreign keys, as ``usage_events`` had
(docs/decisions/0024): the holds (account, key, model), the ledger's entries, the allocation
days and the usage rollups (account). ``metering verify`` names any row whose account, key or
model is missing (metering.models.base.Names).

A foreign key's check is a ``SELECT … FOR KEY SHARE`` of the row it names at every insert: one
per charge entry of a batch (a sixth of PostgreSQL's work per event), three per hold, each
marking the key's and the model's row with a lock that another transaction's check then joins
(a multixact), the model's row shared by every account. No row is deleted from ``accounts``,
``api_keys`` or ``catalog_models``, and each writer reads the rows it names in its own
transaction.

SQLite remakes the four tables without them (``batch_alter_table``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 22:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table: its foreign keys as (column, the table and column it names)
FOREIGN_KEYS = {
    "authorizations": (
        ("account_id", "accounts", "id"),
        ("api_key_id", "api_keys", "id"),
        ("model_id", "catalog_models", "id"),
    ),
    "ledger_entries": (("account_id", "accounts", "id"),),
    "credit_allocation_days": (("account_id", "accounts", "id"),),
    "usage_rollups": (("account_id", "accounts", "id"),),
}


def _name(table: str, column: str, referred: str) -> str:
    return f"fk_{table}_{column}_{referred}"


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, keys in FOREIGN_KEYS.items():
        if sqlite:
            with op.batch_alter_table(table, recreate="always") as batch:
                for column, referred, _ in keys:
                    batch.drop_constraint(_name(table, column, referred), type_="foreignkey")
            continue
        for column, referred, _ in keys:
            op.drop_constraint(_name(table, column, referred), table, type_="foreignkey")


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, keys in FOREIGN_KEYS.items():
        if sqlite:
            with op.batch_alter_table(table, recreate="always") as batch:
                for column, referred, referred_column in keys:
                    batch.create_foreign_key(
                        _name(table, column, referred), referred, [column], [referred_column]
                    )
            continue
        for column, referred, referred_column in keys:
            op.create_foreign_key(
                _name(table, column, referred), table, referred, [column], [referred_column]
            )
