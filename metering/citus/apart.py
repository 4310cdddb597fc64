"""A row of a join read one table at a time, for a program's form on a Citus shard.

Citus plans a statement of one table cheaply, by its fast path (metering.citus.one_account): a
join, even with a reference table, and a subquery in an expression are planned in full twice at
every call. ``read_apart`` takes a SELECT's parts — its columns, a FROM that is a chain
of joins (``a JOIN b ON … LEFT JOIN c ON …``) and a WHERE of its first table — and reads the
same row by steps of a program: for each table in the join's order, one ``Fetch`` of the columns
of it that anything uses, its ON condition (the WHERE for the first) with the tables before it
read from the variables they were fetched into; each subquery of a condition or a column (an
``EXISTS``, a scalar subquery) a ``Fetch`` of its own before it is used. The columns are then
expressions of those variables, and ``found`` says whether the row exists (the first table's
row and each inner join's matched). A table whose condition is only its primary key compared
with a subquery of the same table that selects that key (``t.id = (SELECT id FROM t WHERE …
ORDER BY … LIMIT 1)``: a price's latest version) is read by the subquery's own statement, its
columns selected: the row it names, in one statement instead of two.

The same row, provided each table matches at most one row: every condition compares a unique
key of its table with what came before (checked when the steps are built), and each scalar
subquery has ``LIMIT 1``. A table that does not match leaves its variables null, as an outer
join's null row does; a condition that compares a column with a variable that is null matches
nothing, so its statement is skipped (its variables set null); an ``EXISTS`` that is the later
operand of an ``OR`` is read only when the operands before it are not true. Each statement takes
its own snapshot (READ COMMITTED), where the join took one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    FromClause,
    Table,
    UniqueConstraint,
    and_,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BinaryExpression, BindParameter, BooleanClauseList, ColumnClause
from sqlalchemy.sql.selectable import Alias, Exists, Join, ScalarSelect, Select
from sqlalchemy.sql.visitors import iterate, replacement_traverse

from metering import programs as p


@dataclass(frozen=True)
class ReadApart:
    """``read_apart``'s result: the steps that read the row, whether it was found, and each
    column as an expression of the variables they read (null when the row was not found)."""

    steps: tuple[p.Step, ...]
    found: ColumnElement[bool]
    columns: dict[str, ColumnElement[Any]]


def read_apart(
    columns: Mapping[str, ColumnElement[Any]], source: FromClause, where: Any, prefix: str
) -> ReadApart:
    """The row ``SELECT columns FROM source WHERE where`` read one table at a time (see the
    module), its variables named ``v_<prefix>_…``."""
    chain = _chain(source)
    froms = [from_ for from_, _, _ in chain]
    conditions = [where if on is None else on for _, on, _ in chain]
    assert all(_index(froms, found) in (None, 0) for found in iterate(where)), (
        "a WHERE of the first table's columns alone"
    )
    used: dict[int, dict[str, None]] = {index: {} for index in range(len(froms))}
    # What is read of each table: the columns the row's columns use, and those the tables after
    # it are read by.
    uses = [(element, len(froms)) for element in columns.values()]
    for later, condition in enumerate(conditions):
        uses.append((condition, later))
    for element, later in uses:
        for found in iterate(element):
            index = _index(froms, found)
            if index is not None and index < later:
                used[index].setdefault(found.name)  # type: ignore[attr-defined]
    numbers = count(1)
    variables: dict[tuple[int, str], p.Var] = {}
    steps: list[p.Step] = []
    markers: list[p.Var] = []
    for index, ((from_, _, outer), condition) in enumerate(zip(chain, conditions, strict=True)):
        name = f"v_{prefix}_{from_.name}"
        latest = _latest_of_its_own(from_, condition, froms)
        if latest is None:
            condition = _without_subqueries(condition, froms, variables, steps, prefix, numbers)
            _assert_by_unique_key(from_, condition)
            read_from, key = from_, condition
        else:  # the latest row itself, by its subquery's own conditions and order
            read_from = from_.element if isinstance(from_, Alias) else from_
            latest = replacement_traverse(  # type: ignore[call-overload]
                latest, {}, lambda found: _variable(froms, variables, found)
            )
            key = and_(true(), *latest._where_criteria)
        fetched = {c: p.Var(f"{name}_{c}", from_.c[c].type) for c in used[index]}
        into = list(fetched.values())
        selected = [read_from.c[column] for column in fetched]
        if not outer:  # the row exists only if this table's does
            marker = p.Var(f"{name}_found", Boolean())
            markers.append(marker)
            into.insert(0, marker)
            selected.insert(0, true())
        statement = (
            select(*selected).select_from(from_).where(condition)
            if latest is None
            else latest.with_only_columns(*selected)
        )
        steps.append(_unless_null_compared(p.Fetch(statement, into=tuple(into)), key, prefix))
        variables.update({(index, column): var for column, var in fetched.items()})
    values = {
        name: _without_subqueries(column, froms, variables, steps, prefix, numbers)
        for name, column in columns.items()
    }
    return ReadApart(tuple(steps), and_(*(m.ref.isnot(None) for m in markers)), values)


def _latest_of_its_own(from_: Any, condition: Any, chain: list[Any]) -> Select[Any] | None:
    """The subquery of a condition that is only ``t.<key> = (SELECT <key> FROM t WHERE …
    ORDER BY … LIMIT 1)``, ``t`` (or an alias of it) the table read and ``<key>`` its primary
    key: the row it names is the subquery's own row, read by one statement instead of two (the
    latest version of a price, metering.catalog.prices)."""
    if not (isinstance(condition, BinaryExpression) and condition.operator is operators.eq):
        return None
    column, latest = condition.left, condition.right
    table: Any = from_.element if isinstance(from_, Alias) else from_
    if not (
        isinstance(column, ColumnClause)
        and column.table is from_
        and [c.name for c in table.primary_key.columns] == [column.name]
        and isinstance(latest, ScalarSelect)
    ):
        return None
    inner: Any = latest.element
    if not (isinstance(inner, Select) and inner._limit == 1):
        return None
    # Not counting the tables of the chain it names (read before it: their variables).
    froms = [f for f in inner.get_final_froms() if not any(f is c for c in chain)]
    selected = list(inner.selected_columns)
    if froms != [table] or len(selected) != 1 or selected[0] is not table.c[column.name]:
        return None
    return inner


def _chain(source: FromClause) -> list[tuple[Any, Any, bool]]:
    """A left-deep chain of joins as (table or alias, ON condition, outer), the first with none."""
    if isinstance(source, Join):
        assert isinstance(source.right, Table | Alias), "a chain of joins, each of one table"
        return [*_chain(source.left), (source.right, source.onclause, source.isouter)]
    assert isinstance(source, Table | Alias), source
    return [(source, None, False)]


def _index(froms: list[Any], element: Any) -> int | None:
    """Which of ``froms`` the column ``element`` is of (None: not a column of theirs)."""
    if not isinstance(element, ColumnClause):
        return None
    table = getattr(element, "table", None)
    for index, from_ in enumerate(froms):
        if table is not None and table._deannotate() is from_:
            return index
    return None


def _without_subqueries(
    element: Any,
    froms: list[Any],
    variables: Mapping[tuple[int, str], p.Var],
    steps: list[p.Step],
    prefix: str,
    numbers: Any,
    unless: Iterable[Any] = (),
) -> Any:
    """``element`` with the columns of ``froms`` read from their variables, and each subquery
    a ``Fetch`` appended to ``steps`` (read only when none of ``unless`` is true)."""
    if isinstance(element, BooleanClauseList) and element.operator is operators.or_:
        done: list[Any] = []
        for clause in element.clauses:
            done.append(
                _without_subqueries(
                    clause, froms, variables, steps, prefix, numbers, (*unless, *done)
                )
            )
        return or_(*done)

    def columns_of(inner: Any) -> Any:
        """A subquery with the columns of the tables read before it as their variables: then
        it reads no table of the join (it names none, or one not read yet: refused)."""

        def replaced(found: Any) -> Any:
            return _variable(froms, variables, found)

        read = replacement_traverse(inner, {}, replaced)  # type: ignore[call-overload]
        joined = [f for f in read.get_final_froms() if any(f is from_ for from_ in froms)]
        assert not joined, f"a subquery that reads the join's {joined[0]} itself"
        return read

    def replaced(found: Any) -> Any:
        if _index(froms, found) is not None:
            return _variable(froms, variables, found)
        if isinstance(found, Exists):
            inner = _select_of(found)
            var = p.Var(f"v_{prefix}_{next(numbers)}", Boolean())
            read = columns_of(inner.with_only_columns(true()).limit(1))
            steps.append(_guarded(p.Fetch(read, into=(var,)), read, unless, prefix))
            return var.ref.isnot(None)
        if isinstance(found, ScalarSelect):
            one: Any = found.element
            assert isinstance(one, Select) and one._limit == 1, "a scalar subquery of one row"
            var = p.Var(f"v_{prefix}_{next(numbers)}", found.type)
            read = columns_of(one)
            steps.append(_guarded(p.Fetch(read, into=(var,)), read, unless, prefix))
            return var.ref
        return None

    return replacement_traverse(element, {}, replaced)  # type: ignore[call-overload]


def _variable(froms: list[Any], variables: Mapping[tuple[int, str], p.Var], found: Any) -> Any:
    """The variable a column of a table read before holds (None: not such a column, e.g. one
    of the table being read)."""
    index = _index(froms, found)
    var = None if index is None else variables.get((index, found.name))
    return None if var is None else var.ref


def _select_of(exists: Exists) -> Select[Any]:
    inner: Any = exists.element
    while not isinstance(inner, Select):
        inner = inner.element
    return inner


def _guarded(fetch: p.Fetch, statement: Any, unless: Iterable[Any], prefix: str) -> p.Step:
    """``fetch`` of a subquery, not read when one of ``unless`` is true (the subquery's value
    is then not used: an earlier operand of its OR decided)."""
    step = _unless_null_compared(fetch, and_(true(), *statement._where_criteria), prefix)
    unless = tuple(unless)
    if not unless:
        return step
    skipped = tuple(p.Assign(var, null()) for var in fetch.into)
    return p.When(and_(*(clause.isnot(true()) for clause in unless)), (step,), skipped)


def _conjuncts(condition: Any) -> list[Any]:
    if isinstance(condition, BooleanClauseList) and condition.operator is operators.and_:
        return [c for clause in condition.clauses for c in _conjuncts(clause)]
    return [condition]


def _compared_variables(condition: Any, prefix: str) -> list[Any]:
    """The variables ``read_apart`` made (``v_<prefix>_…``) that a conjunct of ``condition``
    compares for equality."""
    found = []
    for conjunct in _conjuncts(condition):
        if isinstance(conjunct, BinaryExpression) and conjunct.operator is operators.eq:
            for side in (conjunct.left, conjunct.right):
                if isinstance(side, BindParameter) and side.key.startswith(f"v_{prefix}_"):
                    found.append(side)
    return found


def _unless_null_compared(fetch: p.Fetch, condition: Any, prefix: str) -> p.Step:
    """``fetch``, skipped (its variables set null, as it would find no row) when a variable its
    condition compares for equality is null."""
    compared = _compared_variables(condition, prefix)
    if not compared:
        return fetch
    skipped = tuple(p.Assign(var, null()) for var in fetch.into)
    return p.When(and_(*(var.isnot(None) for var in compared)), (fetch,), skipped)


def _assert_by_unique_key(from_: Any, condition: Any) -> None:
    """The condition compares, for equality, every column of a unique key of ``from_`` with
    something that is not of ``from_``: it matches at most one row."""
    table: Any = from_.element if isinstance(from_, Alias) else from_
    compared = set()
    for conjunct in _conjuncts(condition):
        if isinstance(conjunct, BinaryExpression) and conjunct.operator is operators.eq:
            for side, other in ((conjunct.left, conjunct.right), (conjunct.right, conjunct.left)):
                mine = isinstance(side, ColumnClause) and side.table is from_
                if mine and not any(
                    isinstance(e, ColumnClause) and e.table is from_ for e in iterate(other)
                ):
                    compared.add(side.name)
    keys = [{c.name for c in table.primary_key.columns}]
    keys += [{c.name} for c in table.columns if c.unique]
    keys += [
        {c.name for c in constraint.columns}
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    ]
    keys += [{c.name for c in index.columns} for index in table.indexes if index.unique]
    assert isinstance(table, Table) and any(key and key <= compared for key in keys), (
        f"{from_.name} is not read by a unique key: {condition}"
    )


__all__ = ["ReadApart", "read_apart"]
