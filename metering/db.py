"""Engine, sessions and the unit of work: the one place transactions begin and commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The session's own psycopg connection, inside the session's transaction.

    The ingest's statements go straight to the driver: SQLAlchemy's execution layer (statement
    cache key, execution context, result wrapping) costs about 70 µs of Python per statement,
    twice the driver's own, which a single-event request pays on every round trip."""
    connection = session.connection().connection.driver_connection
    assert isinstance(connection, psycopg.Connection)
    return connection


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _configure_sqlite(engine)
        return engine
    return create_engine(
        url,
        # A fixed pool: a process never opens more than pool_size connections here (plus as
        # many for the gateway's async routes), so several processes fit max_connections.
        pool_size=pool_size,
        max_overflow=0,
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


class AsyncDriverPool:
    """psycopg ``AsyncConnection``s in autocommit, for request handlers that run on the event
    loop (PostgreSQL): at most ``size`` in use at once, idle ones kept for reuse, one that lost
    its server discarded. Without a thread-pool hop per request and with the loop waiting on
    every socket at once, a statement costs markedly less CPU than through a worker thread.

    Connections and the slot count belong to one event loop: a uvicorn worker has one for its
    lifetime; should another loop ever use the pool (tests), it starts a fresh set."""

    def __init__(self, connect_kwargs: dict[str, Any], size: int) -> None:
        self._connect_kwargs = connect_kwargs
        self._size = size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self.close()
            self._loop, self._slots = loop, asyncio.Semaphore(self._size)
        idle = self._idle
        async with self._slots:
            if idle:
                connection = idle.pop()
            else:
                connection = await psycopg.AsyncConnection.connect(
                    **self._connect_kwargs, autocommit=True
                )
            try:
                yield connection
            finally:
                # Back only if it is idle and still this loop's (never mid-statement, e.g. when
                # the request was cancelled). One the server dropped is discarded, and so are
                # the idle ones: a restart or failover has dropped them too.
                status = connection.info.transaction_status
                if status == psycopg.pq.TransactionStatus.IDLE and idle is self._idle:
                    idle.append(connection)
                else:
                    if connection.closed and idle is self._idle:
                        self.close()
                    connection.pgconn.finish()

    def close(self) -> None:
        """Close the idle connections (those in use are closed as they come back)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.pgconn.finish()


@dataclass
class Database:
    engine: Engine
    sessionmaker: sessionmaker[Session]
    _async_pool: AsyncDriverPool | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = 10) -> Database:
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

    def async_driver_autocommit(
        self,
    ) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """``async with``: a psycopg ``AsyncConnection`` in autocommit (PostgreSQL only) from
        this database's ``AsyncDriverPool``, sized like the engine's pool. Every statement is
        its own transaction, with no BEGIN or COMMIT round trips and none of SQLAlchemy's
        per-statement work: for hot routes whose work is one statement at a time."""
        if self._async_pool is None:
            _args, kwargs = self.engine.dialect.create_connect_args(self.engine.url)
            self._async_pool = AsyncDriverPool(dict(kwargs), self.engine.pool.size())  # type: ignore[attr-defined]
        return self._async_pool.connection()

    def dispose(self) -> None:
        if self._async_pool is not None:
            self._async_pool.close()
        self.engine.dispose()
