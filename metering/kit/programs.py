"""Write transactions defined once, run on both backends.

A **program** is one unit of work written as an ordered list of steps over SQLAlchemy Core
statements: run a statement, fetch a row into variables, sum what a statement returns, collect
rows, branch, loop over rows, emit a result row. The same definition

* runs on SQLite step by step, inside the caller's transaction (``Program.run``), and
* is compiled, with the PostgreSQL dialect, into the body of a PL/pgSQL function
  (``Program.plpgsql``), so that on PostgreSQL the whole unit is one round trip and its row locks
  are held only while the function runs and commits.

Nothing of a rule is typed twice: the statements are Core objects built from the tables, the
control flow is data, and the function text is generated. A migration freezes the generated text
(a function in the database must not change when the code does); a test holds every frozen
function equal to what the current definition produces.

Names. Parameters are ``p_…``, variables ``v_…``: in a statement they are ``bindparam``s (use
``Var.ref``), which the PostgreSQL compiler here writes as the PL/pgSQL name and which SQLite
binds from the program's environment. Every other literal of a statement is written inline in the
function. Rows travel into a program as one JSON document (``Records``): PostgreSQL reads it with
``json_to_recordset``, SQLite with ``json_each``; rows collected by a step (``Rows``) are arrays
in PL/pgSQL and the same JSON on SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import cached_property
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Connection,
    Date,
    DateTime,
    FromClause,
    Integer,
    String,
    Text,
    any_,
    bindparam,
    column,
    exists,
    func,
    literal,
    literal_column,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.expression import Select, UpdateBase
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import TypeEngine

from metering.models.base import UTCDateTime

BackendName = Literal["postgresql", "sqlite"]


# -- Portable expressions ------------------------------------------------------------------------


class byte_order(ColumnElement[Any]):
    """A text column compared in byte order (``COLLATE "C"``): SQLite's default collation."""

    inherit_cache = True
    # Its element is part of its cache key: without it, SQLAlchemy cannot cache any statement
    # holding one, and compiled them afresh at every execution (SQLite's check-and-hold: ~5 ms).
    _traverse_internals = [("element", InternalTraversal.dp_clauseelement)]

    def __init__(self, element: ColumnElement[Any]) -> None:
        self.element = element
        self.type = element.type


@compiles(byte_order, "postgresql")
def _byte_order_postgresql(element: byte_order, compiler: Any, **kw: Any) -> str:
    return f'{compiler.process(element.element, **kw)} COLLATE "C"'


@compiles(byte_order)
def _byte_order_default(element: byte_order, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.element, **kw))


class greatest(FunctionElement[Any]):
    """The larger of two values (SQLite's two-argument ``max``)."""

    inherit_cache = True
    name = "greatest"


@compiles(greatest)
def _greatest_default(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


class json_row(FunctionElement[Any]):
    """A JSON array of the values, in order (``json_build_array`` / SQLite's ``json_array``)."""

    inherit_cache = True
    name = "json_build_array"
    type = Text()


@compiles(json_row)
def _json_row_default(element: json_row, compiler: Any, **kw: Any) -> str:
    return f"json_build_array({compiler.process(element.clauses, **kw)})"


@compiles(json_row, "sqlite")
def _json_row_sqlite(element: json_row, compiler: Any, **kw: Any) -> str:
    return f"json_array({compiler.process(element.clauses, **kw)})"


# -- Variables and rows --------------------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """A parameter (``p_…``) or variable (``v_…``) of a program."""

    name: str
    type: TypeEngine[Any]

    def __post_init__(self) -> None:
        assert self.name.startswith(("p_", "v_")), self.name

    @property
    def ref(self) -> BindParameter[Any]:
        return bindparam(self.name, type_=self.type)


RowColumns = Sequence[tuple[str, TypeEngine[Any]]]


@dataclass(frozen=True)
class Records:
    """A parameter holding rows (a JSON array of objects), read as a relation with the given
    columns and ``position`` (the row's place in the array, from 0)."""

    name: str
    columns: RowColumns

    def __post_init__(self) -> None:
        assert self.name.startswith("p_"), self.name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)


@dataclass(frozen=True)
class Rows:
    """A variable holding rows that a ``Collect`` step gathered (in its statement's order)."""

    name: str
    columns: RowColumns

    def __post_init__(self) -> None:
        assert self.name.startswith("v_"), self.name

    def array(self, column_name: str) -> str:
        return f"{self.name}_{column_name}"


