"""Test harness: the real app on real databases (SQLite and PostgreSQL), schema by migrations.

* ``METERING_TEST_BACKENDS`` (default ``sqlite,postgresql``) picks the backends; PostgreSQL is
  required unless it is explicitly left out: an unreachable server fails the run, loudly.
* ``METERING_TEST_PG_URL`` is a maintenance connection to the server (default
  ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``); each test session creates its own
  fresh database there and drops it at the end, so concurrent runs never share data.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from metering import migrate
from metering.app import create_app
from metering.db import Database
from metering.kit.clock import FrozenClock
from metering.settings import Settings

ADMIN_TOKEN = "test-admin-token"
GATEWAY_TOKEN = "test-gateway-token"
# METERING_SECRET_KEY of every test app and server (§11: at least 32 characters).
TEST_SECRET_KEY = "test-secret-key-of-at-least-32-characters"
# The default "now" of every test; tests that move time set it back via the ``clock`` fixture.
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)

KNOWN_BACKENDS = ("sqlite", "postgresql")
BACKENDS = [
    b.strip() for b in os.environ.get("METERING_TEST_BACKENDS", "sqlite,postgresql").split(",")
]
PG_MAINTENANCE_URL = os.environ.get(
    "METERING_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _check_postgres() -> None:
    engine = create_engine(PG_MAINTENANCE_URL)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        pytest.exit(
            f"PostgreSQL is required for the test suite and is unreachable at "
            f"{make_url(PG_MAINTENANCE_URL).render_as_string(hide_password=True)}: {exc}\n"
            "Start it, or set METERING_TEST_BACKENDS=sqlite to run the SQLite half only.",
            returncode=3,
        )
    finally:
        engine.dispose()


def _check_backend_names() -> None:
    """A misspelt name (``postgres``) must not quietly run the suite on SQLite alone."""
    unknown = [name for name in BACKENDS if name not in KNOWN_BACKENDS]
    if unknown:
        raise pytest.UsageError(
            f"METERING_TEST_BACKENDS={os.environ.get('METERING_TEST_BACKENDS', '')!r}: unknown "
            f"backend {', '.join(map(repr, unknown))}; use a comma-separated list of "
            f"{' and '.join(KNOWN_BACKENDS)}"
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    _check_backend_names()
    if "postgresql" in BACKENDS:
        _check_postgres()


@contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new, empty PostgreSQL database for the duration of the block; its URL."""
    name = f"metering_t_{secrets.token_hex(6)}"
    admin = create_engine(PG_MAINTENANCE_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(PG_MAINTENANCE_URL).set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def fresh_database(backend: str, tmp_dir: Path) -> Iterator[str]:
    """A new empty database of ``backend`` (no schema yet); its URL."""
    if backend == "postgresql":
        with fresh_pg_database() as url:
            yield url
    elif backend == "sqlite":
        path = tmp_dir / f"metering-{secrets.token_hex(4)}.sqlite3"
        yield f"sqlite:///{path}"
    else:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(KNOWN_BACKENDS)}")


@contextmanager
def migrated_database(backend: str, tmp_dir: Path) -> Iterator[str]:
    with fresh_database(backend, tmp_dir) as url:
        migrate.upgrade(url)
        yield url


def make_settings(url: str, tmp_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": url,
        "data_dir": tmp_dir,
        "export_dir": tmp_dir / "exports",
        "admin_tokens": [ADMIN_TOKEN],
        "gateway_tokens": [GATEWAY_TOKEN],
        "secret_key": [TEST_SECRET_KEY],
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Api:
    """The real app behind a TestClient, with the three kinds of credential at hand."""

    client: TestClient
    backend: str
    url: str
    clock: FrozenClock
    database: Database
    settings: Settings
    admin_headers: dict[str, str] = field(
        default_factory=lambda: {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    gateway_headers: dict[str, str] = field(
        default_factory=lambda: {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
    )

    def admin(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.client.request(method, path, headers=self.admin_headers, **kwargs)

    def gateway(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.client.request(method, path, headers=self.gateway_headers, **kwargs)

    def as_key(self, secret: str, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {secret}", **kwargs.pop("headers", {})}
        return self.client.request(method, path, headers=headers, **kwargs)


@contextmanager
def running_api(backend: str, url: str, tmp_dir: Path, **settings: Any) -> Iterator[Api]:
    config = make_settings(url, tmp_dir, **settings)
    clock = FrozenClock(NOW)
    database = Database.from_url(url, pool_size=5)
    app = create_app(config, database=database, clock=clock)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield Api(client, backend, url, clock, database, config)
    finally:
        database.dispose()


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("metering")


@pytest.fixture(scope="session")
def _shared_apis(session_tmp: Path) -> Iterator[dict[str, Api]]:
    """One migrated database and app per backend for the whole session (tests create their own
    accounts and models with fresh ids, so they never see each other's data)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        apis = {}
        for backend in BACKENDS:
            url = stack.enter_context(migrated_database(backend, session_tmp))
            apis[backend] = stack.enter_context(running_api(backend, url, session_tmp))
        yield apis


@pytest.fixture(params=BACKENDS)
def api(request: pytest.FixtureRequest, _shared_apis: dict[str, Api]) -> Iterator[Api]:
    """The real app on each backend in turn; the clock starts at ``NOW`` in every test."""
    shared = _shared_apis[request.param]
    shared.clock.set(NOW)
    yield shared
    shared.clock.set(NOW)


def require_postgresql() -> None:
    """Tests of what exists only on PostgreSQL fail, never skip, when it is left out."""
    if "postgresql" not in BACKENDS:
        pytest.fail("this test needs PostgreSQL (METERING_TEST_BACKENDS excludes it)")


@pytest.fixture
def needs_postgresql() -> None:
    """``pytestmark = pytest.mark.usefixtures("needs_postgresql")`` for PostgreSQL-only modules."""
    require_postgresql()


@pytest.fixture
def pg_api(_shared_apis: dict[str, Api]) -> Iterator[Api]:
    """The shared app on PostgreSQL only, for behaviour that exists only there (row locks,
    the asynchronous driver path); never a skipped SQLite twin."""
    require_postgresql()
    shared = _shared_apis["postgresql"]
    shared.clock.set(NOW)
    yield shared
    shared.clock.set(NOW)


@pytest.fixture(params=BACKENDS)
def fresh_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """The real app on a database of its own (for tests that need an empty catalog)."""
    with (
        migrated_database(request.param, tmp_path) as url,
        running_api(request.param, url, tmp_path) as fresh,
    ):
        yield fresh


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database (for multi-process and concurrency tests)."""
    require_postgresql()
    with fresh_pg_database() as url:
        migrate.upgrade(url)
        yield url
