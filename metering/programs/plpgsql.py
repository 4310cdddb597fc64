"""PostgreSQL text of programs and statements.

* ``function_lines``: a program's ``CREATE OR REPLACE FUNCTION`` (its steps rendered as PL/pgSQL),
  its statements compiled by ``PLPGSQL``: parameters and variables as their PL/pgSQL names, every
  other bound value as a literal.
* ``psycopg_text``: a Core statement as text for the driver, with ``%(name)s`` parameters.

Each step is rendered the same way wherever it stands, so the function text reads as the steps
were written: a ``Fetch`` is its statement ``INTO`` its variables, a ``When`` an ``IF``, a
``ForEach`` a ``FOR … LOOP``, a ``Collect`` an ``array_agg`` of its rows into one array per
column, a ``Sum`` the sum of what its statement returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, func, literal_column, select
from sqlalchemy.dialects.postgresql import DOMAIN, array
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.elements import Label
from sqlalchemy.sql.expression import Select
from sqlalchemy.types import TypeEngine

from metering.programs.steps import (
    Assign,
    Collect,
    Emit,
    Fetch,
    ForEach,
    Records,
    Return,
    Returns,
    Run,
    Step,
    Sum,
    Var,
    When,
)


class PlpgsqlCompiler(PGCompiler_psycopg):
    """Variables as their PL/pgSQL names, every other bound value as a literal."""

    def visit_bindparam(self, bindparam: Any, **kw: Any) -> Any:  # type: ignore[override]
        if bindparam.key.startswith(("p_", "v_")):
            return bindparam.key
        kw["literal_binds"] = True
        return super().visit_bindparam(bindparam, **kw)


class _PlpgsqlDialect(PGDialect_psycopg):
    statement_compiler = PlpgsqlCompiler


class PsycopgCompiler(PGCompiler_psycopg):
    """Named parameters as ``%(name)s``, values written in the statement as literals."""

    def visit_bindparam(self, bindparam: Any, **kw: Any) -> Any:  # type: ignore[override]
        if bindparam.unique:
            kw["literal_binds"] = True
        return super().visit_bindparam(bindparam, **kw)


class _PsycopgDialect(PGDialect_psycopg):
    statement_compiler = PsycopgCompiler


# The dialect a program's statements compile with (a Citus cluster's one-account programs
# have their own: metering.citus.one_account).
PLPGSQL: Any = _PlpgsqlDialect(paramstyle="named")
_PSYCOPG = _PsycopgDialect()


def psycopg_text(statement: ClauseElement) -> str:
    """A Core statement as PostgreSQL text with ``%(name)s`` parameters, for the driver: built
    once at import, so a hot path neither compiles nor looks up a compiled form (SQLAlchemy's
    execution layer costs about 70 µs of Python per statement, twice the driver's own)."""
    return str(statement.compile(dialect=_PSYCOPG))


@dataclass(frozen=True, slots=True)
class Positional:
    """A statement's driver text with ``$n`` parameters (``positional``), and the names of the
    values they take, in order."""

    text: str
    names: tuple[str, ...]

    def params(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[name] for name in self.names]


_NAMED = re.compile(r"%\((\w+)\)s")


def positional(text: str) -> Positional:
    """``text`` (with ``%(name)s`` parameters, as ``psycopg_text`` writes them) with ``$n``
    parameters instead, for a raw cursor (``psycopg.AsyncRawCursor``), which sends it as it
    is: psycopg converts a named statement at every call when it is longer than it caches
    (4 kB), a regular expression's pass over the whole text."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return Positional(_NAMED.sub(number, text).replace("%%", "%"), tuple(names))


def _one_row_returning(step: Collect) -> Any:
    """A one-row ``Collect``'s DML statement returning each column as an array of one (its
    ``largest`` column as it is, after them), in ``into``'s order."""
    statement: Any = step.statement
    columns = {
        str(column.key): column.element if isinstance(column, Label) else column
        for column in statement._returning
    }
    one = statement._generate()
    one._returning = ()
    largest = [] if step.largest is None else [columns[step.largest[0]]]
    return one.returning(*(array([column]) for column in columns.values()), *largest)


def pg_type(kind: TypeEngine[Any]) -> str:
    return str(PLPGSQL.type_compiler_instance.process(kind))