class Backend:
    """What differs between the backends, for statement builders: how rows are read, and
    whether an ``INSERT … SELECT`` may read a CTE of its own statement (``inserts_from_ctes``),
    so that one statement writes several tables from rows it computes once."""

    def __init__(self, name: BackendName, inserts_from_ctes: bool | None = None) -> None:
        self.name = name
        self.inserts_from_ctes = (
            name == "postgresql" if inserts_from_ctes is None else inserts_from_ctes
        )

    @property
    def dialect(self) -> Any:
        return _PG_DIALECT if self.name == "postgresql" else _SQLITE_DIALECT

    def insert(self, table: Any) -> Any:
        """The dialect's ``INSERT`` (with ``on_conflict_do_nothing``/``_do_update``)."""
        return postgresql.insert(table) if self.name == "postgresql" else sqlite.insert(table)

    def utc_date(self, at: Any) -> ColumnElement[Any]:
        """The UTC day (a ``DATE``) of the time ``at``: on SQLite, whose times are UTC texts,
        their date part."""
        if self.name == "postgresql":
            return func.timezone("UTC", at).cast(Date)
        return type_coerce(func.date(at), Date())

    def records(self, records: Records, alias: str) -> FromClause:
        """``records`` as a relation: its columns and ``position``."""
        if self.name == "postgresql":
            types = ", ".join(f"{n} {_pg_type(t)}" for n, t in records.columns)
            names = ", ".join(records.names)
            sql = (
                f"SELECT * FROM ROWS FROM (json_to_recordset(CAST(:{records.name} AS json)) "
                f"AS ({types})) WITH ORDINALITY AS t({names}, position)"
            )
            columns = [column(n, t) for n, t in records.columns]
            return text(sql).columns(*columns, column("position", BigInteger)).subquery(alias)
        return self._json_rows(bindparam(records.name, type_=Text), records.columns, alias)

    def rows(self, rows: Rows, alias: str) -> FromClause:
        """Collected ``rows`` as a relation (its columns, in collection order)."""
        if self.name == "postgresql":
            arrays = [bindparam(rows.array(n), type_=postgresql.ARRAY(t)) for n, t in rows.columns]
            return (
                func.unnest(*arrays)
                .table_valued(*(column(n, t) for n, t in rows.columns))
                .render_derived()
                .alias(alias)
            )
        return self._json_rows(bindparam(rows.name, type_=Text), rows.columns, alias)

    def constants(
        self, columns: RowColumns, values: Sequence[tuple[Any, ...]], alias: str
    ) -> FromClause:
        """Constant rows (text or integer values) as a relation with ``columns``: on PostgreSQL
        one ``unnest`` of array literals, on SQLite ``json_each`` of a JSON literal."""
        if self.name == "postgresql":
            arrays = [
                postgresql.array([literal(row[index], kind) for row in values])
                for index, (_, kind) in enumerate(columns)
            ]
            return (
                func.unnest(*arrays)
                .table_valued(*(column(n, t) for n, t in columns))
                .render_derived()
                .alias(alias)
            )
        document = json.dumps(
            [dict(zip((n for n, _ in columns), row, strict=True)) for row in values]
        )
        return self._json_rows(literal(document, Text()), columns, alias)

    def last(self, rows: Rows, column_name: str) -> ColumnElement[Any]:
        """``column_name`` of the last row ``rows`` holds (NULL when none), as a plain expression:
        no query (PL/pgSQL evaluates it on its fast path, where ``max`` over the rows would be a
        statement of its own). Collect the rows ordered by that column to get its largest."""
        kind = dict(rows.columns)[column_name]
        if self.name == "postgresql":
            array = bindparam(rows.array(column_name), type_=postgresql.ARRAY(kind))
            return type_coerce(array[func.cardinality(array)], kind)
        path = f"$[#-1].{column_name}"
        return type_coerce(func.json_extract(bindparam(rows.name, type_=Text), path), kind)

    def count(self, rows: Rows) -> ColumnElement[int]:
        """How many rows ``rows`` holds."""
        if self.name == "postgresql":
            first = rows.array(rows.columns[0][0])
            array = bindparam(first, type_=postgresql.ARRAY(rows.columns[0][1]))
            return func.coalesce(func.cardinality(array), 0)
        return type_coerce(func.json_array_length(bindparam(rows.name, type_=Text)), Integer)

    def holds_any(self, rows: Rows, column_name: str, value: Any) -> ColumnElement[bool]:
        """Whether some row of ``rows`` has ``value`` in ``column_name``. On PostgreSQL a plain
        expression over the collected array (``value = ANY (…)``), which PL/pgSQL evaluates on
        its fast path: a condition on collected rows without a statement of its own."""
        kind = dict(rows.columns)[column_name]
        if self.name == "postgresql":
            array = bindparam(rows.array(column_name), type_=postgresql.ARRAY(kind))
            return literal(value, kind) == any_(array)
        found = self._json_rows(bindparam(rows.name, type_=Text), rows.columns, "held")
        return exists().where(found.c[column_name] == literal(value, kind))

    @staticmethod
    def _json_rows(param: ColumnElement[Any], columns: RowColumns, alias: str) -> FromClause:
        each = func.json_each(param).table_valued("key", "value")
        return select(
            type_coerce(each.c.key, BigInteger).label("position"),
            *(
                type_coerce(func.json_extract(each.c.value, f"$.{name}"), kind).label(name)
                for name, kind in columns
            ),
        ).subquery(alias)


