"""One statement or program in the form each kind of database runs, chosen in one place.

A statement of the ingest (a Core statement built by a function of the backend) or a program
has three forms, made once at import:

* on SQLite, the Core statement run through SQLAlchemy (a program: interpreted, ``Program.run``);
* on PostgreSQL, its text for the driver, run on the session's own psycopg connection
  (``metering.db.driver_connection``: none of SQLAlchemy's per-statement work);
* on a Citus cluster, for one account's rows, its one-account text (metering.citus.one_account:
  routed whole to the account's shard); without an account, PostgreSQL's.

``Forms.rows`` runs the form of the session's database kind (``metering.db.Kind``, decided when
its ``Database`` was made), its parameters written for that backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from metering import programs as p
from metering.citus.one_account import ACCOUNT, text_of_account
from metering.db import Kind, driver_connection, kind_of

# A statement's or program's parameters, written for a backend (rows as it reads them).
Params = Callable[[p.Backend], Mapping[str, Any]]


@dataclass(frozen=True)
class Forms:
    """The three forms (see the module): ``sqlite`` runs on a connection with parameters."""

    sqlite: Callable[[Connection, Mapping[str, Any]], Sequence[Any] | None]
    postgresql: str
    citus: str

    @classmethod
    def of_statement(cls, build: Callable[[p.Backend], Any]) -> Forms:
        """The forms of the statement ``build`` makes for a backend."""
        statement = build(p.SQLITE)
        return cls(
            lambda connection, params: connection.execute(statement, params).all(),
            p.psycopg_text(build(p.POSTGRESQL)),
            text_of_account(build(p.POSTGRESQL)),
        )

    @classmethod
    def of_program(cls, program: p.Program, of_account: p.Program) -> Forms:
        """A program's forms: interpreted, its function's call, its one-account form's."""
        return cls(
            lambda connection, params: program.run(connection, **params),
            program.call_sql,
            of_account.call_sql,
        )

    def rows(self, session: Session, params: Params, account_id: str | None = None) -> Any:
        """Run the form of the session's database in its transaction: the rows it returns (a
        program's result on SQLite). ``account_id`` (a Citus cluster): every row it reads or
        writes is that account's."""
        if kind_of(session) is Kind.SQLITE:
            assert account_id is None, "one account's form is a Citus cluster's"
            return self.sqlite(session.connection(), params(p.SQLITE))
        driver = driver_connection(session)
        if account_id is None:
            return driver.execute(self.postgresql, params(p.POSTGRESQL)).fetchall()
        assert kind_of(session) is Kind.CITUS, "one account's form is a Citus cluster's"
        values = {**params(p.POSTGRESQL), ACCOUNT.name: account_id}
        return driver.execute(self.citus, values).fetchall()