def signature_type(kind: TypeEngine[Any]) -> str:
    """The PostgreSQL type of a function's parameter or result column: a column's domain
    (metering.models.base) as its data type. A function whose signature named a domain would
    depend on it, and a migration's downgrade could not drop the domain under the function
    (``metering migrate`` installs the functions after the migrations)."""
    domain = getattr(kind, "_variant_mapping", {}).get("postgresql", kind)
    return pg_type(domain.data_type if isinstance(domain, DOMAIN) else kind)


def array_type(kind: TypeEngine[Any]) -> str:
    """The PostgreSQL type of an array of ``kind`` (a column of ``Records.by_column``), its
    strings of no declared length: an explicit cast to ``VARCHAR(n)`` cuts a longer value
    short, where the JSON document's reading (and a column's assignment) refuses it."""
    return pg_type(String() if isinstance(kind, String) else kind) + "[]"


def function_params(param: Var | Records) -> list[tuple[str, str]]:
    """The function's parameters of a program's parameter, each name and PostgreSQL type: rows
    are one ``json`` document, or one array per column (``Records.by_column``)."""
    if not isinstance(param, Records):
        return [(param.name, signature_type(param.type))]
    if param.by_column:
        return [(param.column_param(n), array_type(t)) for n, t in param.columns]
    return [(param.name, "json")]


def result_type(returns: Returns) -> str:
    """What a program's function returns, as its ``RETURNS`` clause says it."""
    if returns is None:
        return "void"
    if isinstance(returns, TypeEngine):
        return signature_type(returns)
    return "TABLE (" + ", ".join(f"{n} {signature_type(t)}" for n, t in returns) + ")"


def function_lines(
    *,
    name: str,
    params: Sequence[Var | Records],
    returns: Returns,
    settings: Mapping[str, str],
    initial: Mapping[str, Any],
    steps: Sequence[Step],
    dialect: Any,
) -> list[tuple[str, Step | None]]:
    """A program's PL/pgSQL function, line by line, each line with the step it renders (None
    for the function's own lines: its signature, declarations, ``BEGIN`` and ``END``)."""
    declared: dict[str, str] = {}
    for variable, kind in _declarations(steps):
        declared.setdefault(variable, kind)
    for param in params:
        declared.pop(param.name, None)
    arguments = ", ".join(f"{n} {kind}" for p in params for n, kind in function_params(p))
    lines = [
        f"CREATE OR REPLACE FUNCTION {name}({arguments})",
        f"RETURNS {result_type(returns)}",
        *(
            ("LANGUAGE plpgsql VOLATILE AS $$",)
            if not settings
            else (
                "LANGUAGE plpgsql VOLATILE",
                *(f"SET {setting} = {value}" for setting, value in settings.items()),
                "AS $$",
            )
        ),
        "#variable_conflict use_column",
    ]
    if declared:
        lines.append("DECLARE")
        for variable, kind in declared.items():
            value = initial.get(variable)
            default = "" if value is None else f" := {_pg_literal(value)}"
            lines.append(f"    {variable} {kind}{default};")
    lines.append("BEGIN")
    owned: list[tuple[str, Step | None]] = [(line, None) for line in lines]
    owned += _render(steps, returns, 1, dialect)
    owned += [("END;", None), ("$$", None)]
    return owned


def _pg_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no literal for {value!r}")


def _declarations(steps: Iterable[Step]) -> Iterable[tuple[str, str]]:
    for step in steps:
        targets: tuple[Var, ...] = ()
        if isinstance(step, Fetch | ForEach):
            targets = step.into
        elif isinstance(step, Assign):
            targets = (step.into,)
        elif isinstance(step, Sum):
            targets = (step.into,) if step.count is None else (step.into, step.count)
        elif isinstance(step, Collect):
            for name, kind in step.into.columns:
                yield step.into.array(name), f"{pg_type(kind)}[]"
            if step.largest is not None:
                targets = (step.largest[1],)
        for target in targets:
            yield target.name, pg_type(target.type)
        if isinstance(step, When):
            yield from _declarations(step.then)
            yield from _declarations(step.otherwise)
        elif isinstance(step, ForEach):
            yield from _declarations(step.steps)


def _indent(text_: str, depth: int) -> list[str]:
    pad = "    " * depth
    return [(pad + line).rstrip() for line in text_.splitlines()]


def _owned(step: Step, text_: str, depth: int) -> list[tuple[str, Step]]:
    return [(line, step) for line in _indent(text_, depth)]