POSTGRESQL, SQLITE = Backend("postgresql"), Backend("sqlite")
# PostgreSQL as a Citus cluster's one-account forms run it (``Program.of_account``), each
# statement meant for the account's shard alone. Citus sends no ``INSERT … SELECT`` that reads a
# CTE to a shard whole: it runs each CTE (and each subquery it cannot send with the insert)
# first, as a query of its own, and copies its rows to every node of the cluster (its planner
# cannot tell which nodes such an insert will need them on: intermediate_result_pruning.c,
# ``SUBPLAN_ACCESS_ANYWHERE``), so that statement's transaction spans every node. There, as on
# SQLite, an insert reads no CTE: it returns what it wrote, and the updates that follow read
# that.
ONE_SHARD = Backend("postgresql", inserts_from_ctes=False)


def backend(name: str) -> Backend:
    return POSTGRESQL if name == "postgresql" else SQLITE


# -- Steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Execute a statement (a SELECT is run for its locks: PL/pgSQL's PERFORM)."""

    statement: ClauseElement


@dataclass(frozen=True)
class Fetch:
    """The statement's first row into variables (NULLs when there is none); with
    ``required``, no row is an error with that message."""

    statement: ClauseElement
    into: tuple[Var, ...]
    required: str | None = None


@dataclass(frozen=True)
class Sum:
    """The sum of one column over the rows a statement returns (0 for none): e.g. what an
    ``UPDATE … RETURNING`` released; with ``count``, how many rows it returned as well."""

    statement: UpdateBase
    column: str
    into: Var
    count: Var | None = None


@dataclass(frozen=True)
class Assign:
    into: Var
    expression: ColumnElement[Any]


@dataclass(frozen=True)
class Collect:
    """The rows a statement returns (a SELECT or DML with RETURNING), in ``order_by`` order
    (column names of ``into``), kept in ``into`` for later statements (``Backend.rows``); with
    ``largest``, the largest value of that column among them into that variable as well (NULL
    for no row), in the same statement. Order only what a later step needs in order: each
    ordered column is a sort of its own on PostgreSQL. A SELECT whose CTEs write (an ``INSERT …
    RETURNING`` as a CTE) keeps them at the top of the statement, as PostgreSQL requires."""

    statement: ClauseElement
    into: Rows
    order_by: tuple[str, ...] = ()
    largest: tuple[str, Var] | None = None


@dataclass(frozen=True)
class When:
    condition: ColumnElement[bool]
    then: tuple[Step, ...]
    otherwise: tuple[Step, ...] = ()


@dataclass(frozen=True)
class ForEach:
    """For each row of a SELECT, its columns into ``into``, then ``steps``."""

    statement: Select[Any]
    into: tuple[Var, ...]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Emit:
    """A result row of a set-returning program (one value per result column)."""

    values: tuple[ColumnElement[Any], ...]


@dataclass(frozen=True)
class Return:
    """The result of a scalar program; ends it."""

    value: ColumnElement[Any]


Step = Run | Fetch | Sum | Assign | Collect | When | ForEach | Emit | Return


