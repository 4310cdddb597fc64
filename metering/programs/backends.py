"""The backends a program's statements are built for, and the one place where they differ.

A program's ``build`` is called with a ``Backend`` and returns its steps for it. There are three:

* ``SQLITE``: the steps interpreted one by one (metering.programs.sqlite);
* ``POSTGRESQL``: the steps as one PL/pgSQL function (metering.programs.plpgsql);
* ``ONE_SHARD``: PostgreSQL as a Citus cluster's one-account programs run it
  (metering.citus.one_account), each statement meant for the account's shard alone.

The backend's primitives (how rows are read, an upsert, a UTC date) are its methods. Where a
definition itself must differ, it says so with ``Backend.choose``: one value per backend, named
by backend, each with the reason in a comment beside it, never an ``if`` on a backend's name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
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
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite

from metering.kit import records as rows_text
from metering.models.base import UTCDateTime
from metering.programs.plpgsql import array_type, pg_type
from metering.programs.steps import Records, RowColumns, Rows

T = TypeVar("T")


class Form(Enum):
    POSTGRESQL = "postgresql"
    SQLITE = "sqlite"
    ONE_SHARD = "one_shard"


@dataclass(frozen=True)
class Backend:
    """What a program's statements are built for: ``form``, one of the three above."""

    form: Form

    @property
    def name(self) -> Literal["postgresql", "sqlite"]:
        """The SQL dialect of its statements."""
        return "sqlite" if self.form is Form.SQLITE else "postgresql"

    def choose(self, *, postgresql: T, sqlite: T, one_shard: T | None = None) -> T:
        """The one fork of a program's definition: its value on PostgreSQL, on SQLite, and, where
        it differs from PostgreSQL's, on a Citus shard (``one_shard``). A value may be a step,
        steps, an expression, or a function building them (called on what is chosen)."""
        if self.form is Form.SQLITE:
            return sqlite
        if self.form is Form.ONE_SHARD and one_shard is not None:
            return one_shard
        return postgresql

    @property
    def time_text(self) -> rows_text.TimeText:
        """How a time is written in the rows a program takes (metering.kit.records)."""
        return rows_text.postgresql_time if self.name == "postgresql" else rows_text.sqlite_time

    def insert(self, table: Any) -> Any:
        """The dialect's ``INSERT`` (with ``on_conflict_do_nothing``/``_do_update``)."""
        return postgresql.insert(table) if self.name == "postgresql" else sqlite.insert(table)

    def utc_date(self, at: Any) -> ColumnElement[Any]:
        """The UTC day (a ``DATE``) of the time ``at``: on SQLite, whose times are UTC texts,
        their date part."""
        if self.name == "postgresql":
            return func.timezone("UTC", at).cast(Date)
        return type_coerce(func.date(at), Date())

    def records(
        self, records: Records, alias: str, only: Sequence[str] | None = None
    ) -> FromClause:
        """``records`` as a relation: its columns and ``position``; on PostgreSQL from its JSON
        document, or from its arrays (``by_column``: each scanned apart, so ``only`` those
        columns, when given, are unnested)."""
        read = _only(records.columns, only)
        if self.name == "postgresql":
            if records.by_column:
                # Each array unnested in the select list, all in step (a ProjectSet), not in
                # FROM: a function scan of several arrays first copies every row into a
                # tuplestore (docs/performance.md, "A batch per event").
                arrays = [f"CAST(:{records.column_param(n)} AS {array_type(t)})" for n, t in read]
                listed = ", ".join(
                    f"unnest({a}) AS {n}" for a, (n, _) in zip(arrays, read, strict=True)
                )
                numbered = f"generate_series(CAST(1 AS BIGINT), cardinality({arrays[0]}))"
                sql = f"SELECT {listed}, {numbered} AS position"
            else:
                names = ", ".join(n for n, _ in read)
                types = ", ".join(f"{n} {pg_type(t)}" for n, t in read)
                sql = (
                    f"SELECT * FROM ROWS FROM (json_to_recordset(CAST(:{records.name} AS json)) "
                    f"AS ({types})) WITH ORDINALITY AS t({names}, position)"
                )
            columns = [column(n, t) for n, t in read]
            return text(sql).columns(*columns, column("position", BigInteger)).subquery(alias)
        return self._json_rows(bindparam(records.name, type_=Text), read, alias)

    def rows(self, rows: Rows, alias: str, only: Sequence[str] | None = None) -> FromClause:
        """Collected ``rows`` as a relation (its columns, in collection order); ``only``: those
        columns alone. On PostgreSQL each column is an array scanned apart (``unnest`` of
        several arrays is a function scan of each): a statement that reads a few columns of
        many unnests those only."""
        columns = _only(rows.columns, only)
        if self.name == "postgresql":
            arrays = [bindparam(rows.array(n), type_=postgresql.ARRAY(t)) for n, t in columns]
            return (
                func.unnest(*arrays)
                .table_valued(*(column(n, t) for n, t in columns))
                .render_derived()
                .alias(alias)
            )
        return self._json_rows(bindparam(rows.name, type_=Text), columns, alias)

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


