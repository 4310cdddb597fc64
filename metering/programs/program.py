"""``Program``: a unit of work, its steps built for each backend, run on SQLite or called as its
PL/pgSQL function."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.types import TypeEngine

from metering.programs import plpgsql, sqlite
from metering.programs.backends import POSTGRESQL, SQLITE, Backend
from metering.programs.steps import Records, Returns, RowColumns, Step, Var


@dataclass
class Program:
    """A unit of work: ``name`` is its PostgreSQL function; ``returns`` its result columns (a
    set-returning program, rows emitted by ``Emit``), one type (a scalar ``Return``), or None;
    ``build`` makes its steps for a backend."""

    name: str
    params: tuple[Var | Records, ...]
    build: Callable[[Backend], Sequence[Step]]
    returns: Returns = None
    initial: Mapping[str, Any] = field(default_factory=dict)  # variables' starting values
    # PostgreSQL settings in force while the function runs (its ``SET`` clauses), e.g. the plan
    # cache's mode: nothing SQLite interprets.
    settings: Mapping[str, str] = field(default_factory=dict)
    # What its PL/pgSQL function is made of: its steps built for this backend, its statements
    # compiled with this dialect (a Citus cluster's one-account form has its own of both:
    # metering.citus.one_account).
    plpgsql_backend: Backend = POSTGRESQL
    plpgsql_dialect: Any = plpgsql.PLPGSQL

    def steps(self, on: Backend) -> tuple[Step, ...]:
        cache = self.__dict__.setdefault("_steps", {})
        if on not in cache:
            cache[on] = tuple(on_steps for on_steps in self.build(on))
        steps: tuple[Step, ...] = cache[on]
        return steps

    # -- PostgreSQL ------------------------------------------------------------------------------

    @cached_property
    def plpgsql(self) -> str:
        """``CREATE OR REPLACE FUNCTION …``: the program as PL/pgSQL."""
        return "\n".join(line for line, _ in self._plpgsql_lines) + "\n"

    def step_at(self, line: int) -> tuple[str, Step | None]:
        """The text of line ``line`` of the function's body, as a PL/pgSQL error's ``CONTEXT``
        counts them (line 1 is the line that ends with ``AS $$``), and the step it renders
        (None: a line of the function's own, its declarations, ``BEGIN`` or ``END``)."""
        lines = self._plpgsql_lines
        first = next(i for i, (text, _) in enumerate(lines) if text.endswith("AS $$"))
        if not 1 <= line < len(lines) - first:
            raise IndexError(f"{self.name} has no line {line}")
        return lines[first + line - 1]

    @cached_property
    def _plpgsql_lines(self) -> list[tuple[str, Step | None]]:
        return plpgsql.function_lines(
            name=self.name,
            params=self.params,
            returns=self.returns,
            settings=self.settings,
            initial=self.initial,
            steps=self.steps(self.plpgsql_backend),
            dialect=self.plpgsql_dialect,
        )

    @property
    def returned_columns(self) -> RowColumns | None:
        """The columns of the rows the function returns; None when it returns a value, or
        nothing."""
        if self.returns is None or isinstance(self.returns, TypeEngine):
            return None
        return self.returns

    @cached_property
    def call_sql(self) -> str:
        """The call, as psycopg text with ``%(p_…)s`` parameters."""
        args = ", ".join(
            f"%({name})s::{kind}" for p in self.params for name, kind in plpgsql.function_params(p)
        )
        if self.returned_columns is None:
            return f"SELECT {self.name}({args})"
        return f"SELECT * FROM {self.name}({args})"

    # -- SQLite ----------------------------------------------------------------------------------

    def run(self, connection: Connection, **params: Any) -> Any:
        """Run the steps inside the caller's transaction: the emitted rows (set-returning), the
        returned value (scalar) or None."""
        given = {p.name: params[p.name] for p in self.params}
        return sqlite.run(self.steps(SQLITE), connection, given, self.initial, self.returns)
