"""The schema distributed on a Citus coordinator (CONTRACT §13), by one metadata rule.

``metering migrate`` runs the same migrations on every backend; on a database with the ``citus``
extension it then calls :func:`distribute`, which places every table of the public schema:

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from sqlalchemy import (
    Connection,
    CursorResult,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.orm import Session

from metering.kit import programs as p
from metering.models import Base

if TYPE_CHECKING:
    from metering.db import Database

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


@dataclass
class Distribution:
    """What one :func:`distribute` call did (empty when everything was already in place)."""

    placed: list[Placement] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    dropped_foreign_keys: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)  # distributed by their account
    moved: list[str] = field(default_factory=list)  # placed anew (the rule's answer changed)


# Whether a PostgreSQL database is a Citus coordinator: the one question, asked by migrate and
# by the gateway's group commit (metering.ledger.placement.postgres).
CITUS_PROBE = "SELECT count(*) > 0 FROM pg_extension WHERE extname = 'citus'"


class Probed:
    """What ``CITUS_PROBE`` answered for each database a process connects to (by host, port and
    name, which libpq keeps at hand): whether a database is a Citus coordinator does not change
    while a process serves it (``metering migrate`` distributes it before the service starts)."""

    def __init__(self) -> None:
        self._answers: dict[tuple[Any, ...], bool] = {}

    @staticmethod
    def key(info: Any) -> tuple[Any, ...]:
        """A psycopg ``connection.info``'s database: not ``info.dsn``, which rebuilds and parses
        the whole connection string at every call (a tenth of an authorization's CPU)."""
        return (info.host, info.port, info.dbname)

    def get(self, info: Any) -> bool | None:
        return self._answers.get(self.key(info))

    def keep(self, info: Any, answer: Any) -> bool:
        found = self._answers[self.key(info)] = bool(answer)
        return found


PROBED = Probed()


def on_citus(driver_connection: Any) -> bool:
    """Whether a (synchronous) psycopg connection's database is a Citus coordinator."""
    found = PROBED.get(driver_connection.info)
    if found is None:
        row = driver_connection.execute(CITUS_PROBE).fetchone()
        found = PROBED.keep(driver_connection.info, row and row[0])
    return found


async def on_citus_async(connection: Any) -> bool:
    """``on_citus`` of an asynchronous psycopg connection (the gateway's autocommit pool)."""
    found = PROBED.get(connection.info)
    if found is None:
        cursor = await connection.execute(CITUS_PROBE)
        row = await cursor.fetchone()
        found = PROBED.keep(connection.info, row and row[0])
    return found


# Whether each engine's database is a Citus coordinator: asked once per engine (a request path
# asks at every request, so the answer is one dictionary look-up; the probe's per-connection
# answers above are the level below).
_CLUSTERS: WeakKeyDictionary[Engine, bool] = WeakKeyDictionary()


def _known_cluster(database: Database) -> bool | None:
    """Whether ``database`` is a Citus coordinator; None until asked (``is_cluster``,
    ``probe_cluster``)."""
    if database.dialect != "postgresql":
        return False
    return _CLUSTERS.get(database.engine)


def is_cluster(database: Database) -> bool:
    """Whether ``database`` is a Citus coordinator (asked once per engine)."""
    found = _known_cluster(database)
    if found is None:
        with database.reading() as session:
            found = _CLUSTERS[database.engine] = on_cluster(session)
    return found


async def probe_cluster(database: Database) -> bool:
    """``is_cluster`` from asynchronous code (the gateway's autocommit pool)."""
    found = _known_cluster(database)
    if found is None:
        async with database.async_driver_autocommit() as connection:
            found = _CLUSTERS[database.engine] = await on_citus_async(connection)
    return found


def has_citus(connection: Connection) -> bool:
    return connection.dialect.name == "postgresql" and bool(
        connection.execute(text(CITUS_PROBE)).scalar()
    )


def is_citus(url: str) -> bool:
    if not url.startswith("postgresql"):
        return False
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return has_citus(connection)
    finally:
        engine.dispose()


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


# The argument a one-account program is sent to the account's node by (its first).
ACCOUNT = p.Var("p_account_id", String())


# The service's sharded tables and their columns.
SCOPE: Mapping[str, str] = sharding(Base.metadata)


# How a worker is added while the service runs (README, "Adding a worker, online"): the shards
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


# PostgreSQL's ShareLock: the mode in which Citus' own writes lock a shard's metadata.
SHARE_LOCK = 5

# The first step of every one-account form: the account's shard's metadata locked as Citus' own
# writes lock it, for the rest of the transaction. A shard moves (citus_rebalance_start,
# citus_move_shard_placement) by logical replication while it takes writes; for the switch-over
# the move locks the shard group's metadata in ExclusiveLock on the coordinator and on every
# worker (BlockWritesToShardList: ``lock_shard_metadata(7, …)``), waits for the copy to catch up,
# points the placements at the new node and commits. Each write statement takes the ShareLock
# before it runs, but reads take none: a call that read the account's row (its balance, its held
# sum) on the old placement before the switch-over, then wrote after it, could write those values
# on the new placement over what calls committed there meanwhile (a lost update; reasoned from
# Citus' locking, not seen in tests/reliability/test_citus_rebalance.py's runs). Locked first,
# a call either finishes before the switch-over (which waits for it; its writes replicate) or
# starts after it, every statement on the new placement (a call delegated to the old node just
# before is sent on from there): its writes replicated only if its commit is synchronous
# (``REBALANCE``).
LOCK_ACCOUNT_SHARD = p.Run(
    select(
        func.lock_shard_metadata(
            literal_column(str(SHARE_LOCK)),
            array(
                [
                    func.get_shard_id_for_distribution_column(
                        literal_column("'accounts'"), ACCOUNT.ref
                    )
                ]
            ),
        ).label("shard_locked")
    )
)


# The plan cache's mode, which a one-account form leaves to Citus (``of_account``).
PLAN_CACHE_MODE = "plan_cache_mode"


def of_account(program: p.Program) -> p.Program:
    """A program's form on a Citus cluster: for one account's rows, every statement limited to
    its shard (``Program.of_account``, its statements built for ``programs.ONE_SHARD``),
    distributed by ``ACCOUNT`` (``distribute``); the account's shard locked against a move's
    switch-over first (``LOCK_ACCOUNT_SHARD``).

    Its settings are the program's but the plan cache's mode (RECORD_USAGE's
    ``force_generic_plan``): Citus plans an ``INSERT … SELECT`` into a distributed table (an
    event's insert from its JSON rows) only with its parameters' values; without them it makes
    no plan and counts on the plan cache to choose a custom one (distributed_planner.c,
    ``REPLAN_WITH_BOUND_PARAMETERS``). Forced generic, the statement fails on the worker
    instead ("could not create distributed plan": a single event's delegated call failed, and
    the event took its account's transaction, metering.usage.single)."""
    settings = {k: v for k, v in program.settings.items() if k != PLAN_CACHE_MODE}
    return program.of_account(ACCOUNT, SCOPE, first=(LOCK_ACCOUNT_SHARD,), settings=settings)


def text_of_account(statement: Any) -> str:
    """A statement's psycopg text for one account's rows on a cluster (``ACCOUNT``: its
    ``%(p_account_id)s`` parameter), every sharded table limited to the account's shard."""
    return p.psycopg_text_of_account(statement, ACCOUNT, SCOPE)


def on_cluster(session: Session) -> bool:
    """Whether a session's database is a Citus coordinator (asked once per database)."""
    from metering.db import driver_connection, is_postgresql

    return is_postgresql(session) and on_citus(driver_connection(session))


# -- Operator-wide work on a cluster: account by account. ---------------------------------------
#
# Citus locks rows (FOR UPDATE, SKIP LOCKED) only in a statement it sends whole to one shard, and
# a transaction that writes the shards of several workers commits in two phases. So a scan over
# every account (the scheduler's tidy-up and notices) is, on a cluster, first a read of the
# accounts that have work (across the shards, no lock), then each account's own transaction of
# the same statements limited to its rows (``execute_of_account``): each routed to one shard.


def per_account(database: Database, accounts: Callable[[Session], list[str]]) -> list[str | None]:
    """Each transaction of an operator-wide job: on a cluster one per account having work
    (``accounts``, read across the shards without a lock), elsewhere one for every account
    (None). The job limits its statements to the account it is given."""
    if not is_cluster(database):
        return [None]
    with database.reading() as session:
        return list(accounts(session))


def accounts_with(session: Session, table: Table, *where: Any) -> list[str]:
    """The accounts having rows of a sharded ``table`` that match ``where`` (in byte order)."""
    from sqlalchemy import select

    column = table.c[SCOPE[table.name]]
    query = select(column).where(*where).distinct().order_by(column)
    return [str(account) for account in session.execute(query).scalars()]


def execute_of_account(
    session: Session, statement: Any, account_id: str, params: Mapping[str, Any] | None = None
) -> CursorResult[Any]:
    """Run a Core statement for one account's rows (as ``text_of_account`` compiles it: every
    sharded table limited to the account) in the session's transaction: rows by column name."""
    compiled = p.psycopg_compiled_of_account(statement, ACCOUNT, SCOPE)
    values = {**compiled.params, **(params or {}), ACCOUNT.name: account_id}
    return session.connection().exec_driver_sql(str(compiled), values)


def one_snapshot(session: Session) -> None:
    """On a cluster, at the start of a REPEATABLE READ transaction that reads across the shards
    (``metering verify``): one connection per worker for the whole transaction, so that each
    worker answers every query from one snapshot. Each account's rows sit on one worker and
    each account's writes are single-node transactions, so every account is read whole, as of
    one instant of its worker. (Citus otherwise may open several connections to a worker for
    one query, each with a snapshot of its own.)"""
    if on_cluster(session):
        session.execute(text("SET LOCAL citus.max_adaptive_executor_pool_size = 1"))


# Advisory lock namespaces (the first of the two keys; the second is the object's).
EXPORT_DAY_LOCK = 0x6D657864  # "mexd": a day's export (metering.exports.repository.lock_day)


def lock(session: Session, namespace: int, key: int, *, wait: bool) -> bool:
    """Take a transaction's advisory lock on the coordinator (every service process and
    scheduler connects there), in place of a row lock of a reference table: on the cluster,
    ``FOR UPDATE SKIP LOCKED`` on the day's ``export_days`` row let a second scheduler take a
    day being exported (tests/exports/test_coordination.py). False when another transaction
    holds it and ``wait`` is False."""
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    taken = session.execute(
        text(f"SELECT {function}(:namespace, :key)::text"), {"namespace": namespace, "key": key}
    ).scalar()
    return wait or taken == "true"


def by_account(*groups: Sequence[Any]) -> dict[str, tuple[list[Any], ...]]:
    """Each account's part of every sequence of ``groups`` (its items' ``account_id``, an
    attribute or a key), the accounts in byte order, as each runs on its own shard."""
    parts: dict[str, tuple[list[Any], ...]] = {}
    for index, items in enumerate(groups):
        for item in items:
            account = item["account_id"] if isinstance(item, Mapping) else item.account_id
            parts.setdefault(str(account), tuple([] for _ in groups))[index].append(item)
    return dict(sorted(parts.items()))


def distribute(url: str) -> Distribution:
    """Place every table of the database at ``url`` by :func:`placement`, when it has Citus
    (a no-op elsewhere, and for tables already placed). One transaction: all or nothing."""
    if not url.startswith("postgresql"):
        return Distribution()
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            return _distribute(connection) if has_citus(connection) else Distribution()
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


def _distribute(connection: Connection) -> Distribution:
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
    return done


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