def _only(columns: RowColumns, only: Sequence[str] | None) -> RowColumns:
    """``columns``, or those named ``only`` (in that order)."""
    if only is None:
        return columns
    kinds = dict(columns)
    return [(name, kinds[name]) for name in only]


POSTGRESQL, SQLITE = Backend(Form.POSTGRESQL), Backend(Form.SQLITE)
# Citus sends no ``INSERT … SELECT`` that reads a CTE to a shard whole: it runs each CTE (and each
# subquery it cannot send with the insert) first, as a query of its own, and copies its rows to
# every node of the cluster (its planner cannot tell which nodes such an insert will need them
# on: intermediate_result_pruning.c, ``SUBPLAN_ACCESS_ANYWHERE``), so that statement's
# transaction spans every node. There, as on SQLite, an insert reads no CTE: it returns what it
# wrote, and the updates that follow read that (``choose(…, one_shard=…)``).
ONE_SHARD = Backend(Form.ONE_SHARD)


def backend(name: str) -> Backend:
    """The backend of a SQL dialect's name (a session's: programs as written)."""
    return POSTGRESQL if name == "postgresql" else SQLITE


# -- Rows into a program -------------------------------------------------------------------------


def records_json(records: Records, rows: Iterable[Mapping[str, Any]], on: Backend) -> str:
    """Rows (mappings with ``records``' columns) as the JSON a program takes; timestamps as the
    backend stores them."""
    return rows_text.rows_json(records.names, rows, on.time_text)


def _fields(records: Records, verbatim: Iterable[str]) -> list[tuple[str, rows_text.Field]]:
    """How an encoder writes each column of ``records``."""
    verbatim = set(verbatim)

    def field(name: str, kind: Any) -> rows_text.Field:
        if isinstance(kind, DateTime | UTCDateTime):
            return rows_text.Field.TIME
        if name in verbatim:
            return rows_text.Field.VERBATIM
        if isinstance(kind, String):
            return rows_text.Field.TEXT
        if isinstance(kind, Boolean):
            return rows_text.Field.BOOLEAN
        return rows_text.Field.INTEGER

    return [(n, field(n, t)) for n, t in records.columns]


def records_encoder(
    records: Records, on: Backend, *, verbatim: Iterable[str] = ()
) -> rows_text.Encoder:
    """A fast writer of exactly the JSON ``records_json`` writes, for a hot caller.
    ``verbatim``: text columns whose values never need escaping (checked against a pattern
    before they get here)."""
    return rows_text.Encoder(_fields(records, verbatim), on.time_text)


def arrays_encoder(
    records: Records, attributes: Mapping[str, str] | None = None
) -> Callable[[Sequence[Any]], dict[str, str]]:
    """The parameters of ``records`` (``by_column``) on PostgreSQL for rows (mappings with its
    columns, or, given ``attributes``, objects with each column at its attribute): each
    column's values as an array literal, by parameter name."""
    assert records.by_column, records.name
    fields = _fields(records, ())
    encode = rows_text.ArraysEncoder(fields, attributes)
    params = tuple(map(records.column_param, records.names))

    def arrays(rows: Sequence[Any]) -> dict[str, str]:
        return dict(zip(params, encode(rows), strict=True))

    return arrays