def _render(
    steps: Iterable[Step], returns: Returns, depth: int, dialect: Any
) -> list[tuple[str, Step]]:
    """The lines of ``steps``, each with the step it belongs to."""

    def _sql(element: ClauseElement) -> str:
        return str(element.compile(dialect=dialect))

    lines: list[tuple[str, Step]] = []
    for step in steps:
        if isinstance(step, Run):
            sql = _sql(step.statement)
            if isinstance(step.statement, Select):
                assert sql.startswith("SELECT "), sql
                sql = "PERFORM " + sql[len("SELECT ") :]
            lines += _owned(step, sql + ";", depth)
        elif isinstance(step, Fetch):
            into = ", ".join(v.name for v in step.into)
            lines += _owned(step, f"{_sql(step.statement)}\nINTO {into};", depth)
            if step.required is not None:
                message = step.required.replace("'", "''")
                lines += _owned(
                    step, f"IF NOT FOUND THEN\n    RAISE EXCEPTION '{message}';\nEND IF;", depth
                )
        elif isinstance(step, Sum):
            counted = "" if step.count is None else ", count(*)"
            into = step.into.name if step.count is None else f"{step.into.name}, {step.count.name}"
            sql = (
                f"WITH summed AS (\n{_sql(step.statement)}\n)\n"
                f"SELECT coalesce(sum(summed.{step.column}), 0){counted} INTO {into} FROM summed;"
            )
            lines += _owned(step, sql, depth)
        elif isinstance(step, Assign):
            lines += _owned(step, f"{step.into.name} := {_sql(step.expression)};", depth)
        elif isinstance(step, Collect):
            kinds = dict(step.into.columns)
            order = ", ".join(
                f'collected.{name} COLLATE "C"'
                if isinstance(kinds[name], String)
                else f"collected.{name}"
                for name in step.order_by
            )
            order_by = f" ORDER BY {order}" if order else ""
            aggregates = ", ".join(
                f"array_agg(collected.{name}{order_by})" for name, _ in step.into.columns
            )
            into = ", ".join(step.into.array(name) for name, _ in step.into.columns)
            if step.largest is not None:
                aggregates += f", max(collected.{step.largest[0]})"
                into += f", {step.largest[1].name}"
            source = _sql(step.statement)
            if step.one_row:
                sql = f"{_sql(_one_row_returning(step))}\nINTO {into};"
            elif source.startswith("WITH "):
                # Its CTEs may write, and a CTE that writes must be at the top: the statement
                # read as a subquery (a SELECT) or a CTE (DML), the compiler putting every CTE
                # at the top, and INTO at the end.
                assert not step.order_by and step.largest is None
                collected = (
                    step.statement.subquery("collected")
                    if isinstance(step.statement, Select)
                    else step.statement.cte("collected")  # type: ignore[attr-defined]
                )
                wrapped: Any = select(
                    *(
                        func.array_agg(literal_column(f"collected.{name}"))
                        for name, _ in step.into.columns
                    )
                ).select_from(collected)
                sql = f"{_sql(wrapped)}\nINTO {into};"
            elif isinstance(step.statement, Select):
                sql = f"SELECT {aggregates} INTO {into}\nFROM (\n{source}\n) AS collected;"
            else:
                sql = (
                    f"WITH collected AS (\n{source}\n)\n"
                    f"SELECT {aggregates} INTO {into} FROM collected;"
                )
            lines += _owned(step, sql, depth)
        elif isinstance(step, When):
            lines += _owned(step, f"IF {_sql(step.condition)} THEN", depth)
            lines += _render(step.then, returns, depth + 1, dialect)
            if step.otherwise:
                lines += _owned(step, "ELSE", depth)
                lines += _render(step.otherwise, returns, depth + 1, dialect)
            lines += _owned(step, "END IF;", depth)
        elif isinstance(step, ForEach):
            into = ", ".join(v.name for v in step.into)
            lines += _owned(step, f"FOR {into} IN\n{_sql(step.statement)}\nLOOP", depth)
            lines += _render(step.steps, returns, depth + 1, dialect)
            lines += _owned(step, "END LOOP;", depth)
        elif isinstance(step, Emit):
            assert isinstance(returns, Sequence) and not isinstance(returns, TypeEngine)
            for (name, _), value in zip(returns, step.values, strict=True):
                lines += _owned(step, f"{name} := {_sql(value)};", depth)
            lines += _owned(step, "RETURN NEXT;", depth)
        elif isinstance(step, Return):
            lines += _owned(step, f"RETURN {_sql(step.value)};", depth)
        else:  # pragma: no cover - the Step union is closed
            raise TypeError(step)
    return lines
