"""Engine, sessions and the unit of work: the one place transactions begin and commit.

* ``unit_of_work()``: a write transaction; it rolls back unless the block commits it
  (``session.commit()``), in exactly one place: the request's session dependency, or the job or
  command that opened it.
* ``reading()``: a read-only transaction, always rolled back (on SQLite it never takes the write
  lock, so readers never wait for writers).
* ``run(steps, …)``: a unit of work written as steps (a generator of calls on a backend
  adapter: see metering.ledger.authorizations), for the gateway's hot paths.

Which database it is (``Kind``: SQLite, PostgreSQL, or a Citus coordinator) is decided once, when
the ``Database`` is made (``Database.kind``), and every session it opens carries it
(``kind_of``): nothing asks the database again, least of all on a request's path. A server may
start before its database answers (``/healthz`` up, ``/readyz`` 503): then the first connection
that reaches it decides, once.

On a Citus cluster ``METERING_DATABASE_URL`` may name every node (``?host=h1:p1&host=h2:p2…``,
the coordinator first, and ``load_balance_hosts=random``): the gateway's one-statement calls
(``run``: authorizations, voids, single events) then go each to the node that holds its
account, over a pool of connections per node (metering.nodes); sessions, migrations and the
kind's probe go to the first host, the coordinator (``coordinator_url``), where DDL, advisory
locks and the coordinator's own tables are.

SQLite (the embedded default) has one writer at a time. Writers take turns here, in the process
(a lock) and across processes (a file lock beside the database), before ``BEGIN IMMEDIATE``, so
they queue in the kernel instead of polling SQLite's busy handler; readers use plain ``BEGIN``
(WAL: a reader sees a snapshot and never blocks a writer). ``synchronous=FULL``: a commit is on
disk before it is acknowledged (a billing database must not lose acknowledged events on power
loss).
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Connection, Engine, create_engine, event, func, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from metering.kit.errors import DatabaseUnavailable, MeteringError
from metering.kit.ranges import fits
from metering.nodes import (
    Executes,
    Node,
    RoutedConnection,
    Routes,
    listed_nodes,
    node_kwargs,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
# How long a request waits for one of the async pool's connections before it fails (503).
POOL_TIMEOUT_SECONDS = 3.0
# How long a unit of work waits for the database (a connection of the engine's pool; on SQLite
# the writer's turn) before it is refused 503 ``database_unavailable`` (METERING_DB_WAIT_SECONDS).
WAIT_SECONDS = 10.0
# SQLite: the threads that run a request's blocking writes which take the writer's turn
# themselves (``Database.in_writer_thread``), apart from the request pool.
WRITER_THREADS = 4
# A step of a unit of work written as a generator: called with the backend's adapter, it returns
# the step's result (awaitable on PostgreSQL).
Step = Callable[[Any], Any]
Steps = Generator[Step, Any, T]


def unreachable(exc: BaseException) -> bool:
    """Whether an error means the database could not be reached or dropped the connection (a
    restart, a failover, refused connections), or no connection of the pool became free in
    time (``WAIT_SECONDS``): answered 503 ``database_unavailable``, not 500. A serialization
    failure or deadlock is not one (those are retried where they can occur)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 5:
        if isinstance(current, PoolTimeout):
            return True
        if isinstance(current, psycopg.OperationalError) and not isinstance(
            current, psycopg.errors.TransactionRollback
        ):
            return True
        if isinstance(current, DBAPIError) and current.connection_invalidated:
            return True
        current = getattr(current, "orig", None) or current.__cause__
        seen += 1
    return False


