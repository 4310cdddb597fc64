"""Test harness: the real app on real databases (SQLite and PostgreSQL), schema by migrations.

* ``METERING_TEST_BACKENDS`` (default ``sqlite,postgresql``) picks the backends; PostgreSQL is
  required unless it is explicitly left out: an unreachable server fails the run, loudly.
* ``METERING_TEST_PG_URL`` is a maintenance connection to the server (default
  ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``); each test session creates its own
  fresh database there and drops it at the end, so concurrent runs never share data.
* ``citus`` in ``METERING_TEST_BACKENDS`` adds a Citus cluster (``make citus``) for the
  service-level modules of ``CITUS_MODULES``: their ``api`` and ``fresh_api`` tests run on it too,
  same assertions. ``METERING_TEST_CITUS_URL`` is the coordinator's maintenance connection
  (default ``postgresql+psycopg://postgres@127.0.0.1:9700/postgres``); a fresh database is made on
  every node of the cluster, registered, and dropped at the end. ``pg_api`` and ``pg_url`` (row
  locks, several server processes on one database) run on the cluster too.
* A migrated database (``migrated_database``: ``fresh_api``, ``pg_url``, the shared apps) is a
  copy of a template migrated once per session and backend; the tests of the migrations
  themselves run them on an empty ``fresh_database``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

# Every program imported, each registering its shard form (metering.citus.shard_forms).
import metering.functions  # noqa: F401
from metering import migrate
from metering.app import create_app
from metering.db import Database
from metering.kit.clock import FrozenClock
from metering.settings import Settings

ADMIN_TOKEN = "test-admin-token"
GATEWAY_TOKEN = "test-gateway-token"
SECRET_KEY = "test-secret-key-of-at-least-32-characters"
# The default "now" of every test; tests that move time set it back via the ``clock`` fixture.
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)

KNOWN_BACKENDS = ("sqlite", "postgresql", "citus")
REQUESTED_BACKENDS = [
    b.strip() for b in os.environ.get("METERING_TEST_BACKENDS", "sqlite,postgresql").split(",")
]
# The backends the whole suite runs on; Citus runs the modules of CITUS_MODULES besides.
BACKENDS = [b for b in REQUESTED_BACKENDS if b != "citus"]
CITUS = "citus" in REQUESTED_BACKENDS
PG_MAINTENANCE_URL = os.environ.get(
    "METERING_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
CITUS_MAINTENANCE_URL = os.environ.get(
    "METERING_TEST_CITUS_URL", "postgresql+psycopg://postgres@127.0.0.1:9700/postgres"
)
# The cluster's spare node (scripts/citus.sh starts it on the coordinator's port + 3, registered
# nowhere): the worker the rebalance test adds, in its own database only.
CITUS_SPARE_URL = os.environ.get(
    "METERING_TEST_CITUS_SPARE_URL",
    make_url(CITUS_MAINTENANCE_URL)
    .set(port=(make_url(CITUS_MAINTENANCE_URL).port or 5432) + 3)
    .render_as_string(hide_password=False),
)
# Service-level modules whose tests run on Citus too (docs/citus.md): every case of a fixture
# parametrized by backend (``api``, ``fresh_api``, ``pg_api``, ``pg_url``, the race clusters, the
# webhook and model-based apps). The PostgreSQL suite's service level: ledger, usage, reports,
# exports, webhooks (delivered by a scheduler process too), the races, the crash, transient-retry
# and model-based tests, the audit log, the security suite and the operators' tokens
# (tests/test_citus.py proves the routes). METERING_TEST_CITUS_ALL=1 shows what the other
# modules still lack.
CITUS_MODULES = frozenset(
    {
        "tests/audit/test_audit_log.py",
        "tests/exports/test_compose.py",
        "tests/exports/test_coordination.py",
        "tests/exports/test_dashboards.py",
        "tests/exports/test_day_index.py",
        "tests/exports/test_demo.py",
        "tests/exports/test_export_files.py",
        "tests/exports/test_rollforward.py",
        "tests/exports/test_scheduler.py",
        "tests/ledger/test_access_races.py",
        "tests/ledger/test_access_rules.py",
        "tests/ledger/test_async_connections.py",
        "tests/ledger/test_authorizations.py",
        "tests/ledger/test_concurrency.py",
        "tests/ledger/test_credits.py",
        "tests/ledger/test_estimate_ranges.py",
        "tests/ledger/test_estimates.py",
        "tests/ledger/test_grant_race.py",
        "tests/ledger/test_grants.py",
        "tests/ledger/test_group_commit.py",
        "tests/ledger/test_hold_counters.py",
        "tests/ledger/test_hold_ids.py",
        "tests/ledger/test_layered_limit_races.py",
        "tests/ledger/test_layered_limits.py",
        "tests/ledger/test_remembered_resolutions.py",
        "tests/ledger/test_resolution.py",
        "tests/ledger/test_resolution_generations.py",
        "tests/ledger/test_settlement.py",
        "tests/ledger/test_through_ingest.py",
        "tests/notifications/test_config.py",
        "tests/notifications/test_delivery.py",
        "tests/notifications/test_endpoints.py",
        "tests/notifications/test_events.py",
        "tests/notifications/test_grant_events.py",
        "tests/notifications/test_replicas.py",
        "tests/notifications/test_scheduler_process.py",
        "tests/notifications/test_spend_limit_events.py",
        "tests/notifications/test_spend_limit_race.py",
        "tests/notifications/test_spend_limit_scopes.py",
        "tests/payments/test_auto_recharge.py",
        "tests/payments/test_crash.py",
        "tests/payments/test_refunds.py",
        "tests/payments/test_saved_cards.py",
        "tests/payments/test_top_ups.py",
        "tests/portal/test_email_sign_in.py",
        "tests/portal/test_member_audit.py",
        "tests/portal/test_request_page.py",
        "tests/portal/test_team_edits.py",
        "tests/reliability/test_model_based.py",
        "tests/reliability/test_multi_process.py",
        "tests/reports/test_assembly.py",
        "tests/reports/test_by_project_and_member.py",
        "tests/reports/test_params.py",
        "tests/reports/test_usage_api.py",
        "tests/security/test_fuzz_schema.py",
        "tests/security/test_hostile_inputs.py",
        "tests/security/test_secrets.py",
        "tests/security/test_tenant_isolation.py",
        "tests/security/test_token_rotation.py",
        "tests/test_citus.py",
        "tests/test_database_kind.py",
        "tests/test_functions.py",
        "tests/test_migrations.py",
        "tests/test_projects_members_api.py",
        "tests/test_schema_checks.py",
        "tests/usage/test_answer.py",
        "tests/usage/test_catalog_guard.py",
        "tests/usage/test_crash_and_concurrency.py",
        "tests/usage/test_holds.py",
        "tests/usage/test_idempotency.py",
        "tests/usage/test_ingest.py",
        "tests/usage/test_lookup_and_verify.py",
        "tests/usage/test_prices_in_force.py",
        "tests/usage/test_quarantine.py",
        "tests/usage/test_request_lookup.py",
        "tests/usage/test_ranges.py",
        "tests/usage/test_reprocess_races.py",
        "tests/usage/test_single_event_path.py",
        "tests/usage/test_single_lookup.py",
        "tests/usage/test_transient_retry.py",
        "tests/web/test_operator_tokens.py",
    }
)
# METERING_TEST_CITUS_ALL=1: every module's Citus cases, to see what does not run there yet.
CITUS_ALL = os.environ.get("METERING_TEST_CITUS_ALL") == "1"
# What the ``api`` and ``fresh_api`` fixtures (and every fixture of a whole app per backend) are
# parametrized by; the Citus cases of modules outside CITUS_MODULES are deselected at collection
# (pytest_collection_modifyitems).
APP_BACKENDS = [*BACKENDS, "citus"] if CITUS else BACKENDS
# The server backends (``pg_api``, ``pg_url``: row locks, several server processes on one
# database): PostgreSQL always (it fails, never skips, when left out), Citus when the run has it.
SERVER_BACKENDS = ["postgresql", *(["citus"] if CITUS else [])]


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


def _check_citus() -> None:
    """Asked for, the cluster must be there with its workers: never a quiet fallback."""
    engine = create_engine(CITUS_MAINTENANCE_URL)
    where = make_url(CITUS_MAINTENANCE_URL).render_as_string(hide_password=True)
    try:
        with engine.connect() as connection:
            workers = connection.execute(
                text("SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND isactive")
            ).scalar()
    except Exception as exc:
        pytest.exit(
            f"METERING_TEST_BACKENDS asks for Citus and its coordinator is unreachable at "
            f"{where}: {exc}\nStart it with `make citus`, or leave `citus` out.",
            returncode=3,
        )
    finally:
        engine.dispose()
    if not workers:
        pytest.exit(f"the Citus coordinator at {where} has no active worker", returncode=3)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Citus runs the modules of CITUS_MODULES only: the other Citus cases are deselected."""
    if not CITUS:
        return
    root = Path(__file__).resolve().parent.parent
    kept, deselected = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        on_citus = "citus" in params.values()
        module = item.path.resolve().relative_to(root).as_posix()
        chosen = CITUS_ALL or module in CITUS_MODULES
        (deselected if on_citus and not chosen else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _check_backend_names() -> None:
    """A misspelt name (``postgres``) must not quietly run the suite on SQLite alone."""
    unknown = [name for name in REQUESTED_BACKENDS if name not in KNOWN_BACKENDS]
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
    if CITUS:
        _check_citus()


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


def citus_nodes() -> list[str]:
    """Maintenance URLs of the cluster's nodes, the coordinator first."""
    coordinator = make_url(CITUS_MAINTENANCE_URL)
    engine = create_engine(CITUS_MAINTENANCE_URL)
    try:
        with engine.connect() as connection:
            ports = [
                row[0]
                for row in connection.execute(
                    text("SELECT nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport")
                )
            ]
    finally:
        engine.dispose()
    return [
        CITUS_MAINTENANCE_URL,
        *(coordinator.set(port=port).render_as_string(hide_password=False) for port in ports),
    ]


@contextmanager
def fresh_citus_database(shard_count: int = 4, spare: bool = False) -> Iterator[str]:
    """A new, empty database on every node of the Citus cluster, the extension created and the
    workers registered with the coordinator's copy (Citus keeps its metadata per database); the
    coordinator's URL. Four shards, not 32: the tests' schema is distributed in seconds.
    ``spare``: the database and the extension on the spare node too (``CITUS_SPARE_URL``), which
    is left for the test to register."""
    name = f"metering_c_{secrets.token_hex(6)}"
    nodes = citus_nodes()
    registered = len(nodes)
    if spare:
        nodes.append(CITUS_SPARE_URL)
    engines = [create_engine(url, isolation_level="AUTOCOMMIT") for url in nodes]
    made: list[Any] = []
    try:
        for engine in engines:
            with engine.connect() as connection:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
            made.append(engine)
        urls = [make_url(url).set(database=name) for url in nodes]
        for url in reversed(urls):  # the workers' extension first, as citus_add_node expects
            in_db = create_engine(url, isolation_level="AUTOCOMMIT")
            try:
                with in_db.connect() as connection:
                    connection.execute(text("CREATE EXTENSION citus"))
                    if url is urls[0]:
                        connection.execute(
                            text(f'ALTER DATABASE "{name}" SET citus.shard_count = {shard_count}')
                        )
                        connection.execute(
                            text("SELECT citus_set_coordinator_host(:h, :p)"),
                            {"h": "localhost", "p": url.port},
                        )
                        for worker in urls[1:registered]:
                            connection.execute(
                                text("SELECT citus_add_node(:h, :p)"),
                                {"h": "localhost", "p": worker.port},
                            )
            finally:
                in_db.dispose()
        yield urls[0].render_as_string(hide_password=False)
    finally:
        for engine in made:
            with engine.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        for engine in engines:
            engine.dispose()


def _allow_connections(nodes: list[str], name: str, allowed: bool) -> None:
    """``ALTER DATABASE name WITH ALLOW_CONNECTIONS allowed`` on every node."""
    for node in nodes:
        engine = create_engine(node, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(
                    text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}')
                )
        finally:
            engine.dispose()


class _ServerTemplate:
    """One migrated database per session on a PostgreSQL server or the Citus cluster, copied
    (``CREATE DATABASE … TEMPLATE``) on every node for each test that asks for a migrated
    database: a copy takes a fraction of a second where running the migrations takes one (six on
    Citus, which distributes the schema too). On Citus the coordinator's copy keeps the node
    registration (hosts and ports; a node connects to the database of the same name), the
    workers' copies keep the shards. The database-level settings, which a copy does not take,
    are set again."""

    def __init__(
        self, nodes: Callable[[], list[str]], fresh: Callable[[], AbstractContextManager[str]]
    ) -> None:
        self._nodes = nodes
        self._fresh = fresh
        self._stack: ExitStack | None = None
        self._name: str | None = None

    def copy(self) -> Iterator[str]:
        nodes = self._nodes()
        template = self._template(nodes)
        name = f"{template.rsplit('_', 1)[0]}_{secrets.token_hex(6)}"
        engines = [create_engine(url, isolation_level="AUTOCOMMIT") for url in nodes]
        made: list[Any] = []
        try:
            for engine in engines:
                with engine.connect() as connection:
                    settings = (
                        connection.execute(
                            text(
                                "SELECT unnest(s.setconfig) FROM pg_db_role_setting s "
                                "JOIN pg_database d ON d.oid = s.setdatabase "
                                "WHERE d.datname = :t AND s.setrole = 0"
                            ),
                            {"t": template},
                        )
                        .scalars()
                        .all()
                    )
                    _copy_database(connection, template, name)
                    made.append(engine)
                    for setting in settings:
                        key, _, value = setting.partition("=")
                        quoted = "'" + value.replace("'", "''") + "'"
                        connection.execute(text(f'ALTER DATABASE "{name}" SET {key} TO {quoted}'))
            yield make_url(nodes[0]).set(database=name).render_as_string(hide_password=False)
        finally:
            for engine in made:
                _drop_database(engine, name)
            for engine in engines:
                engine.dispose()

    def _template(self, nodes: list[str]) -> str:
        if self._name is None:
            self._stack = ExitStack()
            url = self._stack.enter_context(self._fresh())
            migrate.upgrade(url)
            self._name = make_url(url).database
            assert self._name is not None
            # A template takes no connections: any left (on Citus its maintenance daemon, the
            # nodes' cached connections) are closed and cannot come back.
            _allow_connections(nodes, self._name, False)
        return self._name

    def close(self) -> None:
        if self._stack is not None and self._name is not None:
            _allow_connections(self._nodes(), self._name, True)
            self._stack.close()
        self._stack = self._name = None


def _drop_database(engine: Any, name: str, attempts: int = 20) -> None:
    """DROP DATABASE … WITH (FORCE), again while it is refused as in use: on a Citus node the
    maintenance daemon can connect to a new database in the instant between FORCE's
    termination of its sessions and the drop."""
    for attempt in range(attempts):
        try:
            with engine.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        except OperationalError as error:
            if "is being accessed by other users" not in str(error) or attempt == attempts - 1:
                raise
            time.sleep(0.1)


class _SqliteTemplate:
    """One migrated SQLite file per session, copied (SQLite's online backup) for each test that
    asks for a migrated database: the migrations rebuild tables one by one, about a second and a
    half; a copy takes milliseconds."""

    def __init__(self) -> None:
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def copy(self, tmp_dir: Path) -> Iterator[str]:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="metering-template-")
            migrate.upgrade(f"sqlite:///{self._path()}")
        path = tmp_dir / f"metering-{secrets.token_hex(4)}.sqlite3"
        with (
            closing(sqlite3.connect(self._path())) as source,
            closing(sqlite3.connect(path)) as target,
        ):
            source.backup(target)
        yield f"sqlite:///{path}"

    def _path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "template.sqlite3"

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
        self._dir = None


