"""The event loop's connection pool behind the gateway's routes
(``Database.async_driver_autocommit``, PostgreSQL, psycopg_pool): connections are reused,
statements commit on their own, and after the server drops every connection (a restart, a
failover) only the statement that met a dead connection fails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from metering.db import Database
from tests.conftest import PG_MAINTENANCE_URL, fresh_pg_database

pytestmark = pytest.mark.usefixtures("needs_postgresql")


@pytest.fixture
def database() -> Iterator[Database]:
    with fresh_pg_database() as url:
        db = Database.from_url(url, pool_size=3)
        try:
            yield db
        finally:
            db.dispose()


def backends_of(url: str) -> set[int]:
    engine = create_engine(PG_MAINTENANCE_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            return {
                int(pid)
                for (pid,) in connection.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": make_url(url).database},
                )
            }
    finally:
        engine.dispose()


def cut_connections(url: str) -> None:
    engine = create_engine(PG_MAINTENANCE_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": make_url(url).database},
            )
    finally:
        engine.dispose()


async def pid(database: Database) -> Any:
    async with database.async_driver_autocommit() as connection:
        cursor = await connection.execute("SELECT pg_backend_pid()")
        return (await cursor.fetchone() or [None])[0]


def test_connections_are_reused_and_statements_commit_on_their_own(database: Database) -> None:
    url = database.engine.url.render_as_string(hide_password=False)

    async def scenario() -> set[Any]:
        async with database.async_driver_autocommit() as connection:
            await connection.execute("CREATE TABLE t (x integer)")
            await connection.execute("INSERT INTO t VALUES (1)")
        # Visible at once to another connection: each statement committed.
        engine = create_engine(url)
        try:
            with engine.connect() as other:
                assert other.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
        finally:
            engine.dispose()
        try:
            seen = [await pid(database) for _ in range(20)]
            # Twenty statements in turn: a connection or two (the pool opens its first in the
            # background and may add one while the first request waits), never one per
            # statement.
            assert len(set(seen)) <= 2
            assert set(seen) <= backends_of(url)
            return set(seen)
        finally:
            await database.close_async_pool()  # on its own loop, as a worker's shutdown does

    asyncio.run(scenario())


def test_after_the_server_drops_them_only_one_statement_fails(database: Database) -> None:
    url = database.engine.url.render_as_string(hide_password=False)

    async def scenario() -> None:
        async def hold_one(ready: asyncio.Event, go: asyncio.Event) -> None:
            async with database.async_driver_autocommit() as connection:
                await connection.execute("SELECT 1")
                ready.set()
                await go.wait()

        # Three connections idle in the pool.
        events = [(asyncio.Event(), asyncio.Event()) for _ in range(3)]
        tasks = [asyncio.create_task(hold_one(*pair)) for pair in events]
        for ready, _go in events:
            await ready.wait()
        for _ready, go in events:
            go.set()
        await asyncio.gather(*tasks)
        assert len(backends_of(url)) == 3

        cut_connections(url)
        with pytest.raises(psycopg.OperationalError):
            await pid(database)
        # The other idle connections were dropped with it: the next statements run.
        try:
            assert await pid(database) in backends_of(url)
            assert await pid(database) in backends_of(url)
        finally:
            # On its own loop, as a worker's shutdown does: a pool left open when the loop ends
            # has background tasks that asyncio.run would wait on at its close.
            await database.close_async_pool()

    asyncio.run(scenario())
