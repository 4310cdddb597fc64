"""Engine, sessions and the unit of work: the one place transactions begin and commit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, *, pool_size: int = 20) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _configure_sqlite(engine)
        return engine
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        # psycopg prepares a statement server-side after its 5th use (its default), which saves
        # PostgreSQL the parse and plan of every hot-path query.
    )


def _configure_sqlite(engine: Engine) -> None:
    """WAL, foreign keys, and BEGIN IMMEDIATE: SQLite then serialises writers up front, which
    makes every check-then-write atomic (the pysqlite recipe from SQLAlchemy's docs)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


@dataclass
class Database:
    engine: Engine
    sessionmaker: sessionmaker[Session]

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = 20) -> Database:
        engine = make_engine(url, pool_size=pool_size)
        return cls(engine, sessionmaker(engine, expire_on_commit=False, autoflush=False))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def unit_of_work(self) -> Iterator[Session]:
        """One transaction: commits when the block ends normally, rolls back otherwise."""
        with self.sessionmaker() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