@dataclass
class Program:
    """A unit of work: ``name`` is its PostgreSQL function; ``returns`` its result columns (a
    set-returning program, rows emitted by ``Emit``), one type (a scalar ``Return``), or None;
    ``build`` makes its steps for a backend."""

    name: str
    params: tuple[Var | Records, ...]
    build: Callable[[Backend], Sequence[Step]]
    returns: RowColumns | TypeEngine[Any] | None = None
    initial: Mapping[str, Any] = field(default_factory=dict)  # variables' starting values
    # PostgreSQL settings in force while the function runs (its ``SET`` clauses), e.g. the plan
    # cache's mode: nothing SQLite interprets.
    settings: Mapping[str, str] = field(default_factory=dict)
    # The one-account form's scope (``of_account``): each sharded table's name and the column
    # it is sharded by; None for the program as written.
    scope: Mapping[str, str] | None = None

    def of_account(
        self,
        account: Var,
        scope: Mapping[str, str],
        first: Sequence[Step] = (),
        settings: Mapping[str, str] | None = None,
    ) -> Program:
        """The same program for one account's rows (a Citus cluster's form, CONTRACT §13):
        ``account`` first among its parameters (the argument the cluster sends each call to the
        node holding that account by), and every read and write of a table of ``scope`` limited
        to that account's rows, so each statement touches the account's shard only. Its callers
        pass rows of that account alone: the limit then changes no result. Its statements are
        built for ``ONE_SHARD``. ``first``: steps the form takes before the program's;
        ``settings``: the form's own (the program's when None)."""
        build, before = self.build, tuple(first)
        return Program(
            f"{self.name}_of_account",
            params=(account, *self.params),
            build=(lambda on: (*before, *build(on))) if before else build,
            returns=self.returns,
            initial=self.initial,
            settings=self.settings if settings is None else settings,
            scope=dict(scope),
        )

    def steps(self, on: Backend) -> tuple[Step, ...]:
        cache = self.__dict__.setdefault("_steps", {})
        if on not in cache:
            cache[on] = tuple(on_steps for on_steps in self.build(on))
        steps: tuple[Step, ...] = cache[on]
        return steps

    # -- PostgreSQL ------------------------------------------------------------------------------

    @cached_property
    def plpgsql(self) -> str:
        """``CREATE OR REPLACE FUNCTION …``: the program as PL/pgSQL."""
        steps = self.steps(POSTGRESQL if self.scope is None else ONE_SHARD)
        dialect = _PG_DIALECT if self.scope is None else _scoped_dialect(self)
        declared: dict[str, str] = {}
        for name, kind in _declarations(steps):
            declared.setdefault(name, kind)
        for param in self.params:
            declared.pop(param.name, None)
        params = ", ".join(
            f"{p.name} {'json' if isinstance(p, Records) else _pg_type(p.type)}"
            for p in self.params
        )
        if self.returns is None:
            returns = "void"
        elif isinstance(self.returns, TypeEngine):
            returns = _pg_type(self.returns)
        else:
            returns = "TABLE (" + ", ".join(f"{n} {_pg_type(t)}" for n, t in self.returns) + ")"
        lines = [
            f"CREATE OR REPLACE FUNCTION {self.name}({params})",
            f"RETURNS {returns}",
            *(
                ("LANGUAGE plpgsql VOLATILE AS $$",)
                if not self.settings
                else (
                    "LANGUAGE plpgsql VOLATILE",
                    *(f"SET {name} = {value}" for name, value in self.settings.items()),
                    "AS $$",
                )
            ),
            "#variable_conflict use_column",
        ]
        if declared:
            lines.append("DECLARE")
            for name, kind in declared.items():
                initial = self.initial.get(name)
                default = "" if initial is None else f" := {_pg_literal(initial)}"
                lines.append(f"    {name} {kind}{default};")
        lines.append("BEGIN")
        lines += _render(steps, self, 1, dialect)
        lines.append("END;")
        lines.append("$$")
        return "\n".join(lines) + "\n"

    @cached_property
    def call_sql(self) -> str:
        """The call, as psycopg text with ``%(p_…)s`` parameters."""
        args = ", ".join(
            f"%({p.name})s::{'json' if isinstance(p, Records) else _pg_type(p.type)}"
            for p in self.params
        )
        if self.returns is None or isinstance(self.returns, TypeEngine):
            return f"SELECT {self.name}({args})"
        return f"SELECT * FROM {self.name}({args})"

    # -- SQLite ----------------------------------------------------------------------------------

    def run(self, connection: Connection, **params: Any) -> Any:
        """Run the steps inside the caller's transaction: the emitted rows (set-returning), the
        returned value (scalar) or None."""
        steps = self.steps(SQLITE)
        env: dict[str, Any] = dict.fromkeys(_variables(steps))
        env.update({p.name: params[p.name] for p in self.params})
        env.update(self.initial)
        output: list[tuple[Any, ...]] = []
        try:
            _interpret(steps, connection, env, output)
        except _Returned as returned:
            return returned.value
        if isinstance(self.returns, TypeEngine):
            return None
        return output if self.returns is not None else None


def records_json(records: Records, rows: Iterable[Mapping[str, Any]], on: Backend) -> str:
    """Rows (mappings with ``records``' columns) as the JSON a program takes; timestamps as the
    backend stores them."""
    encode = _encode_pg if on.name == "postgresql" else _encode_sqlite
    return _rows_json(records.columns, rows, encode)


