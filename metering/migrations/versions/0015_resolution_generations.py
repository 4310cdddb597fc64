"""Accounts and catalog models gain ``resolution_generation``; on one PostgreSQL server,
triggers move it whenever a row that a key's resolution reads changes (the resolution's inputs:
metering.ledger.resolution.inputs(), which ``tests/ledger/test_resolution_generations.py`` holds
equal to the triggers a migrated database has).

A check-and-hold then confirms a resolution an API process remembers by comparing two numbers
(the account's, read with its locked row, and the model's) where it recomputed the resolution's
whole text. A row of an account's (its keys, projects, members, model lists, own rates, and the
account's own columns) moves the account's generation; a catalog model's row and its list
prices move the model's.

SQLite gains the columns only (its authorizations never remember a resolution). On a Citus
cluster there are no triggers (Citus refuses them on shards): its check-and-hold confirms the
text, and distributing a database drops them (metering.citus.distribution).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 22:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGER = "metering_resolution_changed"
# Each table's columns that the resolution reads, at this revision: an owner's own row moves its
# generation before the update (OWN_COLUMNS), another row its owner's after the change (OWNED).
# A price version's columns read (the list's, and an account's own beside its account).
_VERSION = [
    "cache_read_microcents_per_million",
    "effective_at",
    "id",
    "input_microcents_per_million",
    "model_id",
    "output_microcents_per_million",
]
OWNED = {
    "account_models": ("account", ["account_id", "model_id"]),
    "account_rates": ("account", ["account_id", *_VERSION]),
    "api_key_models": ("account", ["account_id", "api_key_id", "model_id"]),
    "api_keys": (
        "account",
        [
            "account_id",
            "id",
            "member_id",
            "monthly_spend_limit_microcents",
            "project_id",
            "restricts_models",
            "revoked_at",
            "secret_hash",
            "spend_limit_window",
        ],
    ),
    "members": ("account", ["account_id", "id", "spend_limit_microcents", "spend_limit_window"]),
    "price_versions": ("model", _VERSION),
    "project_models": ("account", ["account_id", "model_id", "project_id"]),
    "projects": (
        "account",
        ["account_id", "id", "restricts_models", "spend_limit_microcents", "spend_limit_window"],
    ),
}
OWN_COLUMNS = {
    "accounts": ["billing", "id", "max_concurrent_requests", "restricts_models"],
    "catalog_models": [
        "context_length",
        "deprecation_date",
        "id",
        "id_key",
        "max_output_tokens",
        "reasoning_headroom_tokens",
    ],
}
# An owner's table and the column that names it in an owned row.
OWNER_TABLES = {"account": ("accounts", "account_id"), "model": ("catalog_models", "model_id")}


def _on_one_server() -> bool:
    """PostgreSQL whose tables are not distributed by Citus (an upgrade of a cluster has no
    triggers)."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    if bind.execute(sa.text("SELECT to_regclass('pg_dist_partition') IS NULL")).scalar():
        return True
    return not bind.execute(
        sa.text(
            "SELECT EXISTS (SELECT FROM pg_dist_partition "
            "WHERE logicalrelid = 'accounts'::regclass)"
        )
    ).scalar()


def _owned_changed(owner: str) -> str:
    table, column = OWNER_TABLES[owner]
    bump = f"UPDATE {table} SET resolution_generation = resolution_generation + 1 WHERE id ="
    return f"""
        CREATE FUNCTION metering_resolution_of_{owner}_changed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP <> 'INSERT' THEN
                {bump} OLD.{column};
            END IF;
            IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.{column} IS DISTINCT FROM OLD.{column})
            THEN
                {bump} NEW.{column};
            END IF;
            RETURN NULL;
        END $$;
        """


def upgrade() -> None:
    for table in OWN_COLUMNS:
        if op.get_bind().dialect.name == "sqlite":  # its integer columns refuse anything else
            op.execute(
                f"ALTER TABLE {table} ADD COLUMN resolution_generation BIGINT NOT NULL "
                f"DEFAULT 0 CONSTRAINT ck_{table}_resolution_generation_integer "
                f"CHECK (typeof(resolution_generation) = 'integer')"
            )
        else:
            op.add_column(
                table,
                sa.Column(
                    "resolution_generation", sa.BigInteger(), server_default="0", nullable=False
                ),
            )
    if not _on_one_server():
        return
    op.execute(
        """
        CREATE FUNCTION metering_resolution_changed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.resolution_generation := OLD.resolution_generation + 1;
            RETURN NEW;
        END $$;
        """
    )
    for owner in OWNER_TABLES:
        op.execute(_owned_changed(owner))
    for table, columns in OWN_COLUMNS.items():
        op.execute(
            f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE OF {', '.join(columns)} ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION metering_resolution_changed()"
        )
    for table, (owner, columns) in OWNED.items():
        op.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR DELETE OR UPDATE OF {', '.join(columns)} "
            f"ON {table} FOR EACH ROW EXECUTE FUNCTION metering_resolution_of_{owner}_changed()"
        )


def downgrade() -> None:
    if _on_one_server():
        for table in (*OWN_COLUMNS, *OWNED):
            op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table}")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS metering_resolution_changed()")
        for owner in OWNER_TABLES:
            op.execute(f"DROP FUNCTION IF EXISTS metering_resolution_of_{owner}_changed()")
    for table in OWN_COLUMNS:
        with op.batch_alter_table(table) as batch:
            if op.get_bind().dialect.name == "sqlite":
                batch.drop_constraint(
                    op.f(f"ck_{table}_resolution_generation_integer"), type_="check"
                )
            batch.drop_column("resolution_generation")
