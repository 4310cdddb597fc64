"""Rows as one JSON document: an array of objects, each row's values by column name.

This is how rows travel into a program (metering.programs.Records: PostgreSQL reads the
document with ``json_to_recordset``, SQLite with ``json_each``) and how SQLite keeps the rows a
program collected. A time is written as the backend stores it (``postgresql_time``,
``sqlite_time``); an integer is written exactly and only from an ``int`` (never a float, never a
bool).

``rows_json`` writes any rows. ``Encoder`` writes exactly the same text for columns it is told
the kind of (``Field``), fast, for the gateway's hot path: a single event's document row by row,
a batch's column by column (each column read, checked and converted in one pass, every
distinct string of a document JSON-encoded once).

``ArraysEncoder`` writes the same rows as one PostgreSQL array literal per column, for a
statement that reads them with ``unnest`` (metering.programs.Records.by_column): a batch's
events cost PostgreSQL about a third of what parsing their JSON document did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from enum import Enum
from json.encoder import encode_basestring_ascii
from operator import attrgetter, call, itemgetter
from typing import Any

TimeText = Callable[[datetime], str]


def postgresql_time(value: datetime) -> str:
    """A ``TIMESTAMP WITH TIME ZONE`` as PostgreSQL reads it: ISO 8601 with its offset."""
    if value.tzinfo is None:
        raise ValueError("UTCDateTime needs an aware datetime")
    return value.isoformat()


def sqlite_time(value: datetime) -> str:
    """UTCDateTime's SQLite form: naive UTC in SQLAlchemy's storage format (years of 4 digits,
    year 1 included)."""
    if value.tzinfo is None:
        raise ValueError("UTCDateTime needs an aware datetime")
    v = value.astimezone(UTC)
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d} "
        f"{v.hour:02d}:{v.minute:02d}:{v.second:02d}.{v.microsecond:06d}"
    )


def rows_json(names: Sequence[str], rows: Iterable[Mapping[str, Any]], time_text: TimeText) -> str:
    """Rows (mappings with the ``names``) as a JSON document, their times by ``time_text``,
    dates as ISO 8601, every other value as JSON writes it (an integer exactly)."""

    def value(found: Any) -> Any:
        if isinstance(found, datetime):
            return time_text(found)
        if isinstance(found, date):
            return found.isoformat()
        return found

    return json.dumps(
        [{name: value(row[name]) for name in names} for row in rows],
        separators=(",", ":"),
        allow_nan=False,
    )


class Field(Enum):
    """How an ``Encoder`` writes one column's values."""

    TEXT = "text"  # a string, escaped (or null)
    VERBATIM = "verbatim"  # a string that needs no escaping (checked against a pattern before)
    TIME = "time"  # an aware datetime, as the backend's time text
    BOOLEAN = "boolean"  # true, false or null
    INTEGER = "integer"  # an int, never a float nor a bool (or null)


def _text(value: Any) -> str:
    """A string's JSON text (what ``json.dumps`` writes), without ``json.dumps``' own cost."""
    if type(value) is str:
        return encode_basestring_ascii(value)
    return json.dumps(value)


class _Quoted(dict[Any, str]):
    """The JSON text of each distinct value of a document, encoded once."""

    def __missing__(self, value: Any) -> str:
        quoted = self[value] = _text(value)
        return quoted


def _integer(value: int | None) -> int | str:
    if value is None:
        return "null"
    assert type(value) is int, value  # never a float, never a bool
    return value


_BOOLEANS = {True: "true", False: "false", None: "null"}
_INTEGERS = frozenset({int})
_TZINFO = attrgetter("tzinfo")
# Fewer rows than this are written row by row: one conversion per value costs less than the
# column-by-column pass sets up (measured: the gateway's single event, and batches of 10 on).
_ROW_BY_ROW = 8