def _rows_json(
    columns: RowColumns, rows: Iterable[Mapping[str, Any]], encode: Callable[[Any], Any]
) -> str:
    names = [name for name, _ in columns]
    return json.dumps(
        [{name: encode(row[name]) for name in names} for row in rows],
        separators=(",", ":"),
        allow_nan=False,
    )


def records_encoder(
    records: Records, on: Backend, *, verbatim: Iterable[str] = ()
) -> Callable[[Iterable[Mapping[str, Any]]], str]:
    """A fast writer of exactly the JSON ``records_json`` writes, for a hot caller: the text
    of each row is one %-format (generated once from the columns), every distinct string of a
    document JSON-encoded once. ``verbatim``: text columns whose values never need escaping
    (checked against a pattern before they get here)."""
    verbatim = set(verbatim)
    parts, values = [], []
    for name, kind in records.columns:
        key = json.dumps(name)
        if isinstance(kind, DateTime | UTCDateTime):
            parts.append(f'{key}:"%s"')
            if on.name == "postgresql":
                values.append(f"_pg_stamp(row[{name!r}])")
            else:
                values.append(f"_sqlite_stamp(row[{name!r}])")
        elif name in verbatim:
            parts.append(f'{key}:"%s"')
            values.append(f"row[{name!r}]")
        elif isinstance(kind, String):
            parts.append(f"{key}:%s")
            values.append(f"quoted[row[{name!r}]]")
        elif isinstance(kind, Boolean):
            parts.append(f"{key}:%s")
            values.append(f"_BOOLEANS[row[{name!r}]]")
        else:
            parts.append(f"{key}:%s")
            values.append(f"_number(row[{name!r}])")
    template = "{" + ",".join(parts) + "}"
    source = (
        "def encode(rows):\n"
        "    quoted = _Quoted()\n"
        f"    rendered = [{template!r} % ({', '.join(values)},) for row in rows]\n"
        "    return '[' + ','.join(rendered) + ']'\n"
    )
    namespace: dict[str, Any] = {
        "_Quoted": _Quoted,
        "_pg_stamp": _pg_stamp,
        "_sqlite_stamp": _sqlite_stamp,
        "_BOOLEANS": {True: "true", False: "false", None: "null"},
        "_number": _number,
    }
    exec(source, namespace)
    encode: Callable[[Iterable[Mapping[str, Any]]], str] = namespace["encode"]
    return encode


class _Quoted(dict[Any, str]):
    """JSON text of a string (or null), encoded once per distinct value of a document."""

    def __missing__(self, value: Any) -> str:
        quoted = self[value] = json.dumps(value)
        return quoted


def _number(value: int | None) -> str:
    if value is None:
        return "null"
    assert type(value) is int, value  # never a float, never a bool
    return str(value)


def _pg_stamp(value: datetime) -> str:
    if value.tzinfo is None:
        raise ValueError("UTCDateTime needs an aware datetime")
    return value.isoformat()


def _encode_pg(value: Any) -> Any:
    if isinstance(value, datetime):
        return _pg_stamp(value)
    if isinstance(value, date):
        return value.isoformat()
    return value


def _sqlite_stamp(value: datetime) -> str:
    """UTCDateTime's SQLite form: naive UTC in SQLAlchemy's storage format (years of 4 digits,
    year 1 included)."""
    if value.tzinfo is None:
        raise ValueError("UTCDateTime needs an aware datetime")
    v = value.astimezone(UTC)
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d} "
        f"{v.hour:02d}:{v.minute:02d}:{v.second:02d}.{v.microsecond:06d}"
    )


def _encode_sqlite(value: Any) -> Any:
    if isinstance(value, datetime):
        return _sqlite_stamp(value)
    if isinstance(value, date):
        return value.isoformat()
    return value


def psycopg_text(statement: ClauseElement) -> str:
    """A Core statement as PostgreSQL text with ``%(name)s`` parameters, for the driver: built
    once at import, so a hot path neither compiles nor looks up a compiled form (SQLAlchemy's
    execution layer costs about 70 µs of Python per statement, twice the driver's own)."""
    return str(statement.compile(dialect=_PSYCOPG_DIALECT))


# -- PL/pgSQL generation -------------------------------------------------------------------------


class _PlpgsqlCompiler(PGCompiler_psycopg):
    """Variables as their PL/pgSQL names, every other bound value as a literal."""

    def visit_bindparam(self, bindparam: Any, **kw: Any) -> Any:  # type: ignore[override]
        if bindparam.key.startswith(("p_", "v_")):
            return bindparam.key
        kw["literal_binds"] = True
        return super().visit_bindparam(bindparam, **kw)


class _PlpgsqlDialect(PGDialect_psycopg):
    statement_compiler = _PlpgsqlCompiler


