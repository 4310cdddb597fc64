"""Multi-row ``INSERT … ON CONFLICT`` for both backends, one statement per call.

PostgreSQL gets the rows as one JSON document, ``INSERT … SELECT FROM json_populate_recordset``:
one short statement whatever the row count, a single bind parameter (the driver's per-element
array quoting cost more than the whole insert), typed by the table's own row type. SQLite gets the
same statement through SQLAlchemy Core (so datetimes pass through ``UTCDateTime``), sent as
multi-row VALUES pages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Table, func
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from metering.models.base import UTCDateTime

# How a conflicting row's column is updated: the incoming value, added to it, or the larger.
Update = Literal["excluded", "add", "greatest"]


def is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def insert_rows(
    session: Session,
    table: Table,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    conflict: Sequence[str],
    update: Mapping[str, Update] | None = None,
    returning: Sequence[str] = (),
) -> list[Row[Any]]:
    """Insert ``rows`` (tuples in ``columns`` order, inserted in that order) with ``ON CONFLICT
    (conflict) DO NOTHING``, or ``DO UPDATE`` of the ``update`` columns; the RETURNING rows.

    Datetimes must be aware (UTCDateTime's rule, checked on both backends)."""
    if not rows:
        return []
    if is_postgresql(session):
        return _insert_recordset(session, table, columns, rows, conflict, update, returning)
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
    statement = statement.returning(*(table.c[name] for name in returning or conflict[:1]))
    result = session.connection().execute(
        statement, [dict(zip(columns, row, strict=True)) for row in rows]
    )
    found = list(result) if returning else []
    result.close()
    return found


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("UTCDateTime needs an aware datetime")
        return value.isoformat()
    return value


def _insert_recordset(
    session: Session,
    table: Table,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    conflict: Sequence[str],
    update: Mapping[str, Update] | None,
    returning: Sequence[str],
) -> list[Row[Any]]:
    temporal = [i for i, name in enumerate(columns) if isinstance(table.c[name].type, UTCDateTime)]
    records = []
    for row in rows:
        record = dict(zip(columns, row, strict=True))
        for index in temporal:
            record[columns[index]] = _json_value(row[index])
        records.append(record)
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
    payload = json.dumps(records, separators=(",", ":"), allow_nan=False)
    result = session.connection().exec_driver_sql(sql, (payload,))
    found = list(result) if returning else []
    result.close()
    return found