class Encoder:
    """Writes exactly what ``rows_json`` writes of rows with these ``fields`` (name and kind,
    in order), times by ``time_text``; ``rows`` must be a sequence (read once per column)."""

    def __init__(self, fields: Sequence[tuple[str, Field]], time_text: TimeText) -> None:
        self._fields = tuple(fields)
        self._time_text = time_text
        slots = []
        for name, kind in self._fields:
            key = json.dumps(name).replace("%", "%%")
            slots.append(f'{key}:"%s"' if kind in (Field.VERBATIM, Field.TIME) else f"{key}:%s")
        # One row's text: one %-format of its values in order.
        self._row = ("{" + ",".join(slots) + "}").__mod__
        names = [name for name, _ in self._fields]
        self._getters = tuple(map(itemgetter, names))
        # A row's values in order (itemgetter of one name gives the value, not a tuple).
        self._values: Callable[[Mapping[str, Any]], tuple[Any, ...]] = (
            itemgetter(*names) if len(names) > 1 else lambda row: (row[names[0]],)
        )
        writers: dict[Field, Callable[[Any], Any]] = {
            Field.TEXT: _text,
            Field.VERBATIM: str,
            Field.TIME: time_text,
            Field.BOOLEAN: _BOOLEANS.__getitem__,
            Field.INTEGER: _integer,
        }
        self._writers = tuple(writers[kind] for _, kind in self._fields)

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> str:
        if len(rows) < _ROW_BY_ROW:
            row, values, writers = self._row, self._values, self._writers
            return "[" + ",".join([row(tuple(map(call, writers, values(r)))) for r in rows]) + "]"
        return "[" + ",".join(map(self._row, zip(*self._columns(rows), strict=True))) + "]"

    def _columns(self, rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
        quoted = _Quoted().__getitem__
        columns = []
        for get, (_, kind) in zip(self._getters, self._fields, strict=True):
            values = list(map(get, rows))
            if kind is Field.TEXT:
                values = list(map(quoted, values))
            elif kind is Field.TIME:
                values = list(map(self._time_text, values))
            elif kind is Field.BOOLEAN:
                values = list(map(_BOOLEANS.__getitem__, values))
            elif kind is Field.INTEGER and not set(map(type, values)) <= _INTEGERS:
                values = list(map(_integer, values))
            columns.append(values)
        return columns


def _array_element(value: str | None) -> str:
    """A string as an element of an array literal: double-quoted, ``"`` and ``\\`` escaped
    (``array_in``'s rule: anything else stands for itself between the quotes); null unquoted."""
    if value is None:
        return "NULL"
    assert type(value) is str, value
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'


def _array_integer(value: int | None) -> str:
    if value is None:
        return "NULL"
    assert type(value) is int, value  # never a float, never a bool
    return str(value)


class _Elements(dict[Any, str]):
    """The array element of each distinct string of a column, written once."""

    def __missing__(self, value: Any) -> str:
        element = self[value] = _array_element(value)
        return element


class ArraysEncoder:
    """Rows with these ``fields`` (name and kind, in order) as one PostgreSQL array literal per
    column, in order; times as ``postgresql_time`` writes them. ``rows`` must be a sequence
    (read once per column): mappings, each value by its field's name, or, given ``attributes``
    (each field's attribute, a dotted path as ``operator.attrgetter`` reads it), objects: a
    batch's rows read from what it already holds, without a mapping made for each."""

    def __init__(
        self,
        fields: Sequence[tuple[str, Field]],
        attributes: Mapping[str, str] | None = None,
    ) -> None:
        self._fields = tuple(fields)
        self._getters: tuple[Callable[[Any], Any], ...] = tuple(
            itemgetter(name) if attributes is None else attrgetter(attributes[name])
            for name, _ in self._fields
        )

    def __call__(self, rows: Sequence[Any]) -> list[str]:
        arrays = []
        for get, (_, kind) in zip(self._getters, self._fields, strict=True):
            values = list(map(get, rows))
            if kind is Field.INTEGER:
                if set(map(type, values)) <= _INTEGERS:
                    elements = list(map(str, values))
                else:
                    elements = list(map(_array_integer, values))
            elif kind is Field.BOOLEAN:
                elements = list(map(_BOOLEANS.__getitem__, values))
            elif kind is Field.TIME:
                if None not in values and None not in set(map(_TZINFO, values)):
                    # Each aware: its ISO text, by the C method itself (``postgresql_time``'s
                    # text, without a Python call per value).
                    arrays.append(_quoted_array(list(map(datetime.isoformat, values))))
                    continue
                elements = ["NULL" if v is None else f'"{postgresql_time(v)}"' for v in values]
            else:  # TEXT and VERBATIM alike: an element's quoting is not JSON's
                if None not in values and _needs_no_escape(values):
                    arrays.append(_quoted_array(values))
                    continue
                elements = list(map(_Elements().__getitem__, values))
            arrays.append("{" + ",".join(elements) + "}")
        return arrays


def _needs_no_escape(texts: list[Any]) -> bool:
    """Whether none of ``texts`` (strings) holds a character an array element escapes."""
    whole = "".join(texts)  # a value not a string fails here, as _array_element's check would
    return '"' not in whole and "\\" not in whole


def _quoted_array(texts: list[str]) -> str:
    """An array literal of strings that need no escaping, each double-quoted (a bare element
    could read as NULL): in one join, not an element at a time."""
    if not texts:
        return "{}"
    return '{"' + '","'.join(texts) + '"}'
