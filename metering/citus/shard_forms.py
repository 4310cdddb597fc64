"""Each delegated one-account function's statements run against its shard group's own tables.

A call of a delegated one-account function (``metering_<program>_of_account``) runs on the
worker that holds the account, but each of its statements still passes through Citus there: a
distributed plan set up at every call, the shard query deparsed and planned again by the local
execution (a reference table's at every call), about half of a worker's CPU per authorization
and per single event (docs/citus.md). The shards themselves are plain tables of that worker.

So ``metering migrate`` makes, on a cluster, for each shard group (the account's shard of
``accounts`` and its colocated tables' shards, with the reference tables' one shard each) and
each delegated program, its **shard form** ``<program>_of_shard_<shard id>``: the same program
(``one_account.SHARD_FORMS``, built from the same steps as the delegated form), each table
named by that group's shard, so that PostgreSQL plans its statements once per backend as one
server does, and Citus plans none. Beside them, each program's **dispatcher**
``<program>_of_shards(shard, …)``, which calls the shard form of the shard it is given, and
``metering_shard_forms_here(shard)``: whether this node holds the shard and its forms were
made. The delegated form, after locking the account's shard against a move's switch-over as
before, asks that and calls the dispatcher; otherwise it runs its own statements through
Citus, as before. Everything is derived again at every ``metering migrate`` from the programs
and the shards the cluster has; functions are propagated by Citus to every node (and to a node
added later).

What keeps it exact:

- **a shard that moved**: the lock waits for a move's switch-over, and the question is asked
  after it, of this node's copy of Citus' metadata (``pg_dist_placement``, updated with the
  switch-over): a call delegated to the old node before the move finds the shard gone and runs
  through Citus, which sends its statements to the new node;
- **a shard that was split or placed anew** (new shard ids): no form was made for it, so the
  delegated form runs through Citus until the next ``metering migrate`` makes its forms; forms
  of shards no longer there are dropped then;
- **the coordinator** (a form not delegated: called in a transaction block, or to a node without
  the metadata) holds no shard of an account table: the question answers no there.

Reads of a reference table's shard see what Citus' local execution reads there (the node's
copy); writes go only to shards of the account's group, on the node that holds them, in the
call's one local transaction."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, create_engine, text

from metering.citus.one_account import (
    OF_SHARD,
    OF_SHARDS,
    SHARD_FORMS,
    SHARD_MARK,
    not_delegable_sql,
)
from metering.db import Kind, probe
from metering.programs import Program
from metering.programs.plpgsql import function_params, result_type

HERE = "metering_shard_forms_here"

# Every table of the shard group of ``accounts``' shards, and every reference table's one shard:
# each shard's table name (``shard_name``), its table's, and the first hash of its range (the
# account's shard and its colocated shards start at the same hash). Citus local tables (on the
# coordinator only) have no such shard and keep their names.
_SHARDS = text(
    "SELECT p.logicalrelid::regclass::text AS table_name, p.partmethod::text AS method, "
    "s.shardid AS shard_id, s.shardminvalue AS first_hash, "
    "shard_name(p.logicalrelid, s.shardid) AS shard_table "
    "FROM pg_dist_partition p JOIN pg_dist_shard s ON s.logicalrelid = p.logicalrelid "
    "WHERE p.partmethod = 'n' OR p.colocationid = (SELECT a.colocationid FROM pg_dist_partition a "
    "WHERE a.logicalrelid = to_regclass('accounts')) ORDER BY s.shardid"
)

# The shard forms and dispatchers made before (their names, bodies and settings), and the
# question.
_MADE = text(
    "SELECT p.oid::regprocedure::text AS signature, p.proname::text AS name, p.prosrc AS body, "
    "coalesce(p.proconfig, '{}') AS config "
    "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = 'public' AND (p.proname::text ~ :made OR p.proname = :here)"
)

# The delegated forms (``…_of_account``) the database holds that ask whether their shard's
# forms are here.
_ASKING = text(
    "SELECT p.proname::text AS name FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = 'public' AND p.proname::text LIKE '%\\_of\\_account' "
    "AND p.prosrc LIKE '%' || :here || '(%'"
)

_MARKED = re.compile(rf"\b([a-z0-9_]+?){re.escape(SHARD_MARK)}")


@dataclass(frozen=True)
class ShardGroup:
    """The account's shard of ``accounts`` and each table's shard in its group, by table."""

    shard_id: int
    tables: Mapping[str, str]


@dataclass
class Made:
    """What one ``make`` did: the functions written and those dropped, by name."""

    written: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def forms() -> Mapping[str, Program]:
    """Each delegated program's shard form, by its delegated form's name: those of the programs
    this process imported, each registered by ``one_account.of_account`` when its module was
    (``metering migrate`` imports them all: metering.functions)."""
    return SHARD_FORMS


def shard_groups(connection: Connection) -> list[ShardGroup]:
    """The cluster's shard groups of ``accounts`` (none when it has no shards yet)."""
    rows = connection.execute(_SHARDS).mappings().all()
    reference = {r["table_name"]: r["shard_table"] for r in rows if r["method"] == "n"}
    by_hash: dict[str, dict[str, str]] = {}
    accounts: dict[str, int] = {}
    for row in rows:
        if row["method"] == "n":
            continue
        by_hash.setdefault(row["first_hash"], {})[row["table_name"]] = row["shard_table"]
        if row["table_name"] == "accounts":
            accounts[row["first_hash"]] = int(row["shard_id"])
    return [
        ShardGroup(shard_id, {**reference, **by_hash[first]})
        for first, shard_id in sorted(accounts.items(), key=lambda item: item[1])
    ]


