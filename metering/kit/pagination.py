"""Cursor pagination for admin lists: ``?limit=`` 1–1000 (default 100), ``?after=``
(docs/api.md#conventions)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query
from pydantic import BeforeValidator
from sqlalchemy import ColumnElement, Select, and_, or_
from sqlalchemy.orm import Session

from metering.kit.errors import InvalidRequest
from metering.kit.money import INT64_MAX
from metering.kit.text import storable
from metering.kit.timeutil import format_timestamp, parse_timestamp

T = TypeVar("T")


def encode_cursor(*values: Any) -> str:
    raw = json.dumps(list(values), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, arity: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        values = None
    if not isinstance(values, list) or len(values) != arity or not all(map(_is_key, values)):
        raise InvalidRequest("after is not a cursor this list returned", param="after")
    return values


def row_id_after(cursor: str) -> int:
    """The row id an ``after`` cursor of a list by row id names (positive, 64-bit); anything
    else is not a cursor such a list returned (400 naming ``after``)."""
    (last,) = decode_cursor(cursor, 1)
    if not _is_row_number(last):
        raise InvalidRequest("after is not a cursor this list returned", param="after")
    return int(last)


def _is_row_number(value: Any) -> bool:
    """A database row id: a positive 64-bit integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT64_MAX


def _is_key(value: Any) -> bool:
    """A cursor holds only what ``encode_cursor`` put there: ids, timestamps and 64-bit row ids
    (anything else would reach the database as a value it cannot bind)."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return -INT64_MAX - 1 <= value <= INT64_MAX


def _digits(value: object) -> object:
    """A query integer is written in digits only: not ``1.0``, ``+5``, `` 5`` or ``1_000``
    (which pydantic's lax ``int`` would read), so a float is never taken for an integer."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be an integer written in digits")
    return value


def page_request(
    # An integer query parameter is digits only (docs/api.md#conventions, strict types).
    limit: Annotated[int, Query(ge=1, le=1000), BeforeValidator(_digits)] = 100,
    after: Annotated[str | None, Query(max_length=500)] = None,
) -> tuple[int, str | None]:
    return limit, after


PageParams = Annotated[tuple[int, str | None], Depends(page_request)]


def page(
    rows: Sequence[T],
    limit: int,
    render: Callable[[T], dict[str, Any]],
    cursor_of: Callable[[T], tuple[Any, ...]],
) -> dict[str, Any]:
    """The list body from up to ``limit + 1`` fetched rows (the extra one says ``has_more``)."""
    has_more = len(rows) > limit
    shown = rows[:limit]
    return {
        "object": "list",
        "data": [render(row) for row in shown],
        "has_more": has_more,
        "next_cursor": encode_cursor(*cursor_of(shown[-1])) if has_more and shown else None,
    }


def newest_first_by_time(
    session: Session,
    query: Select[Any],
    created_at: ColumnElement[Any],
    row_id: ColumnElement[Any],
    limit: int,
    after: str | None,
    render: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """The list body of ``query``'s rows newest first by ``created_at``, then by ``row_id``
    (rows of the same instant: a text id, or an integer row id, positive and 64-bit), from the
    row after the ``after`` cursor. By the time a row shows, not its id alone: a Citus worker
    numbers the rows it inserts in a range of its own (the account's rows written by the
    gateway's calls delegated there, beside those the coordinator wrote), so ids do not say
    which came first."""
    if after:
        at_text, last_id = decode_cursor(after, 2)
        if not isinstance(at_text, str) or not _is_row_id(last_id, row_id):
            raise InvalidRequest("after is not a cursor this list returned", param="after")
        at = parse_timestamp(at_text, "after")
        query = query.where(or_(created_at < at, and_(created_at == at, row_id < last_id)))
    query = query.order_by(created_at.desc(), row_id.desc()).limit(limit + 1)
    rows = [row._mapping for row in session.execute(query)]
    at_name, id_name = created_at.key, row_id.key
    assert at_name is not None and id_name is not None
    return page(rows, limit, render, lambda row: (format_timestamp(row[at_name]), row[id_name]))


def _is_row_id(value: Any, row_id: ColumnElement[Any]) -> bool:
    if row_id.type.python_type is int:
        return _is_row_number(value)
    return isinstance(value, str)