class _PsycopgCompiler(PGCompiler_psycopg):
    """Named parameters as ``%(name)s``, values written in the statement as literals."""

    def visit_bindparam(self, bindparam: Any, **kw: Any) -> Any:  # type: ignore[override]
        if bindparam.unique:
            kw["literal_binds"] = True
        return super().visit_bindparam(bindparam, **kw)


class _PsycopgDialect(PGDialect_psycopg):
    statement_compiler = _PsycopgCompiler


_PG_DIALECT = _PlpgsqlDialect(paramstyle="named")
_SQLITE_DIALECT = sqlite.dialect()
_PSYCOPG_DIALECT = _PsycopgDialect()


class _AccountScoped(PGCompiler_psycopg):
    """A compiler mixin for one account's statements (``Program.of_account``,
    ``psycopg_text_of_account``): every table of the dialect's ``scope`` read in a FROM is read
    as ``(SELECT * FROM t WHERE t.<column> = <account>)`` under its own name (or alias), and
    every UPDATE or DELETE of one is limited to the account's rows. A restriction on the
    sharding column of every sharded table the statement names is what lets a Citus cluster
    send it, whole, to the one shard that holds the account (its "router" plans); outer joins
    keep their meaning, as the limit sits inside the joined relation."""

    dialect: Any

    def _account_rows(self, table: Any, **kw: Any) -> str | None:
        column = self.dialect.scope.get(table.name)
        if column is None:
            return None
        name = self.preparer.quote(table.name)
        account = self.process(self.dialect.account.ref, **kw)
        return f"(SELECT * FROM {name} WHERE {name}.{self.preparer.quote(column)} = {account})"

    def visit_table(  # type: ignore[override]
        self,
        table: Any,
        asfrom: bool = False,
        iscrud: bool = False,
        enclosing_alias: Any = None,
        **kw: Any,
    ) -> str:
        rendered = super().visit_table(
            table, asfrom=asfrom, iscrud=iscrud, enclosing_alias=enclosing_alias, **kw
        )
        if not asfrom or iscrud:
            return str(rendered)
        limited = self._account_rows(table)
        if limited is None:
            return str(rendered)
        if enclosing_alias is not None and enclosing_alias.element is table:
            return limited  # the alias names it
        return f"{limited} AS {self.preparer.quote(table.name)}"

    def _limited(self, statement: Any) -> Any:
        column = self.dialect.scope.get(statement.table.name)
        if column is None:
            return statement
        return statement.where(statement.table.c[column] == self.dialect.account.ref)

    def visit_update(self, update_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        return str(super().visit_update(self._limited(update_stmt), **kw))

    def visit_delete(self, delete_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        return str(super().visit_delete(self._limited(delete_stmt), **kw))


class _ScopedPlpgsqlCompiler(_AccountScoped, _PlpgsqlCompiler):
    pass


class _ScopedPsycopgCompiler(_AccountScoped, _PsycopgCompiler):
    pass


class _ScopedPlpgsqlDialect(PGDialect_psycopg):
    statement_compiler = _ScopedPlpgsqlCompiler

    def __init__(self, account: Var, scope: Mapping[str, str]) -> None:
        super().__init__(paramstyle="named")
        self.account, self.scope = account, dict(scope)


class _ScopedPsycopgDialect(PGDialect_psycopg):
    statement_compiler = _ScopedPsycopgCompiler

    def __init__(self, account: Var, scope: Mapping[str, str]) -> None:
        super().__init__()
        self.account, self.scope = account, dict(scope)


def _scoped_dialect(program: Program) -> Any:
    account = program.params[0]
    assert isinstance(account, Var) and program.scope is not None
    return _ScopedPlpgsqlDialect(account, program.scope)


def psycopg_text_of_account(
    statement: ClauseElement, account: Var, scope: Mapping[str, str]
) -> str:
    """``psycopg_text`` of the statement for one account's rows (see ``_AccountScoped``): the
    account is its ``%(<account.name>)s`` parameter."""
    return str(statement.compile(dialect=_ScopedPsycopgDialect(account, scope)))


def psycopg_compiled_of_account(
    statement: ClauseElement, account: Var, scope: Mapping[str, str]
) -> Any:
    """``psycopg_text_of_account`` compiled, with the statement's own bound values
    (``.params``): for statements built per call (a limit, a list of ids, each rendered as a
    parameter of its own)."""
    return statement.compile(
        dialect=_ScopedPsycopgDialect(account, scope),
        compile_kwargs={"render_postcompile": True},
    )


def _pg_type(kind: TypeEngine[Any]) -> str:
    return str(_PG_DIALECT.type_compiler_instance.process(kind))


def _pg_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no literal for {value!r}")


def _declarations(steps: Iterable[Step]) -> Iterable[tuple[str, str]]:
    for step in steps:
        targets: tuple[Var, ...] = ()
        if isinstance(step, Fetch | ForEach):
            targets = step.into
        elif isinstance(step, Assign):
            targets = (step.into,)
        elif isinstance(step, Sum):
            targets = (step.into,) if step.count is None else (step.into, step.count)
        elif isinstance(step, Collect):
            for name, kind in step.into.columns:
                yield step.into.array(name), f"{_pg_type(kind)}[]"
            if step.largest is not None:
                targets = (step.largest[1],)
        for target in targets:
            yield target.name, _pg_type(target.type)
        if isinstance(step, When):
            yield from _declarations(step.then)
            yield from _declarations(step.otherwise)
        elif isinstance(step, ForEach):
            yield from _declarations(step.steps)


def _variables(steps: Iterable[Step]) -> Iterable[str]:
    """The names a program's steps assign (SQLite's environment; Rows as one JSON text)."""
    for step in steps:
        if isinstance(step, Fetch | ForEach):
            yield from (target.name for target in step.into)
        elif isinstance(step, Sum | Assign | Collect):
            yield step.into.name
            if isinstance(step, Sum) and step.count is not None:
                yield step.count.name
            if isinstance(step, Collect) and step.largest is not None:
                yield step.largest[1].name
        if isinstance(step, When):
            yield from _variables(step.then)
            yield from _variables(step.otherwise)
        elif isinstance(step, ForEach):
            yield from _variables(step.steps)


def _indent(text_: str, depth: int) -> list[str]:
    pad = "    " * depth
    return [(pad + line).rstrip() for line in text_.splitlines()]


def _render(steps: Iterable[Step], program: Program, depth: int, dialect: Any) -> list[str]:
    def _sql(element: ClauseElement) -> str:
        return str(element.compile(dialect=dialect))

    lines: list[str] = []
    for step in steps:
        if isinstance(step, Run):
            sql = _sql(step.statement)
            if isinstance(step.statement, Select):
                assert sql.startswith("SELECT "), sql
                sql = "PERFORM " + sql[len("SELECT ") :]
            lines += _indent(sql + ";", depth)
        elif isinstance(step, Fetch):
            into = ", ".join(v.name for v in step.into)
            lines += _indent(f"{_sql(step.statement)}\nINTO {into};", depth)
            if step.required is not None:
                message = step.required.replace("'", "''")
                lines += _indent(
                    f"IF NOT FOUND THEN\n    RAISE EXCEPTION '{message}';\nEND IF;", depth
                )
        elif isinstance(step, Sum):
            counted = "" if step.count is None else ", count(*)"
            into = step.into.name if step.count is None else f"{step.into.name}, {step.count.name}"
            sql = (
                f"WITH summed AS (\n{_sql(step.statement)}\n)\n"
                f"SELECT coalesce(sum(summed.{step.column}), 0){counted} INTO {into} FROM summed;"
            )
            lines += _indent(sql, depth)
        elif isinstance(step, Assign):
            lines += _indent(f"{step.into.name} := {_sql(step.expression)};", depth)
        elif isinstance(step, Collect):
            kinds = dict(step.into.columns)
            order = ", ".join(
                f'collected.{name} COLLATE "C"'
                if isinstance(kinds[name], String)
                else f"collected.{name}"
                for name in step.order_by
            )
            order_by = f" ORDER BY {order}" if order else ""
            aggregates = ", ".join(
                f"array_agg(collected.{name}{order_by})" for name, _ in step.into.columns
            )
            into = ", ".join(step.into.array(name) for name, _ in step.into.columns)
            if step.largest is not None:
                aggregates += f", max(collected.{step.largest[0]})"
                into += f", {step.largest[1].name}"
            source = _sql(step.statement)
            if source.startswith("WITH "):
                # Its CTEs may write, and a CTE that writes must be at the top: the statement
                # read as a subquery (a SELECT) or a CTE (DML), the compiler putting every CTE
                # at the top, and INTO at the end.
                assert not step.order_by and step.largest is None
                collected = (
                    step.statement.subquery("collected")
                    if isinstance(step.statement, Select)
                    else step.statement.cte("collected")  # type: ignore[attr-defined]
                )
                wrapped: Any = select(
                    *(
                        func.array_agg(literal_column(f"collected.{name}"))
                        for name, _ in step.into.columns
                    )
                ).select_from(collected)
                sql = f"{_sql(wrapped)}\nINTO {into};"
            elif isinstance(step.statement, Select):
                sql = f"SELECT {aggregates} INTO {into}\nFROM (\n{source}\n) AS collected;"
            else:
                sql = (
                    f"WITH collected AS (\n{source}\n)\n"
                    f"SELECT {aggregates} INTO {into} FROM collected;"
                )
            lines += _indent(sql, depth)
        elif isinstance(step, When):
            lines += _indent(f"IF {_sql(step.condition)} THEN", depth)
            lines += _render(step.then, program, depth + 1, dialect)
            if step.otherwise:
                lines += _indent("ELSE", depth)
                lines += _render(step.otherwise, program, depth + 1, dialect)
            lines += _indent("END IF;", depth)
        elif isinstance(step, ForEach):
            into = ", ".join(v.name for v in step.into)
            lines += _indent(f"FOR {into} IN\n{_sql(step.statement)}\nLOOP", depth)
            lines += _render(step.steps, program, depth + 1, dialect)
            lines += _indent("END LOOP;", depth)
        elif isinstance(step, Emit):
            assert isinstance(program.returns, Sequence) and not isinstance(
                program.returns, TypeEngine
            )
            for (name, _), value in zip(program.returns, step.values, strict=True):
                lines += _indent(f"{name} := {_sql(value)};", depth)
            lines += _indent("RETURN NEXT;", depth)
        elif isinstance(step, Return):
            lines += _indent(f"RETURN {_sql(step.value)};", depth)
        else:  # pragma: no cover - the Step union is closed
            raise TypeError(step)
    return lines


# -- SQLite interpretation -----------------------------------------------------------------------


class _Returned(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


class ProgramError(RuntimeError):
    """A ``Fetch`` with ``required`` found no row (PostgreSQL raises the same message)."""


def _value(connection: Connection, expression: ColumnElement[Any], env: dict[str, Any]) -> Any:
    if isinstance(expression, BindParameter) and expression.key in env:
        return env[expression.key]
    return connection.execute(select(expression), env).scalar()


def _interpret(
    steps: Iterable[Step],
    connection: Connection,
    env: dict[str, Any],
    output: list[tuple[Any, ...]],
) -> None:
    for step in steps:
        if isinstance(step, Run):
            connection.execute(step.statement, env)  # type: ignore[call-overload]
        elif isinstance(step, Fetch):
            row = connection.execute(step.statement, env).first()  # type: ignore[call-overload]
            if row is None and step.required is not None:
                raise ProgramError(step.required)
            for index, target in enumerate(step.into):
                env[target.name] = None if row is None else row[index]
        elif isinstance(step, Sum):
            values = [getattr(row, step.column) for row in connection.execute(step.statement, env)]
            env[step.into.name] = sum(values)
            if step.count is not None:
                env[step.count.name] = len(values)
        elif isinstance(step, Assign):
            env[step.into.name] = _value(connection, step.expression, env)
        elif isinstance(step, Collect):
            result = connection.execute(step.statement, env)  # type: ignore[call-overload]
            names = [name for name, _ in step.into.columns]
            rows = [dict(zip(names, row, strict=False)) for row in result]
            if step.order_by:
                rows.sort(key=lambda row: tuple(row[name] for name in step.order_by))
            env[step.into.name] = _rows_json(step.into.columns, rows, _encode_sqlite)
            if step.largest is not None:
                values = [row[step.largest[0]] for row in rows if row[step.largest[0]] is not None]
                env[step.largest[1].name] = max(values) if values else None
        elif isinstance(step, When):
            chosen = step.then if _value(connection, step.condition, env) else step.otherwise
            _interpret(chosen, connection, env, output)
        elif isinstance(step, ForEach):
            for row in connection.execute(step.statement, env).all():
                for index, target in enumerate(step.into):
                    env[target.name] = row[index]
                _interpret(step.steps, connection, env, output)
        elif isinstance(step, Emit):
            output.append(tuple(_value(connection, value, env) for value in step.values))
        elif isinstance(step, Return):
            raise _Returned(_value(connection, step.value, env))
        else:  # pragma: no cover
            raise TypeError(step)


__all__ = [
    "ONE_SHARD",
    "POSTGRESQL",
    "SQLITE",
    "Assign",
    "Backend",
    "Boolean",
    "Collect",
    "Emit",
    "Fetch",
    "ForEach",
    "Program",
    "ProgramError",
    "Records",
    "Return",
    "Rows",
    "Run",
    "Step",
    "Sum",
    "Var",
    "When",
    "backend",
    "byte_order",
    "greatest",
    "json_row",
    "psycopg_text",
    "psycopg_text_of_account",
    "records_encoder",
    "records_json",
]
