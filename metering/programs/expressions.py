"""Portable expressions: one SQL meaning, written as each backend's SQL has it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.visitors import InternalTraversal


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