def _copy_database(connection: Any, template: str, name: str) -> None:
    """``CREATE DATABASE name TEMPLATE template``, the template's lingering sessions ended
    first (they cannot reconnect: the template allows no connections)."""
    for attempt in range(50):
        connection.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :t"),
            {"t": template},
        )
        try:
            connection.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
            return
        except Exception as exc:
            if "being accessed by other users" not in str(exc) or attempt == 49:
                raise
            time.sleep(0.1)


# The migrated templates, each made when a test first asks for a migrated database there.
TEMPLATES = {
    "postgresql": _ServerTemplate(lambda: [PG_MAINTENANCE_URL], fresh_pg_database),
    "citus": _ServerTemplate(citus_nodes, fresh_citus_database),
}
SQLITE_TEMPLATE = _SqliteTemplate()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for template in TEMPLATES.values():
        template.close()
    SQLITE_TEMPLATE.close()


@contextmanager
def fresh_database(backend: str, tmp_dir: Path) -> Iterator[str]:
    """A new empty database of ``backend`` (no schema yet); its URL."""
    if backend == "postgresql":
        with fresh_pg_database() as url:
            yield url
    elif backend == "citus":
        with fresh_citus_database() as url:
            yield url
    elif backend == "sqlite":
        path = tmp_dir / f"metering-{secrets.token_hex(4)}.sqlite3"
        yield f"sqlite:///{path}"
    else:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(KNOWN_BACKENDS)}")


