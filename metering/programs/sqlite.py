"""Programs run on SQLite: the steps interpreted one by one, each statement executed through
SQLAlchemy inside the caller's transaction (SQLite is in the process: a round trip costs nothing
that one PL/pgSQL function would save)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, select
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import TypeEngine

from metering.kit.records import rows_json, sqlite_time
from metering.programs.steps import (
    Assign,
    Collect,
    Emit,
    Fetch,
    ForEach,
    Return,
    Returns,
    Run,
    Step,
    Sum,
    When,
)


def run(
    steps: Sequence[Step],
    connection: Connection,
    params: Mapping[str, Any],
    initial: Mapping[str, Any],
    returns: Returns,
) -> Any:
    """Run ``steps`` with ``params`` (and the variables' ``initial`` values) inside the
    connection's transaction: the emitted rows (set-returning), the returned value (scalar) or
    None."""
    env: dict[str, Any] = dict.fromkeys(_variables(steps))
    env.update(params)
    env.update(initial)
    output: list[tuple[Any, ...]] = []
    try:
        _interpret(steps, connection, env, output)
    except _Returned as returned:
        return returned.value
    if isinstance(returns, TypeEngine):
        return None
    return output if returns is not None else None


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
            if step.one_row and len(rows) > 1:
                raise ProgramError("query returned more than one row")  # as PL/pgSQL's INTO
            if step.order_by:
                rows.sort(key=lambda row: tuple(row[name] for name in step.order_by))
            env[step.into.name] = rows_json(names, rows, sqlite_time)
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