# The refusals that say nothing about the work, only about its timing (another transaction's
# locks): a deadlock, a serialization failure, a lock not available (PostgreSQL), and SQLite's
# "database is locked". The work is then tried again whole, never in parts (``retry_transient``).
_TRANSIENT_SQLSTATES = frozenset({"40P01", "40001", "55P03"})
# Attempts of a unit of work refused for a transient reason, then 503 (the gateway retries the
# request with the same request ids, which deduplicate), and the backoff before each new one:
# uniform in [0, base × 2^(attempt-1)] seconds (jittered, so that two victims of the same
# deadlock do not meet again at the same instant).
TRANSIENT_ATTEMPTS = 4
TRANSIENT_BACKOFF_SECONDS = 0.05


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (a driver's error, or SQLAlchemy's wrapping one, or a chain of them) is a
    transient refusal: the same work may succeed when tried again from the start."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 5:
        if getattr(current, "sqlstate", None) in _TRANSIENT_SQLSTATES:
            return True
        if type(current).__module__ == "sqlite3" and "database is locked" in str(current):
            return True
        current = getattr(current, "orig", None) or current.__cause__
        seen += 1
    return False


class Transient(Exception):
    """A unit of work refused for a transient reason (``transient``), raised out of it so that
    it rolls back whole and ``retry_transient`` tries it again from the start."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error).strip().splitlines()[0] if str(error).strip() else "")
        self.error = error


def retry_transient(work: Callable[[], T], what: str, attempts: int = TRANSIENT_ATTEMPTS) -> T:
    """Run ``work`` (a whole unit of work: it begins, and commits or rolls back, its own
    transaction), again from the start when the database refuses it for a transient reason (a
    ``Transient``, or a driver's error that ``transient`` recognises), up to ``attempts`` times
    with jittered exponential backoff; then 503 ``database_unavailable``. Any other error is
    the caller's. ``what`` names the work in the log."""
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except Exception as exc:
            error = exc.error if isinstance(exc, Transient) else exc
            if not isinstance(exc, Transient) and not transient(exc):
                raise
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            if attempt == attempts:
                log.warning("%s refused %d times, last: %s", what, attempts, reason)
                raise DatabaseUnavailable(
                    "the database is busy with concurrent writes; try again shortly"
                ) from error
            log.info(
                "%s refused (attempt %d of %d), tried again: %s", what, attempt, attempts, reason
            )
            time.sleep(random.uniform(0, TRANSIENT_BACKOFF_SECONDS * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")


class Kind(StrEnum):
    """Which database a ``Database`` works on: what decides the form of its statements and
    programs (metering.programs; a cluster's one-account forms: metering.citus)."""

    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"
    CITUS = "citus"  # a Citus coordinator: account data sharded by account


# Whether a PostgreSQL database is a Citus coordinator (has the extension).
_CITUS_PROBE = "SELECT count(*) > 0 FROM pg_extension WHERE extname = 'citus'"


def probe(connection: Connection) -> Kind:
    """The kind of the database ``connection`` is to: the one place that asks (one query on
    PostgreSQL). ``Database.from_url`` asks it once; ``metering migrate`` asks it of the
    database it distributes (metering.citus.distribution)."""
    if connection.dialect.name == "sqlite":
        return Kind.SQLITE
    return Kind.CITUS if connection.execute(text(_CITUS_PROBE)).scalar() else Kind.POSTGRESQL


class _Decided:
    """A database's kind, once decided: at start-up when the database answers then, else by the
    first connection that reaches it."""

    __slots__ = ("kind",)

    def __init__(self, kind: Kind | None) -> None:
        self.kind = kind

    def on(self, connection: Connection) -> Kind:
        if self.kind is None:
            self.kind = probe(connection)
        return self.kind


# Where a session of a ``Database`` carries its kind (``Session.info``).
_KIND = "metering.kind"


def kind_of(session: Session) -> Kind:
    """The kind of a session's database, as decided when its ``Database`` was made (or by its
    first connection, when the database did not answer then)."""
    decided: _Decided = session.info[_KIND]
    return decided.kind or decided.on(session.connection())


def is_postgresql(session: Session) -> bool:
    """Whether a session's database is PostgreSQL (a Citus coordinator included)."""
    return kind_of(session) is not Kind.SQLITE


def is_cluster(session: Session) -> bool:
    """Whether a session's database is a Citus coordinator."""
    return kind_of(session) is Kind.CITUS


class _ExactSum:
    """SQLite's aggregate ``exact_sum``: the total of integers as a Python integer, handed back
    as an integer within the 64-bit range and as its decimal text beyond it (which no stored
    value equals: a mismatch, named with its exact value)."""

    def __init__(self) -> None:
        self.total: int | None = None

    def step(self, value: int | None) -> None:
        if value is not None:
            self.total = (self.total or 0) + value

    def finalize(self) -> int | str | None:
        if self.total is None or fits(self.total):
            return self.total
        return str(self.total)


_EXACT_SUM = "exact_sum"


def exact_sum(session: Session, value: Any) -> Any:
    """The exact sum of ``value`` in ``session``'s statements, for the checks that reconcile
    stored totals (``metering verify``): PostgreSQL's ``sum`` (a bigint's is numeric); on
    SQLite, whose ``sum()`` refuses a total beyond the 64-bit range (``integer overflow``),
    ``exact_sum`` (made known to each connection as it opens: ``_configure_sqlite``)."""
    if is_postgresql(session):
        return func.sum(value)
    return getattr(func, _EXACT_SUM)(value)


def driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The session's own psycopg connection, inside the session's transaction.

    The ingest's statements go straight to the driver: SQLAlchemy's execution layer (statement
    cache key, execution context, result wrapping) costs about 70 µs of Python per statement,
    twice the driver's own, which a single-event request pays on every round trip."""
    connection = session.connection().connection.driver_connection
    assert isinstance(connection, psycopg.Connection)
    return connection


def coordinator_url(url: str) -> str:
    """``url`` with only its first host when it spreads connections over several
    (``load_balance_hosts`` with ``?host=h1:p1&host=h2:p2…`` or libpq's
    ``?host=h1,h2&port=p1,p2``): the coordinator of a cluster whose every node it names, the
    coordinator first; any other URL unchanged (a list of hosts without it is libpq's
    failover, kept whole). What must run on the coordinator (DDL, the migrations and the
    schema's distribution, advisory locks, the coordinator's own tables) connects here."""
    if url.startswith("sqlite"):
        return url
    parsed = make_url(url)
    hosts = parsed.query.get("host")
    if hosts is None or "load_balance_hosts" not in parsed.query:
        return url
    listed = [
        h for value in ([hosts] if isinstance(hosts, str) else hosts) for h in value.split(",")
    ]
    ports = parsed.query.get("port")
    port = (ports if isinstance(ports, str) else ports[0]).split(",")[0] if ports else None
    first = listed[0] if port is None or ":" in listed[0] else f"{listed[0]}:{port}"
    query = {
        key: value
        for key, value in parsed.query.items()
        if key not in ("host", "port", "load_balance_hosts")
    }
    return parsed.set(query={**query, "host": first}).render_as_string(hide_password=False)


def make_engine(
    url: str, *, pool_size: int = 10, writer: bool = True, wait_seconds: float = WAIT_SECONDS
) -> Engine:
    """An engine; on SQLite, ``writer`` picks the one whose transactions take the write lock
    (``BEGIN IMMEDIATE``) or the one that reads (``BEGIN``). Elsewhere a checkout waits at
    most ``wait_seconds`` for a connection of the pool, then fails (answered 503
    ``database_unavailable``: ``unreachable``)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _configure_sqlite(engine, immediate=writer)
        return engine
    return create_engine(
        url,
        # A fixed pool: a process never opens more than pool_size connections here (plus as
        # many for the gateway's async routes), so several processes fit max_connections.
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=wait_seconds,
        pool_recycle=1800,
        # psycopg prepares a statement server-side after its 5th use (its default), which saves
        # PostgreSQL the parse and plan of every hot-path query.
    )


def _configure_sqlite(engine: Engine, *, immediate: bool) -> None:
    """WAL, foreign keys, and BEGIN IMMEDIATE for writers: SQLite then serialises writers up
    front, which makes every check-then-write atomic (the pysqlite recipe from SQLAlchemy's
    docs)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Only for writers outside this service's turns (a tool of the operator's): ours queue
        # on the file lock first (``_Writers``).
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()
        dbapi_connection.create_aggregate(_EXACT_SUM, 1, _ExactSum)

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)


class _Waiter:
    """A writer waiting for its turn: a thread (``event``) or a task on an event loop
    (``future``, resolved through its loop)."""

    __slots__ = ("event", "future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.event = threading.Event() if loop is None else None
        self.future: asyncio.Future[None] | None = None if loop is None else loop.create_future()
        self.granted = False

    def grant(self) -> bool:
        """Hand it the turn (under the writers' state lock): False when it can no longer take
        it (its event loop is closed)."""
        self.granted = True
        if self.event is not None:
            self.event.set()
            return True
        assert self.loop is not None and self.future is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:  # the loop is closed: nobody waits there any more
            self.granted = False
            return False
        return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # not given up meanwhile (it then passes the turn on itself)
        future.set_result(None)


def _busy() -> DatabaseUnavailable:
    return DatabaseUnavailable("the database is busy with other writes; try again shortly")


class _Writers:
    """SQLite's writers take turns: one at a time in the process, first come first served, and
    across the processes that share the file (``flock`` on ``<database>.writers``), so a writer
    waits in the kernel, woken when the previous one commits, never by polling.

    A request waits for its turn on the event loop (``turn_async``), never in the thread pool
    that runs the endpoints: the writer whose turn it is may need a thread of that pool to run
    its endpoint, and with every thread of it waiting for the turn it would never get one (a
    burst of about 45 writes wedged the server for good that way). Threads of their own (the
    scheduler's, a command's, the database's writer threads: ``Database.in_writer_thread``)
    wait in ``turn``. Nobody waits longer than ``wait_seconds``: then 503
    ``database_unavailable`` (``Retry-After``), the request refused rather than left hanging.
    The turn may end in another thread than it began (a request's commit runs in a thread of
    its own). A write transaction opened inside another one would wait for itself: none is."""

    def __init__(self, path: Path | None, wait_seconds: float) -> None:
        self._path = path
        self.wait_seconds = wait_seconds
        self._state = threading.Lock()  # guards _held and _waiting, held only briefly
        self._held = False
        self._waiting: deque[_Waiter] = deque()  # non-empty only while the turn is held
        self._fd: int | None = None

    @contextmanager
    def turn(self) -> Iterator[None]:
        """The turn, waited for in this thread."""
        self._take()
        fd = self._locked_file()
        try:
            yield
        finally:
            self._give(fd)

    @asynccontextmanager
    async def turn_async(self) -> AsyncIterator[None]:
        """The turn, waited for on the event loop."""
        await self._take_async()
        fd = await self._locked_file_async()
        try:
            yield
        finally:
            self._give(fd)

    def _take(self) -> None:
        with self._state:
            if not self._held:
                self._held = True
                return
            waiter = _Waiter()
            self._waiting.append(waiter)
        assert waiter.event is not None
        if waiter.event.wait(self.wait_seconds):
            return
        with self._state:
            if waiter.granted:  # just now
                return
            self._waiting.remove(waiter)
        raise _busy()

    async def _take_async(self) -> None:
        with self._state:
            if not self._held:
                self._held = True
                return
            waiter = _Waiter(asyncio.get_running_loop())
            self._waiting.append(waiter)
        assert waiter.future is not None
        try:
            await asyncio.wait_for(waiter.future, self.wait_seconds)
        except BaseException as error:  # timed out or cancelled
            with self._state:
                if not waiter.granted:
                    self._waiting.remove(waiter)
            if waiter.granted:  # granted as it gave up: passed on
                self._pass_on()
            if isinstance(error, TimeoutError):
                raise _busy() from None
            raise

    def _pass_on(self) -> None:
        """The turn to the next waiter, or free."""
        with self._state:
            while self._waiting:
                if self._waiting.popleft().grant():
                    return
            self._held = False

    def _locked_file(self) -> int | None:
        fd = self._file()
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                self._pass_on()
                raise
        return fd

    async def _locked_file_async(self) -> int | None:
        """The other processes' turns: the file lock, at once when it is free, else waited for
        in a thread of the event loop's executor (only the process's one turn holder waits
        there), at most ``wait_seconds``."""
        fd = self._file()
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        except BaseException:
            self._pass_on()
            raise
        locking = asyncio.get_running_loop().run_in_executor(None, fcntl.flock, fd, fcntl.LOCK_EX)
        try:
            await asyncio.wait_for(asyncio.shield(locking), self.wait_seconds)
            return fd
        except BaseException as error:
            # The thread may still take the lock: given back when it does, with the turn.
            def give_back(done: asyncio.Future[None]) -> None:
                self._give(fd if not done.cancelled() and done.exception() is None else None)

            locking.add_done_callback(give_back)
            if isinstance(error, TimeoutError):
                raise _busy() from None
            raise

    def _give(self, fd: int | None) -> None:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._pass_on()

    def _file(self) -> int | None:
        if self._path is None:
            return None
        if self._fd is None:
            self._fd = os.open(f"{self._path}.writers", os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _sqlite_path(url: str) -> Path | None:
    database = make_url(url).database
    return None if not database or database == ":memory:" else Path(database)


class AsyncDriverPool:
    """psycopg ``AsyncConnection``s in autocommit, for request handlers that run on the event
    loop (PostgreSQL), from ``psycopg_pool``'s ``AsyncConnectionPool`` (the psycopg project's
    own pool: sizing, waiting with a timeout, replacing a broken connection in the background,
    reconnecting after a restart). At most ``size`` in use at once. Without a thread-pool hop per
    request and with the loop waiting on every socket at once, a statement costs markedly less
    CPU than through a worker thread.

    A pool belongs to one event loop: a uvicorn worker has one for its lifetime; should another
    loop use it too (tests run several apps on one database), that loop gets a pool of its own,
    closed by that loop's shutdown. On a Citus cluster whose every node the URL names, a pool per
    node besides, for the calls of the accounts each holds (``routed``). When a statement meets
    a connection
    the server dropped, the idle ones are checked at once (a restart or failover has dropped
    them too), so that only that statement fails."""

    def __init__(self, connect_kwargs: dict[str, Any], size: int, cluster: bool = False) -> None:
        self._connect_kwargs = {**connect_kwargs, "autocommit": True}
        self._size = size
        # Every loop's own pools, each closed by its own loop's shutdown (a pool left open when
        # its loop ends leaves its workers to a cancellation that may never end); the last one
        # used is kept apart as the request path's one comparison. A pool per node of a
        # cluster whose every node the URL names (``routes``), else one (node None).
        self._pools: dict[tuple[asyncio.AbstractEventLoop, Node | None], AsyncConnectionPool[Any]]
        self._pools = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        listed = listed_nodes(connect_kwargs) if cluster else None
        # A Citus cluster's nodes, each call sent to its account's (metering.nodes).
        self.routes = Routes(listed) if listed else None

    async def _open(
        self, node: Node | None = None
    ) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        loop = asyncio.get_running_loop()
        pool = self._pools.get((loop, node))
        if pool is None:
            kwargs = self._connect_kwargs
            pool = AsyncConnectionPool(
                kwargs=kwargs if node is None else node_kwargs(kwargs, node),
                min_size=1,
                max_size=self._size,
                open=False,
                # A request waits this long for a connection, then fails (503
                # database_unavailable): with the database down, within seconds.
                timeout=POOL_TIMEOUT_SECONDS,
                max_idle=600,
                max_lifetime=1800,
            )
            self._pools[(loop, node)] = pool
            await pool.open(wait=False)
        if node is None:
            self._loop, self._pool = loop, pool
        return pool

    @asynccontextmanager
    async def connection(
        self, node: Node | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection (of ``node``'s pool, when given), returned to its pool after."""
        pool = self._pool if node is None and self._loop is asyncio.get_running_loop() else None
        if pool is None:
            pool = await self._open(node)
        # getconn/putconn rather than ``pool.connection()``, which also runs the connection's
        # own ``async with`` (commit or roll back a transaction) that an autocommit connection
        # never has: 11 µs less client CPU per checkout (docs/performance.md). putconn still
        # discards a connection left mid-statement (a cancelled request) or broken.
        connection = await pool.getconn()
        broken = False
        try:
            yield connection
        except psycopg.OperationalError:
            broken = connection.closed
            raise
        finally:
            await pool.putconn(connection)
            if broken:
                await pool.check()

    @asynccontextmanager
    async def routed(self) -> AsyncIterator[RoutedConnection]:
        """A unit of work's statements, each on its account's node (``routes``; metering.nodes),
        its connections returned to their pools after."""
        assert self.routes is not None
        async with AsyncExitStack() as held:
            yield RoutedConnection(
                self.routes, lambda node: held.enter_async_context(self.connection(node))
            )

    async def aclose(self) -> None:
        """Close this event loop's pools (a worker's shutdown, on its own loop)."""
        loop = asyncio.get_running_loop()
        mine = [key for key in self._pools if key[0] is loop]
        if loop is self._loop:
            self._pool = self._loop = None
        for key in mine:
            await self._pools.pop(key).close()

    def close(self) -> None:
        """Forget the pools (outside their loops: their connections close with the process)."""
        self._pools.clear()
        self._pool = self._loop = None


_Sessions = sessionmaker[Session]


def _sessions(engine: Engine, decided: _Decided) -> _Sessions:
    """Sessions of ``engine`` that carry the database's kind."""
    return sessionmaker(engine, expire_on_commit=False, autoflush=False, info={_KIND: decided})


@dataclass
class Database:
    engine: Engine
    sessionmaker: sessionmaker[Session]
    # Decided when it is made (``from_url``), or by its first connection when the database did
    # not answer then: every session it opens carries it (``kind_of``).
    decided: _Decided
    # SQLite: the engine whose transactions only read (plain BEGIN); on PostgreSQL ``engine``.
    read_engine: Engine | None = None
    _writers: _Writers | None = field(default=None, repr=False)
    # The URL as configured: on a cluster it may name every node, which the async pool spreads
    # its connections over (the engine is on the first, the coordinator: ``coordinator_url``).
    url: str | None = field(default=None, repr=False)
    _async_pool: AsyncDriverPool | None = field(default=None, init=False, repr=False)
    _readers: _Sessions | None = field(default=None, init=False, repr=False)
    _group: _Group | None = field(default=None, init=False, repr=False)
    _writer_threads: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_url(
        cls, url: str, *, pool_size: int = 10, wait_seconds: float = WAIT_SECONDS
    ) -> Database:
        """The database at ``url``; on PostgreSQL, whether it is a Citus coordinator is asked
        here, once (``probe``). ``wait_seconds``: how long a unit of work waits for a
        connection of the pool, or for SQLite's writer's turn, before it is refused (503).
        A URL naming several nodes of a cluster: the sessions on the first (the coordinator),
        the gateway's calls (``run``) spread over them all."""
        engine = make_engine(coordinator_url(url), pool_size=pool_size, wait_seconds=wait_seconds)
        if engine.dialect.name != "sqlite":
            decided = _Decided(None)
            try:
                with engine.connect() as connection:
                    decided.on(connection)
            except DBAPIError as exc:
                if not unreachable(exc):
                    raise
                log.warning("the database does not answer yet: its kind is decided on first use")
            engine.dispose()  # the probe's connection is not kept open in the pool
            return cls(engine, _sessions(engine, decided), decided, url=url)
        sqlite = _Decided(Kind.SQLITE)
        return cls(
            engine,
            _sessions(engine, sqlite),
            sqlite,
            read_engine=make_engine(url, writer=False),
            _writers=_Writers(_sqlite_path(url), wait_seconds),
        )

    @property
    def kind(self) -> Kind:
        """SQLite, PostgreSQL or a Citus coordinator (asked of the database at most once)."""
        decided = self.decided
        if decided.kind is None:
            with self.engine.connect() as connection:
                return decided.on(connection)
        return decided.kind

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def reader(self) -> Engine:
        return self.read_engine or self.engine

    @contextmanager
    def unit_of_work(self) -> Iterator[Session]:
        """A write transaction: rolls back unless the block calls ``session.commit()``."""
        with self._turn(), self.sessionmaker() as session:
            yield session

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A read-only transaction, rolled back when the block ends."""
        with self.read_session() as session:
            yield session

    def read_session(self) -> Session:
        """A session whose transactions only read (``reading``, opened by its caller)."""
        if self._readers is None:
            self._readers = _sessions(self.reader, self.decided)
        return self._readers()

    @contextmanager
    def _turn(self) -> Iterator[None]:
        if self._writers is None:
            yield
            return
        with self._writers.turn():
            yield

    @asynccontextmanager
    async def writer_turn(self) -> AsyncIterator[None]:
        """``async with``: on SQLite the writer's turn, waited for on the event loop (never in
        the request thread pool, see ``_Writers``), for a unit of work whose session the block
        opens (``sessionmaker``) and ends; elsewhere nothing to wait for."""
        if self._writers is None:
            yield
            return
        async with self._writers.turn_async():
            yield

    async def in_writer_thread(self, work: Callable[..., T], *args: Any) -> T:
        """Run blocking ``work`` that takes the writer's turn itself (``unit_of_work``, once or
        more): on SQLite in one of the database's writer threads, so that it waits for the
        turn apart from the request thread pool, which the turn's holder may need (see
        ``_Writers``); elsewhere in that pool. Work queued longer than the turn's wait is
        refused (503) without running."""
        if self._writers is None:
            return await run_in_threadpool(work, *args)
        if self._writer_threads is None:
            self._writer_threads = ThreadPoolExecutor(WRITER_THREADS, "metering-writer")
        queued = time.monotonic()
        wait_seconds = self._writers.wait_seconds

        def run() -> T:
            if time.monotonic() - queued > wait_seconds:
                raise _busy()
            return work(*args)

        context = contextvars.copy_context()
        return await asyncio.wrap_future(self._writer_threads.submit(context.run, run))

    async def run(
        self,
        steps: Steps[T],
        *,
        postgresql: Callable[[Executes], Any],
        sqlite: Callable[[Any], Any] | None,
    ) -> T:
        """Drive a unit of work written as steps. On PostgreSQL each step is one statement on an
        autocommit connection: a server-side program is its own transaction, committed by the
        database when it returns (no BEGIN or COMMIT round trips). On SQLite the steps run in a
        write transaction shared with the units of work queued meanwhile in this process
        (``_Group``: one writer's turn and one durable commit for all), committed when they
        finish — or when they refuse the request (a ``MeteringError``), whose writes are kept as
        PostgreSQL keeps them; anything else rolls it back."""
        if self.dialect == "postgresql":
            async with self._statements() as connection:
                return await _drive_async(steps, postgresql(connection))
        assert sqlite is not None, "these steps run on PostgreSQL only"
        if self._group is None:
            self._group = _Group(self)
        return await self._group.run(steps, sqlite)

    def _statements(self) -> AbstractAsyncContextManager[Executes]:
        """What a unit of work's statements run on: on a Citus cluster whose every node the
        URL names, a ``RoutedConnection`` (each call on its account's node: metering.nodes);
        elsewhere one connection of the async pool."""
        pool = self._async_driver_pool()
        if pool.routes is not None:
            return pool.routed()
        return pool.connection()

    def async_driver_autocommit(
        self,
    ) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """``async with``: a psycopg ``AsyncConnection`` in autocommit (PostgreSQL only) from
        this database's ``AsyncDriverPool`` (psycopg_pool), sized like the engine's pool.
        Every statement is its own transaction, with no BEGIN or COMMIT round trips and none of
        SQLAlchemy's per-statement work: for hot routes whose work is one statement at a
        time."""
        return self._async_driver_pool().connection()

    def _async_driver_pool(self) -> AsyncDriverPool:
        if self._async_pool is None:
            url = make_url(self.url) if self.url else self.engine.url
            _args, kwargs = self.engine.dialect.create_connect_args(url)
            size = self.engine.pool.size()  # type: ignore[attr-defined]
            self._async_pool = AsyncDriverPool(dict(kwargs), size, self.kind is Kind.CITUS)
        return self._async_pool

    async def close_async_pool(self) -> None:
        if self._async_pool is not None:
            await self._async_pool.aclose()

    def dispose(self) -> None:
        if self._async_pool is not None:
            self._async_pool.close()
        self.engine.dispose()
        if self.read_engine is not None:
            self.read_engine.dispose()
        if self._writer_threads is not None:
            self._writer_threads.shutdown(wait=False)
            self._writer_threads = None
        if self._writers is not None:
            self._writers.close()


@dataclass
class _Job:
    """A unit of work waiting for its group's commit, and the event loop whose task awaits it."""

    steps: Steps[Any]
    adapter: Callable[[Any], Any]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None

    def settle(self) -> None:
        """Give the awaiting task its answer (from the group's thread)."""
        with suppress(RuntimeError):  # its loop is closed: nobody awaits it any more
            self.loop.call_soon_threadsafe(_settle, self.done, self.result, self.error)


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():  # its request was cancelled
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


class _Group:
    """SQLite's group commit for units of work written as steps (authorizations, voids).

    With ``synchronous=FULL`` every commit waits for the disk (a few ms), and SQLite has one
    writer at a time: under many concurrent requests, one transaction each made them queue for
    a commit each. Here the units of work that arrive while a group is waiting for its turn or
    running wait, then run together as the next group, each in its own savepoint (so each is
    decided as if alone, in arrival order, and one that fails is rolled back alone), with one
    commit for all: one writer's turn, one fsync. A refusal (``MeteringError``) keeps its
    writes, as alone. No request waits for more than the group before its own.

    The requests wait on the event loop; the groups run one after another in a thread of their
    own, started when the first unit of work arrives and ending when none is left, which waits
    for the writer's turn (never a thread of the request pool: see ``_Writers``). Nothing is
    decided on process memory: only the grouping lives here."""

    MAX_JOBS = 256

    def __init__(self, database: Database) -> None:
        self._database = database
        self._lock = threading.Lock()
        self._queue: list[_Job] = []
        self._running = False  # a thread runs the groups (False only while the queue is empty)

    async def run(self, steps: Steps[T], adapter: Callable[[Any], Any]) -> T:
        loop = asyncio.get_running_loop()
        job = _Job(steps, adapter, loop, loop.create_future())
        with self._lock:
            self._queue.append(job)
            start, self._running = not self._running, True
        if start:
            threading.Thread(target=self._run_groups, name="metering-group", daemon=True).start()
        result: T = await job.done
        return result

    def _run_groups(self) -> None:
        """Run the groups waiting, one after another, until none is left."""
        while True:
            with self._lock:
                jobs, self._queue = self._queue[: self.MAX_JOBS], self._queue[self.MAX_JOBS :]
                if not jobs:
                    self._running = False
                    return
            try:
                self._commit(jobs)
            except BaseException as error:  # the commit failed: so did every job of the group
                for job in jobs:
                    if job.error is None:
                        job.error = error
            for job in jobs:
                job.settle()

    def _commit(self, jobs: list[_Job]) -> None:
        with self._database.unit_of_work() as session:
            for job in jobs:
                savepoint = session.begin_nested()
                try:
                    job.result = _drive(job.steps, job.adapter(session.connection()))
                except MeteringError as refusal:
                    savepoint.commit()
                    job.error = refusal
                except Exception as error:
                    savepoint.rollback()
                    job.error = error
                else:
                    savepoint.commit()
            session.commit()


def _drive(steps: Steps[T], backend: Any) -> T:
    result = None
    try:
        while True:
            result = steps.send(result)(backend)
    except StopIteration as finished:
        return finished.value


async def _drive_async(steps: Steps[T], backend: Any) -> T:
    result = None
    try:
        while True:
            result = await steps.send(result)(backend)
    except StopIteration as finished:
        return finished.value
