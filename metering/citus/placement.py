"""Where each table sits on a Citus cluster: the one rule, and the facts it looks at.

* a table with a NOT NULL ``account_id`` is account data: distributed by ``account_id``, colocated
  with ``accounts`` (distributed by ``id``), so one account's rows of every table sit on one shard
  and each account's unit of work is a single-node transaction;
* a table found by a secret's hash before the account is known (``api_keys``, the portal's
  sessions and sign-in tokens) is a reference table: every node holds it, so the lookup never fans
  out over the shards;
* a table with triggers of its own (the audit log's append-only guard) stays on the coordinator,
  as a Citus local table: Citus refuses triggers on shards;
* every other table (the catalog, tables whose rows may have no account, operator-wide state) is a
  reference table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import MetaData

from metering.models import Base

ACCOUNT_COLUMN = "account_id"
ACCOUNTS = "accounts"
# Found by a secret's hash before the account is known: a shard key would mean a fan-out.
KEYED_BY_SECRET = frozenset({"api_keys", "portal_sessions", "portal_sign_in_tokens"})
NOT_DISTRIBUTED = frozenset({"alembic_version"})


@dataclass(frozen=True)
class Placement:
    """Where the rule puts one table: ``distributed`` by ``column``, or ``reference``."""

    table: str
    kind: str  # "distributed" | "reference" | "local" (citus_tables' names)
    column: str | None = None


@dataclass(frozen=True)
class TableFacts:
    """What the rule looks at in one table."""

    name: str
    not_null_columns: frozenset[str]
    has_triggers: bool


def placement(table: TableFacts) -> Placement:
    """The one rule: account data sharded by account, everything else on every node (or, with
    triggers, on the coordinator)."""
    if table.name == ACCOUNTS:
        return Placement(table.name, "distributed", "id")
    if table.has_triggers:
        return Placement(table.name, "local")
    if ACCOUNT_COLUMN in table.not_null_columns and table.name not in KEYED_BY_SECRET:
        return Placement(table.name, "distributed", ACCOUNT_COLUMN)
    return Placement(table.name, "reference")


def facts_of(metadata: MetaData) -> list[TableFacts]:
    """The facts the rule looks at, read from the models (the migrations make the same tables:
    tests/test_migrations.py) rather than from a database."""
    return [
        TableFacts(
            name,
            frozenset(c.name for c in table.columns if not c.nullable),
            # The one table with triggers of its own: the audit log's append-only guard.
            name == "audit_events",
        )
        for name, table in metadata.tables.items()
    ]


def sharding(metadata: MetaData) -> dict[str, str]:
    """Each table the rule shards, and the column it is sharded by: the scope of the statements
    and programs that run for one account (``of_account``)."""
    return {
        where.table: where.column
        for where in map(placement, facts_of(metadata))
        if where.kind == "distributed" and where.column is not None
    }


# The service's sharded tables and their columns.
SCOPE: Mapping[str, str] = sharding(Base.metadata)
