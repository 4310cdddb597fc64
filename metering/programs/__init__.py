"""Write transactions defined once, run on every backend.

A **program** (``Program``) is one unit of work written as an ordered list of steps over
SQLAlchemy Core statements (metering.programs.steps): run a statement, fetch a row into
variables, sum what a statement returns, collect rows, branch, loop over rows, emit a result row.
The same definition

* runs on SQLite step by step, inside the caller's transaction (``Program.run``:
  metering.programs.sqlite), and
* is compiled, with the PostgreSQL dialect, into the body of a PL/pgSQL function
  (``Program.plpgsql``: metering.programs.plpgsql), so that on PostgreSQL the whole unit is one
  round trip and its row locks are held only while the function runs and commits.

Nothing of a rule is typed twice: the statements are Core objects built from the tables, the
control flow is data, the function text is generated, and where the backends must differ the
definition says so in one construct (``Backend.choose``: metering.programs.backends). A test
holds every function in the database equal to what the current definition produces
(tests/test_functions.py); docs/architecture.md tells how to change a program.
"""

from sqlalchemy import Boolean

from metering.programs.backends import (
    ONE_SHARD,
    POSTGRESQL,
    SQLITE,
    Backend,
    arrays_encoder,
    backend,
    records_encoder,
    records_json,
)
from metering.programs.expressions import byte_order, greatest, json_row
from metering.programs.plpgsql import Positional, positional, psycopg_text
from metering.programs.program import Program
from metering.programs.sqlite import ProgramError
from metering.programs.steps import (
    Assign,
    Collect,
    Emit,
    Fetch,
    ForEach,
    Records,
    Return,
    RowColumns,
    Rows,
    Run,
    Step,
    Sum,
    Var,
    When,
)

__all__ = [
    "ONE_SHARD",
    "POSTGRESQL",
    "SQLITE",
    "Assign",
    "Backend",
    "Boolean",
    "Collect",
    "Emit",
    "Fetch",
    "ForEach",
    "Positional",
    "Program",
    "ProgramError",
    "Records",
    "Return",
    "RowColumns",
    "Rows",
    "Run",
    "Step",
    "Sum",
    "Var",
    "When",
    "arrays_encoder",
    "backend",
    "byte_order",
    "greatest",
    "json_row",
    "positional",
    "psycopg_text",
    "records_encoder",
    "records_json",
]