@contextmanager
def migrated_database(backend: str, tmp_dir: Path) -> Iterator[str]:
    """A new database of ``backend`` at the migrations' head: a copy of the session's migrated
    template (tests of the migrations themselves run them on a ``fresh_database``)."""
    if backend in TEMPLATES:
        yield from TEMPLATES[backend].copy()
    elif backend == "sqlite":
        yield from SQLITE_TEMPLATE.copy(tmp_dir)
    else:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(KNOWN_BACKENDS)}")


def make_settings(url: str, tmp_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": url,
        "data_dir": tmp_dir,
        "export_dir": tmp_dir / "exports",
        "admin_tokens": [ADMIN_TOKEN],
        "gateway_tokens": [GATEWAY_TOKEN],
        "secret_key": [SECRET_KEY],
        "public_base_url": "http://testserver",
        # As a server database's default, on SQLite too (where the embedded default allows).
        "webhook_allow_private": False,
    }
    values.update(overrides)
    return Settings(**values)


T = TypeVar("T")


def run_on_database(database: Database, work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, then the pool of async connections this loop opened on
    ``database`` closed on the same loop, as a worker's shutdown does: a pool left open when its
    loop ends leaves background tasks that ``asyncio.run``'s close waits on, at times for ever
    (seen: a void's loop that never closed)."""

    async def closing_its_pool() -> T:
        try:
            return await work
        finally:
            await database.close_async_pool()

    return asyncio.run(closing_its_pool())


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


class _SharedApis(dict[str, Api]):
    """One migrated database and app per backend, made when a test first asks for it."""

    def __init__(self, stack: ExitStack, tmp_dir: Path) -> None:
        super().__init__()
        self._stack = stack
        self._tmp_dir = tmp_dir

    def __missing__(self, backend: str) -> Api:
        url = self._stack.enter_context(migrated_database(backend, self._tmp_dir))
        api = self[backend] = self._stack.enter_context(running_api(backend, url, self._tmp_dir))
        return api


@pytest.fixture(scope="session")
def _shared_apis(session_tmp: Path) -> Iterator[dict[str, Api]]:
    """One migrated database and app per backend for the whole session (tests create their own
    accounts and models with fresh ids, so they never see each other's data)."""
    with ExitStack() as stack:
        yield _SharedApis(stack, session_tmp)


@pytest.fixture(params=APP_BACKENDS)
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


def require_server_backend(backend: str) -> None:
    """A ``SERVER_BACKENDS`` case: PostgreSQL's fails, never skips, when it is left out."""
    if backend == "postgresql":
        require_postgresql()


@pytest.fixture(params=SERVER_BACKENDS)
def pg_api(request: pytest.FixtureRequest, _shared_apis: dict[str, Api]) -> Iterator[Api]:
    """The shared app on PostgreSQL (and the Citus cluster), for behaviour that exists only
    there (row locks, the asynchronous driver path); never a skipped SQLite twin."""
    require_server_backend(request.param)
    shared = _shared_apis[request.param]
    shared.clock.set(NOW)
    yield shared
    shared.clock.set(NOW)


@pytest.fixture(params=APP_BACKENDS)
def fresh_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """The real app on a database of its own (for tests that need an empty catalog)."""
    with (
        migrated_database(request.param, tmp_path) as url,
        running_api(request.param, url, tmp_path) as fresh,
    ):
        yield fresh


@contextmanager
def server_database(backend: str, tmp_dir: Path) -> Iterator[str]:
    """A fresh, migrated database of a ``SERVER_BACKENDS`` backend; its URL."""
    require_server_backend(backend)
    with migrated_database(backend, tmp_dir) as url:
        yield url


@pytest.fixture(params=SERVER_BACKENDS)
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database, and one on the Citus cluster when the run has it
    (for multi-process and concurrency tests)."""
    with server_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def plain_pg_api(_shared_apis: dict[str, Api]) -> Iterator[Api]:
    """The shared app on PostgreSQL alone, for what PostgreSQL's own planner does (a plan a
    Citus coordinator does not make)."""
    require_postgresql()
    shared = _shared_apis["postgresql"]
    shared.clock.set(NOW)
    yield shared
    shared.clock.set(NOW)


@pytest.fixture
def plain_pg_url(tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database alone (what the single-server stack alone has:
    Grafana's dashboards)."""
    with server_database("postgresql", tmp_path) as url:
        yield url
