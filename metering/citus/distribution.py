"""The schema distributed on a Citus coordinator, by the one rule (metering.citus.placement).

``metering migrate`` runs the same migrations on every backend; on a database with the ``citus``
extension it then calls :func:`distribute`, which places every table of the public schema where
the rule puts it.

Citus needs every primary key and unique constraint of a distributed table to include its
distribution column, and a foreign key between distributed tables to include it on both sides:
those are widened here (the account column put first). A reference table cannot refer to a
distributed one, so such foreign keys (a key's or an endpoint's account) are dropped; the service
writes those columns only with an account it has just read. Alembic's own version table stays a
plain coordinator table.

Idempotent: a table Citus already holds where the rule puts it is left alone, so re-running
``migrate`` changes nothing; a table a later migration adds is placed the next time it runs, and
one a later migration changed so that the rule puts it elsewhere (a reference table whose
account column became NOT NULL) is taken back to the coordinator and placed anew, its rows
with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, create_engine, text

from metering.citus import shard_forms
from metering.citus.one_account import (
    ACCOUNT,
    CITUS_RELEASE,
    PLAN_CACHE_MODE,
    delegated_settings,
)
from metering.citus.placement import (
    ACCOUNTS,
    NOT_DISTRIBUTED,
    Placement,
    TableFacts,
    placement,
)
from metering.db import Kind, probe


@dataclass
class Distribution:
    """What one :func:`distribute` call did (empty when everything was already in place)."""

    placed: list[Placement] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    dropped_foreign_keys: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)  # distributed by their account
    moved: list[str] = field(default_factory=list)  # placed anew (the rule's answer changed)
    shard_forms: list[str] = field(default_factory=list)  # written (metering.citus.shard_forms)


# How a worker is added while the service runs (docs/citus.md#adding-a-worker-online): the shards
# rebalanced by Citus' default, logical replication, the shards taking writes while they are
# copied; every node with ``synchronous_commit`` on (PostgreSQL's default). A move ends when the
# target has replayed the source's WAL up to the position Citus reads after blocking writes,
# ``pg_current_wal_lsn()``: the WAL *written* so far. An asynchronous commit (synchronous_commit
# = off) is visible and has released its locks before its commit record is written: a call that
# committed just before the move took its lock could lie beyond that position, be left out of
# the catch-up, and stay behind on the old placement when the move switched over (lost: seen in
# about one run of five of tests/reliability/test_citus_rebalance.py, a hold inserted on the
# source 10 ms before the move read the position, the catch-up over 1 ms later, the row found
# afterwards in the old shard only). With synchronous commits the commit record is written
# before the locks go, so before the move's lock is granted and within the position.
SHARD_TRANSFER_MODE = "auto"
REBALANCE = f"SELECT citus_rebalance_start(shard_transfer_mode := '{SHARD_TRANSFER_MODE}')"
# The nodes whose commits are asynchronous: none may be, for REBALANCE.
ASYNCHRONOUS_COMMITS = (
    "SELECT nodename || ':' || nodeport FROM run_command_on_all_nodes('SHOW synchronous_commit') "
    "JOIN pg_dist_node USING (nodeid) WHERE result = 'off'"
)


def distribute(url: str) -> Distribution:
    """Place every table of the database at ``url`` by :func:`placement`, when it has Citus
    (a no-op elsewhere, and for tables already placed). One transaction: all or nothing."""
    if not url.startswith("postgresql"):
        return Distribution()
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            cluster = probe(connection) is Kind.CITUS
            return _distribute(connection) if cluster else Distribution()
    finally:
        engine.dispose()


@dataclass(frozen=True)
class _ForeignKey:
    name: str
    table: str
    columns: tuple[str, ...]
    referred: str
    referred_columns: tuple[str, ...]
    actions: str  # ON DELETE / ON UPDATE / DEFERRABLE, as pg_get_constraintdef ends


# The triggers a database has on one server only: those that move the resolution generations
# (migration 0015; metering.ledger.resolution). Citus refuses triggers on shards, and its
# check-and-hold confirms a remembered resolution by its text instead, so distributing a database
# drops them (before its tables are placed: a table with triggers of its own stays on the
# coordinator).
ONE_SERVER_TRIGGERS = ("metering_resolution_changed",)


def _distribute(connection: Connection) -> Distribution:
    for trigger, table_name in connection.execute(
        text(
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = ANY(:names) ORDER BY 2"
        ),
        {"names": list(ONE_SERVER_TRIGGERS)},
    ):
        connection.execute(text(f"DROP TRIGGER {_q(trigger)} ON {_q(table_name)}"))
    placed_already = {
        name: Placement(name, kind, None if column == "<none>" else column)
        for name, kind, column in connection.execute(
            text("SELECT table_name::text, citus_table_type, distribution_column FROM citus_tables")
        )
    }
    kinds = {
        facts.name: placement(facts)
        for facts in _tables(connection)
        if facts.name not in NOT_DISTRIBUTED
    }
    pending = {name: where for name, where in kinds.items() if placed_already.get(name) != where}
    # Placed before by a rule that now puts them elsewhere (a migration made a nullable account
    # column NOT NULL, as the webhook outbox's became): taken back to the coordinator, then
    # placed anew.
    moved = sorted(name for name in pending if name in placed_already)
    done = Distribution()
    if pending:
        _place(connection, kinds, pending, done, moved)
    done.functions = _distribute_functions(connection)
    done.shard_forms = shard_forms.make(connection).written
    return done


def _distribute_functions(connection: Connection) -> list[str]:
    """Every one-account program (``…_of_account``, its first argument ``ACCOUNT``) distributed
    by that argument, colocated with ``accounts``: a call from the coordinator is sent, whole, to
    the node that holds the account (Citus' function call delegation), and runs there as one
    local transaction."""
    done = []
    for (signature,) in connection.execute(
        text(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.proname LIKE 'metering\\_%\\_of\\_account' "
            "AND NOT EXISTS (SELECT FROM pg_dist_object d "
            "  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
            "  AND d.colocationid IS NOT NULL) ORDER BY 1"
        )
    ):
        connection.execute(
            text("SELECT create_distributed_function(:f, :argument, colocate_with => :anchor)"),
            {"f": signature, "argument": ACCOUNT.name, "anchor": ACCOUNTS},
        )
        done.append(signature)
    _set_delegated(connection)
    return done


def _set_delegated(connection: Connection) -> None:
    """Every one-account function given the settings the cluster's Citus release needs
    (``delegated_settings``) beyond its program's, altered where it lacks them or holds them
    where the release needs none (a cluster upgraded, then migrated again): Citus sends the
    ``ALTER FUNCTION`` to every node. A function the installer replaced has its program's
    settings only, so each ``metering migrate`` sets them again."""
    release = connection.execute(text(f"SELECT {CITUS_RELEASE}")).scalar_one()
    wanted = delegated_settings(release)
    for signature, config in connection.execute(
        text(
            "SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}') FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.proname LIKE 'metering\\_%\\_of\\_account' "
            "ORDER BY 1"
        )
    ):
        held = dict(setting.split("=", 1) for setting in config)
        for name, value in wanted.items():
            if held.get(name) != value:
                connection.execute(text(f"ALTER FUNCTION {signature} SET {name} = {value}"))
        for name in {PLAN_CACHE_MODE} - wanted.keys():  # which no one-account program sets
            if name in held:
                connection.execute(text(f"ALTER FUNCTION {signature} RESET {name}"))


def _place(
    connection: Connection,
    kinds: dict[str, Placement],
    pending: dict[str, Placement],
    done: Distribution,
    moved: Sequence[str] = (),
) -> None:
    # Distributing tables with foreign keys in one transaction needs Citus to use one
    # connection per node; a transaction that writes a reference table with foreign keys does
    # too, so the database keeps that mode for every session.
    connection.execute(text("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'"))
    connection.execute(
        text(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET citus.multi_shard_modify_mode "
            "TO ''sequential''', current_database()); END $$"
        )
    )

    foreign_keys = [
        fk for fk in _foreign_keys(connection) if fk.table in pending or fk.referred in pending
    ]
    for fk in foreign_keys:
        connection.execute(text(f"ALTER TABLE {_q(fk.table)} DROP CONSTRAINT {_q(fk.name)}"))
    for name in moved:
        connection.execute(text("SELECT undistribute_table(:t)"), {"t": name})
        done.moved.append(name)
    for name, where in pending.items():
        if where.kind == "distributed" and where.column is not None:
            done.widened += _widen_unique_keys(connection, name, where.column)

    # Reference tables first (distributed tables may refer to them), then the colocation
    # group's anchor, then the rest of the account tables beside it.
    for name in sorted(n for n, w in pending.items() if w.kind == "reference"):
        connection.execute(text("SELECT create_reference_table(:t)"), {"t": name})
        done.placed.append(pending[name])
    for name in sorted(n for n, w in pending.items() if w.kind == "local"):
        connection.execute(text("SELECT citus_add_local_table_to_metadata(:t)"), {"t": name})
        done.placed.append(pending[name])
    if ACCOUNTS in pending:
        connection.execute(text("SELECT create_distributed_table(:t, 'id')"), {"t": ACCOUNTS})
        done.placed.append(pending[ACCOUNTS])
    for name in sorted(n for n, w in pending.items() if w.kind == "distributed" and n != ACCOUNTS):
        connection.execute(
            text("SELECT create_distributed_table(:t, :c, colocate_with => :anchor)"),
            {"t": name, "c": pending[name].column, "anchor": ACCOUNTS},
        )
        done.placed.append(pending[name])

    for fk in foreign_keys:
        statement = _recreated(fk, kinds)
        if statement is None:
            done.dropped_foreign_keys.append(f"{fk.table}.{fk.name}")
        else:
            connection.execute(text(statement))


def _recreated(fk: _ForeignKey, kinds: dict[str, Placement]) -> str | None:
    """The foreign key as Citus allows it: unchanged towards a reference table, widened by the
    account on both sides between account tables, none from a reference table to account data
    nor between a coordinator table and the others."""
    source, target = kinds.get(fk.table), kinds.get(fk.referred)
    if source is None or target is None:
        return None
    if "local" in (source.kind, target.kind) and source.kind != target.kind:
        return None
    columns, referred_columns = fk.columns, fk.referred_columns
    if target.kind == "distributed":
        if source.kind != "distributed":
            return None
        assert source.column is not None and target.column is not None
        if not (
            source.column in columns
            and referred_columns[columns.index(source.column)] == target.column
        ):
            columns = (source.column, *columns)
            referred_columns = (target.column, *referred_columns)
    return (
        f"ALTER TABLE {_q(fk.table)} ADD CONSTRAINT {_q(fk.name)} FOREIGN KEY "
        f"({', '.join(map(_q, columns))}) REFERENCES {_q(fk.referred)} "
        f"({', '.join(map(_q, referred_columns))}){fk.actions}"
    )


def _tables(connection: Connection) -> list[TableFacts]:
    """Every ordinary table of the public schema: its NOT NULL columns, whether it has triggers."""
    return [
        TableFacts(name, frozenset(not_null or ()), has_triggers)
        for name, not_null, has_triggers in connection.execute(
            text(
                "SELECT c.relname, "
                "ARRAY(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid "
                "      AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull), "
                "EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') "
                "AND NOT c.relispartition ORDER BY c.relname"
            )
        )
    ]


def _foreign_keys(connection: Connection) -> list[_ForeignKey]:
    keys = []
    for name, table, columns, referred, referred_columns, definition in connection.execute(
        text(
            "SELECT con.conname, src.relname, "
            "ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY k(n, i) "
            "      JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n "
            "      ORDER BY k.i), "
            "dst.relname, "
            "ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY k(n, i) "
            "      JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n "
            "      ORDER BY k.i), "
            "pg_get_constraintdef(con.oid) "
            "FROM pg_constraint con JOIN pg_class src ON src.oid = con.conrelid "
            "JOIN pg_class dst ON dst.oid = con.confrelid "
            "JOIN pg_namespace n ON n.oid = src.relnamespace "
            "WHERE con.contype = 'f' AND n.nspname = 'public' ORDER BY src.relname, con.conname"
        )
    ):
        # What follows the referred column list: ON DELETE …, DEFERRABLE …
        actions = definition.split(")", 2)[-1] if definition.count(")") >= 2 else ""
        keys.append(
            _ForeignKey(
                name, table, tuple(columns), referred, tuple(referred_columns), actions.rstrip()
            )
        )
    return keys


def _widen_unique_keys(connection: Connection, table: str, column: str) -> list[str]:
    """Put ``column`` first in every primary key, unique constraint and unique index of
    ``table`` that lacks it (Citus enforces uniqueness within a shard only)."""
    widened = []
    for index, constraint, kind, columns, predicate, method in connection.execute(
        text(
            "SELECT i.relname, con.conname, con.contype, "
            "ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY k(n, o) "
            "      JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.n "
            "      ORDER BY k.o), "
            "pg_get_expr(x.indpred, x.indrelid), am.amname "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_am am ON am.oid = i.relam "
            "LEFT JOIN pg_constraint con "
            "  ON con.conindid = x.indexrelid AND con.contype IN ('p', 'u') "
            "WHERE x.indrelid = CAST(:t AS regclass) AND x.indisunique AND x.indexprs IS NULL"
        ),
        {"t": table},
    ):
        if column in columns:
            continue
        wide = ", ".join(_q(c) for c in (column, *columns))
        if constraint is not None:
            connection.execute(text(f"ALTER TABLE {_q(table)} DROP CONSTRAINT {_q(constraint)}"))
            what = "PRIMARY KEY" if kind == "p" else "UNIQUE"
            connection.execute(
                text(f"ALTER TABLE {_q(table)} ADD CONSTRAINT {_q(constraint)} {what} ({wide})")
            )
        else:
            connection.execute(text(f"DROP INDEX {_q(index)}"))
            where = f" WHERE {predicate}" if predicate else ""
            connection.execute(
                text(
                    f"CREATE UNIQUE INDEX {_q(index)} ON {_q(table)} USING {method} ({wide}){where}"
                )
            )
        widened.append(f"{table}.{constraint or index}")
    return widened


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def placements(url: str) -> list[Placement]:
    """How Citus holds each table now (``citus_tables``), by name."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [
                Placement(name, kind, column if kind == "distributed" else None)
                for name, kind, column in connection.execute(
                    text(
                        "SELECT table_name::text, citus_table_type, distribution_column "
                        "FROM citus_tables ORDER BY 1"
                    )
                )
            ]
    finally:
        engine.dispose()
