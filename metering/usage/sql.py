"""SQL helpers of the ingest: multi-row ``INSERT … ON CONFLICT`` for
both backends, one statement per call.

PostgreSQL gets the rows as one JSON document, ``INSERT … SELECT FROM json_populate_recordset``:
one short statement whatever the row count, a single bind parameter (the driver's per-element
array quoting cost more than the whole insert), typed by the table's own row type. SQLite gets the
same statement through SQLAlchemy Core (so datetimes pass through ``UTCDateTime``), sent as
multi-row VALUES pages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Table, func
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from metering.db import driver_connection, is_postgresql
from metering.models.base import UTCDateTime

# How a conflicting row's column is updated: the incoming value, added to it, or the larger.
Update = Literal["excluded", "add", "greatest"]


class Upsert:
    """A multi-row ``INSERT … ON CONFLICT (conflict) DO NOTHING`` (or ``DO UPDATE`` of the
    ``update`` columns) into one table, its statement built once; the rows are tuples in
    ``columns`` order, inserted in that order."""

    def __init__(
        self,
        table: Table,
        columns: Sequence[str],
        *,
        conflict: Sequence[str],
        update: Mapping[str, Update] | None = None,
        returning: Sequence[str] = (),
    ) -> None:
        self.table, self.columns, self.returning = table, tuple(columns), tuple(returning)
        self._temporal = [
            i for i, name in enumerate(columns) if isinstance(table.c[name].type, UTCDateTime)
        ]
        self._postgresql = _recordset_sql(table, self.columns, conflict, update, self.returning)
        self._sqlite = _sqlite_statement(table, conflict, update, self.returning)

    def prepare(
        self,
        session: Session,
        rows: Sequence[Sequence[Any]],
        encode: Callable[[Sequence[Sequence[Any]]], str] | None = None,
    ) -> Callable[[], list[Any]]:
        """Everything but the round trip: the statement to run (and the RETURNING rows, as
        tuples in ``returning`` order), so that a caller about to hold contended locks does its
        Python work first. Datetimes must be aware (UTCDateTime's rule, on both backends).
        ``encode``: a faster writer of exactly what ``json`` writes, for a hot caller."""
        if not rows:
            return list
        if is_postgresql(session):
            payload = (encode or self.json)(rows)
            sql, returning = self._postgresql, self.returning

            def run_postgresql() -> list[Any]:
                cursor = driver_connection(session).execute(sql, (payload,))
                return cursor.fetchall() if returning else []

            return run_postgresql
        params = [dict(zip(self.columns, row, strict=True)) for row in rows]

        def run_sqlite() -> list[Any]:
            result = session.connection().execute(self._sqlite, params)
            found = list(result) if self.returning else []
            result.close()
            return found

        return run_sqlite

    def run(self, session: Session, rows: Sequence[Sequence[Any]]) -> list[Any]:
        return self.prepare(session, rows)()

    def json(self, rows: Sequence[Sequence[Any]]) -> str:
        """The rows as one JSON document: one short statement whatever the row count, and a
        single bind parameter (the driver's per-element array quoting costs more than the whole
        insert), typed by the table's own row type on the way in."""
        columns, temporal = self.columns, self._temporal
        records = []
        for row in rows:
            record = dict(zip(columns, row, strict=True))
            for index in temporal:
                record[columns[index]] = _json_time(row[index])
            records.append(record)
        return json.dumps(records, separators=(",", ":"), allow_nan=False)


def _json_time(value: Any) -> Any:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValueError("UTCDateTime needs an aware datetime")
    return value.isoformat()


def _sqlite_statement(
    table: Table,
    conflict: Sequence[str],
    update: Mapping[str, Update] | None,
    returning: Sequence[str],
) -> Any:
    """The same statement through SQLAlchemy Core (so datetimes pass through UTCDateTime)."""
    statement: Any = sqlite.insert(table)
    if update:
        excluded = statement.excluded
        sets: dict[str, Any] = {}
        for name, how in update.items():
            if how == "add":
                sets[name] = table.c[name] + excluded[name]
            elif how == "greatest":
                sets[name] = func.max(table.c[name], excluded[name])  # SQLite's scalar max(a, b)
            else:
                sets[name] = excluded[name]
        statement = statement.on_conflict_do_update(index_elements=list(conflict), set_=sets)
    else:
        statement = statement.on_conflict_do_nothing(index_elements=list(conflict))
    # RETURNING makes SQLAlchemy send multi-row VALUES pages ("insertmanyvalues") rather than
    # one statement per row.
    return statement.returning(*(table.c[name] for name in returning or conflict[:1]))


def _recordset_sql(
    table: Table,
    columns: Sequence[str],
    conflict: Sequence[str],
    update: Mapping[str, Update] | None,
    returning: Sequence[str],
) -> str:
    quoted = ", ".join(f'"{name}"' for name in columns)
    sql = (
        f'INSERT INTO "{table.name}" ({quoted}) SELECT {quoted} '
        f'FROM json_populate_recordset(NULL::"{table.name}", %s::json) '
        f"ON CONFLICT ({', '.join(conflict)}) "
    )
    if update:
        sets = []
        for name, how in update.items():
            target = f'"{table.name}"."{name}"'
            if how == "add":
                sets.append(f'"{name}" = {target} + EXCLUDED."{name}"')
            elif how == "greatest":
                sets.append(f'"{name}" = GREATEST({target}, EXCLUDED."{name}")')
            else:
                sets.append(f'"{name}" = EXCLUDED."{name}"')
        sql += "DO UPDATE SET " + ", ".join(sets)
    else:
        sql += "DO NOTHING"
    if returning:
        sql += " RETURNING " + ", ".join(f'"{name}"' for name in returning)
    return sql