def shard_form(generic_name: str, group: ShardGroup) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` of a delegated form's shard form for ``group``."""
    program = forms()[generic_name]
    body = program.plpgsql.replace(
        f"FUNCTION {program.name}(", f"FUNCTION {program.name}_{group.shard_id}(", 1
    )
    return _MARKED.sub(lambda found: group.tables.get(found[1], found[1]), body)


def dispatcher(generic_name: str, shard_ids: Sequence[int]) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` of a program's dispatcher over ``shard_ids``: the
    shard form of the shard it is given called, found by halves (``not_delegable``: its plan
    kept); a shard with none refused."""
    program = forms()[generic_name]
    base = program.name.removesuffix(OF_SHARD)
    params = [pair for param in program.params for pair in function_params(param)]
    arguments = ", ".join(name for name, _ in params)
    scalar = program.returned_columns is None

    def call(shard_id: int) -> str:
        made = f"{program.name}_{shard_id}({arguments})"
        if scalar:
            return f"RETURN {made};"
        return f"RETURN QUERY {not_delegable_sql(f'SELECT * FROM {made}')}; RETURN;"

    def halves(ids: Sequence[int], depth: int) -> list[str]:
        pad = "    " * depth
        if len(ids) == 1:
            return [f"{pad}IF p_shard = {ids[0]} THEN {call(ids[0])} END IF;"]
        middle = len(ids) // 2
        return [
            f"{pad}IF p_shard < {ids[middle]} THEN",
            *halves(ids[:middle], depth + 1),
            f"{pad}ELSE",
            *halves(ids[middle:], depth + 1),
            f"{pad}END IF;",
        ]

    signature = ", ".join(f"{name} {kind}" for name, kind in [("p_shard", "BIGINT"), *params])
    return "\n".join(
        [
            f"CREATE OR REPLACE FUNCTION {base}{OF_SHARDS}({signature})",
            f"RETURNS {result_type(program.returns)}",
            "LANGUAGE plpgsql VOLATILE AS $$",
            "BEGIN",
            *(halves(sorted(shard_ids), 1) if shard_ids else []),
            "    RAISE EXCEPTION 'no shard form of this shard' USING DETAIL = 'shard ' || p_shard;",
            "END;",
            "$$",
        ]
    )


def here(shard_ids: Sequence[int]) -> str:
    """``metering_shard_forms_here(shard)``: whether the forms of that shard were made and this
    node holds it (its copy of Citus' metadata, read when asked)."""
    ids = ",".join(str(i) for i in sorted(shard_ids))
    return "\n".join(
        [
            f"CREATE OR REPLACE FUNCTION {HERE}(p_shard BIGINT)",
            "RETURNS BOOLEAN",
            # PL/pgSQL, whose plan each backend keeps: a SQL function's query is parsed and
            # planned at every call (about 170k instructions) unless it is inlined, which its
            # subqueries prevent.
            "LANGUAGE plpgsql STABLE AS $$",
            "BEGIN",
            f"    RETURN p_shard = ANY ('{{{ids}}}'::BIGINT[]) AND EXISTS (",
            "        SELECT 1 FROM pg_dist_placement p WHERE p.shardid = p_shard",
            "        AND p.groupid = (SELECT g.groupid FROM pg_dist_local_group g));",
            "END;",
            "$$",
        ]
    )


def wanted(groups: Sequence[ShardGroup], names: Collection[str] | None = None) -> dict[str, str]:
    """Every function the shard forms take, by name: each program's form of each group, its
    dispatcher, and the question (of the programs ``names`` names, by their delegated forms'
    names; every registered one when None)."""
    ids = [group.shard_id for group in groups]
    functions = {HERE: here(ids)}
    for generic_name, program in forms().items():
        if names is not None and generic_name not in names:
            continue
        base = program.name.removesuffix(OF_SHARD)
        functions[f"{base}{OF_SHARDS}"] = dispatcher(generic_name, ids)
        for group in groups:
            functions[f"{program.name}_{group.shard_id}"] = shard_form(generic_name, group)
    return functions


def make(connection: Connection, groups: Sequence[ShardGroup] | None = None) -> Made:
    """Make the cluster's shard forms what its shards (or ``groups``: none, and every call
    runs through Citus) and the programs say now, in the caller's transaction, on the
    coordinator (Citus propagates each function to every node): each one whose body or
    settings differ written, each one no longer wanted dropped."""
    # Made for the delegated forms the database holds that ask for them: all or none, since
    # they share the question. None ask (a schema older than them, or taken down to nothing):
    # nothing made, every shard form dropped. One this process has no form of (it did not
    # import that program): only the question, which answers no, so every call runs through
    # Citus.
    asking = set(connection.execute(_ASKING, {"here": HERE}).scalars())
    if not asking:
        functions: dict[str, str] = {}
    elif asking - set(forms()):
        functions = {HERE: here([])}
    else:
        groups = shard_groups(connection) if groups is None else groups
        functions = wanted(groups, asking)
    # Every shard form and dispatcher made before, of any program (one renamed, or not
    # imported by this process, included).
    pattern = f"^metering_[a-z0-9_]+({OF_SHARD}_[0-9]+|{OF_SHARDS})$"
    made = {
        row["name"]: (row["signature"], row["body"], list(row["config"]))
        for row in connection.execute(_MADE, {"made": pattern, "here": HERE}).mappings()
    }
    done = Made()
    for name, body in functions.items():
        held = made.get(name)
        if held is not None and (_digest(held[1]), held[2]) == (_digest(_body(body)), config(body)):
            continue
        if held is not None:
            connection.execute(text(f"DROP FUNCTION {held[0]}"))
        connection.exec_driver_sql(body)
        done.written.append(name)
    for name, (signature, _, _) in sorted(made.items()):
        if name not in functions:
            connection.execute(text(f"DROP FUNCTION {signature}"))
            done.dropped.append(name)
    return done


def remake(url: str) -> Made:
    """``make`` on the database at ``url``, when it is a cluster (nothing elsewhere)."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            if probe(connection) is not Kind.CITUS:
                return Made()
            return make(connection)
    finally:
        engine.dispose()


def _body(function: str) -> str:
    """What ``pg_proc.prosrc`` holds of a ``CREATE FUNCTION``: the text between its ``$$``."""
    return function.split("$$", 2)[1]


_SETTING = re.compile(r"^SET (\w+) = (\S+)$", re.MULTILINE)


def config(function: str) -> list[str]:
    """What ``pg_proc.proconfig`` holds of a ``CREATE FUNCTION``: its ``SET`` clauses, each
    ``name=value``, in order."""
    return [f"{name}={value}" for name, value in _SETTING.findall(function.split("$$", 1)[0])]


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()
