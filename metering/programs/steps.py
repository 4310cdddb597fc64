"""What a program is written in: its parameters and variables (``Var``), the rows it takes
(``Records``) and collects (``Rows``), and its nine kinds of step.

Names. Parameters are ``p_…``, variables ``v_…``: in a statement they are ``bindparam``s (use
``Var.ref``), which the PL/pgSQL compiler writes as the PL/pgSQL name and which SQLite binds from
the program's environment. Rows travel into a program as one JSON document (``Records``,
metering.kit.records): PostgreSQL reads it with ``json_to_recordset``, SQLite with ``json_each``;
rows collected by a step (``Rows``) are arrays in PL/pgSQL and the same JSON on SQLite.

Every step knows where it was built (``origin``: the Python function that made it), so that a
line of a generated function, named by a PL/pgSQL error, leads back to it
(``Program.step_at``; docs/architecture.md, "Reading a PL/pgSQL error back to its step").
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, null
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.expression import Select, UpdateBase
from sqlalchemy.types import TypeEngine


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
    columns and ``position`` (the row's place in the array, from 0).

    ``by_column``: on PostgreSQL the rows come as one array per column instead (parameters
    named by ``column_param``, written by ``metering.programs.arrays_encoder``): for a large
    batch, ``unnest`` of typed arrays costs PostgreSQL about a third of ``json_to_recordset``
    (which builds a hash table of each object's fields before it reads a column). SQLite reads
    the JSON document either way."""

    name: str
    columns: RowColumns
    by_column: bool = False

    def __post_init__(self) -> None:
        assert self.name.startswith("p_"), self.name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def column_param(self, column_name: str) -> str:
        """The parameter of one column's array (``by_column``)."""
        return f"{self.name}_{column_name}"


@dataclass(frozen=True)
class Rows:
    """A variable holding rows that a ``Collect`` step gathered (in its statement's order)."""

    name: str
    columns: RowColumns

    def __post_init__(self) -> None:
        assert self.name.startswith("v_"), self.name

    def array(self, column_name: str) -> str:
        return f"{self.name}_{column_name}"

    # PL/pgSQL forms hold collected rows as one array per column: a program that collects rows
    # one at a time (a loop of one-row statements) writes those arrays with these steps.

    def emptied(self) -> tuple[Assign, ...]:
        """No row, as a ``Collect`` of none leaves them: each column's array null (``array_agg``
        of no row)."""
        return tuple(Assign(array, null()) for array in self._arrays().values())

    def appended(self, values: Mapping[str, Any]) -> tuple[Assign, ...]:
        """One more row, after the last: ``values`` by column."""
        return tuple(
            Assign(array, func.array_append(array.ref, values[name]))
            for name, array in self._arrays().items()
        )

    def _arrays(self) -> dict[str, Var]:
        return {name: Var(self.array(name), ARRAY(kind)) for name, kind in self.columns}


_NOT_NAMES = {"<locals>", "<module>", "<lambda>", "<listcomp>", "<genexpr>", "<dictcomp>"}


def _built_here() -> str:
    """The module and function whose code built a step (the caller of the step's
    ``__init__``, which calls this), e.g. ``metering.ledger.spending.debit_steps``."""
    frame = sys._getframe(2)
    parts = [part for part in frame.f_code.co_qualname.split(".") if part not in _NOT_NAMES]
    return ".".join([frame.f_globals.get("__name__", "?"), *parts])


@dataclass(frozen=True)
class _Built:
    # Not part of what a step is: two steps alike are equal wherever they were built.
    origin: str = field(default_factory=_built_here, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Run(_Built):
    """Execute a statement (a SELECT is run for its locks: PL/pgSQL's PERFORM)."""

    statement: ClauseElement


@dataclass(frozen=True)
class Fetch(_Built):
    """The statement's first row into variables (NULLs when there is none); with
    ``required``, no row is an error with that message."""

    statement: ClauseElement
    into: tuple[Var, ...]
    required: str | None = None


@dataclass(frozen=True)
class Sum(_Built):
    """The sum of one column over the rows a statement returns (0 for none): e.g. what an
    ``UPDATE … RETURNING`` released; with ``count``, how many rows it returned as well."""

    statement: UpdateBase
    column: str
    into: Var
    count: Var | None = None


@dataclass(frozen=True)
class Assign(_Built):
    into: Var
    expression: ColumnElement[Any]


@dataclass(frozen=True)
class Collect(_Built):
    """The rows a statement returns (a SELECT or DML with RETURNING), in ``order_by`` order
    (column names of ``into``), kept in ``into`` for later statements (``Backend.rows``); with
    ``largest``, the largest value of that column among them into that variable as well (NULL
    for no row), in the same statement. Order only what a later step needs in order: each
    ordered column is a sort of its own on PostgreSQL. A SELECT whose CTEs write (an ``INSERT …
    RETURNING`` as a CTE) keeps them at the top of the statement, as PostgreSQL requires.

    ``one_row``: the statement is DML that returns one row at most (a single event's insert, its
    account's debit), named as ``into``'s columns. On PostgreSQL it returns each column as an
    array of one, ``INTO`` the arrays: no aggregate to start and feed, and PL/pgSQL refuses a
    DML statement ``INTO`` that returns more than one row (an error, never a row lost); none
    leaves them NULL, as ``array_agg`` of no row does. SQLite refuses more than one row too."""

    statement: ClauseElement
    into: Rows
    order_by: tuple[str, ...] = ()
    largest: tuple[str, Var] | None = None
    one_row: bool = False

    def __post_init__(self) -> None:
        if not self.one_row:
            return
        if not isinstance(self.statement, UpdateBase) or self.order_by:
            raise ValueError(f"one row is of a DML statement, in no order: {self.origin}")
        returned = [str(getattr(column, "key", "")) for column in self.statement._returning]
        if returned != [name for name, _ in self.into.columns]:
            raise ValueError(f"one row's columns {returned} are not {self.into.name}'s")


@dataclass(frozen=True)
class When(_Built):
    condition: ColumnElement[bool]
    then: tuple[Step, ...]
    otherwise: tuple[Step, ...] = ()


@dataclass(frozen=True)
class ForEach(_Built):
    """For each row of a SELECT, its columns into ``into``, then ``steps``."""

    statement: Select[Any]
    into: tuple[Var, ...]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Emit(_Built):
    """A result row of a set-returning program (one value per result column)."""

    values: tuple[ColumnElement[Any], ...]


@dataclass(frozen=True)
class Return(_Built):
    """The result of a scalar program; ends it."""

    value: ColumnElement[Any]


Step = Run | Fetch | Sum | Assign | Collect | When | ForEach | Emit | Return

# What a program returns: rows of these columns (a set-returning program: ``Emit``), one value
# of this type (a scalar program: ``Return``), or nothing (None).
Returns = RowColumns | TypeEngine[Any] | None
