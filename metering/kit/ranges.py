"""Ranges (docs/api.md#ranges): every stored amount and every sum stays within a signed 64-bit
integer, on both backends, and is never coerced to a float.

The rule has one home, the database's own column type, refused the same way on both backends:
PostgreSQL's ``BIGINT`` raises ``numeric_value_out_of_range`` (SQLSTATE 22003) on an overflow,
and SQLite, whose integer arithmetic would silently turn an overflowing value into a REAL,
refuses any integer column whose value is not an integer (``CHECK (typeof(x) = 'integer')``,
``add_integer_checks``; the baseline migration makes them). So no program or statement needs a
hand-written bound, and the caller that can recover does so on one exception
(``is_out_of_range``): the ingest quarantines the usage event whose charge would leave the range
(metering.usage.isolation) and the check-and-hold refuses the estimate that would (400, naming
its field).
"""

from __future__ import annotations

import psycopg
from sqlalchemy import BigInteger, CheckConstraint, Integer, Table
from sqlalchemy.exc import DBAPIError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# The name every SQLite integer check ends with (``ck_<table>_<column>_integer``).
CHECK_SUFFIX = "_integer"
_PG_OUT_OF_RANGE = "22003"  # numeric_value_out_of_range
# What a database refusal looks like, from SQLAlchemy or from the driver itself (the ingest's
# PostgreSQL statements go straight to psycopg).
DATABASE_ERRORS = (DBAPIError, psycopg.Error)


def fits(value: int) -> bool:
    """Whether ``value`` fits a signed 64-bit integer."""
    return INT64_MIN <= value <= INT64_MAX


def integer_columns(table: Table) -> list[str]:
    """The columns of ``table`` that hold integers (amounts, counters, counts, ids that are not
    the table's own key, which SQLite keeps as its rowid, always an integer)."""
    return [
        c.name
        for c in table.columns
        if isinstance(c.type, Integer | BigInteger) and not c.primary_key
    ]


def integer_check(column: str, nullable: bool) -> str:
    """The SQLite condition that ``column`` holds an integer (or, when nullable, null)."""
    if nullable:
        return f"typeof({column}) IN ('integer', 'null')"
    return f"typeof({column}) = 'integer'"


def add_integer_checks(table: Table) -> None:
    """Give ``table`` its SQLite integer checks (PostgreSQL's column types refuse by
    themselves), named ``<column>_integer`` under the naming convention."""
    for name in integer_columns(table):
        column = table.c[name]
        check = CheckConstraint(
            integer_check(name, bool(column.nullable)), name=f"{name}{CHECK_SUFFIX}"
        )
        table.append_constraint(check.ddl_if(dialect="sqlite"))


def is_out_of_range(error: BaseException) -> bool:
    """Whether ``error`` (a driver's, or SQLAlchemy's wrapping one) is the database refusing a
    value outside the signed 64-bit range."""
    original = getattr(error, "orig", None) or error
    if getattr(original, "sqlstate", None) == _PG_OUT_OF_RANGE:
        return True
    message = str(original)
    if type(original).__module__ == "sqlite3":
        if message == "integer overflow":  # sum() or an integer cast
            return True
        if message.startswith("CHECK constraint failed:") and message.endswith(CHECK_SUFFIX):
            return True
    return False
