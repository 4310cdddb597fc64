"""The database goes away under a running server and comes back: while it is
away every request fails cleanly (503 ``database_unavailable`` in the error body of docs/api.md,
promptly, never a 500), and within seconds of its return every route answers again, with no
restart of the server.

The shared PostgreSQL server is never stopped (other suites use it): the test database alone
refuses connections (``ALLOW_CONNECTIONS false``) and every connection to it is terminated,
which is what a restart does to each pool — every connection dropped, new ones refused — then
accepts them again."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from metering.app import create_app
from metering.db import Database
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, PG_MAINTENANCE_URL, make_settings
from tests.servers import ServerProcess
from tests.usage.test_crash_and_concurrency import seed

pytestmark = pytest.mark.usefixtures("needs_postgresql")

GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "outage-1"


def maintenance(statement: str, name: str) -> None:
    engine = create_engine(PG_MAINTENANCE_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(statement.format(name=name)), {"name": name})
    finally:
        engine.dispose()


def take_down(name: str) -> None:
    maintenance('ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false', name)
    maintenance(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = :name AND pid <> pg_backend_pid()",
        name,
    )


def bring_up(name: str) -> None:
    maintenance('ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true', name)


Request = Callable[[], httpx.Response]


def requests_of(base_url: str, secret: str, account: str) -> dict[str, Request]:
    """One request per kind of path: the gateway's (async pool, fast lane), an account key's,
    the admin API's and the probes (SQLAlchemy's pool)."""
    counter = iter(range(1_000_000))

    def authorize() -> httpx.Response:
        body = {
            "api_key": secret,
            "request_id": f"outage-{next(counter)}",
            "model": MODEL,
            "api": "chat_completions",
            "prompt_tokens": 10,
            "max_tokens": 10,
        }
        return httpx.post(f"{base_url}/v1/authorizations", json=body, headers=GATEWAY, timeout=30)

    return {
        "authorize": authorize,
        "models": lambda: httpx.get(f"{base_url}/v1/models", timeout=30),
        "credits": lambda: httpx.get(
            f"{base_url}/v1/credits", headers={"x-api-key": secret}, timeout=30
        ),
        "account": lambda: httpx.get(
            f"{base_url}/admin/v1/accounts/{account}", headers=ADMIN, timeout=30
        ),
        "readyz": lambda: httpx.get(f"{base_url}/readyz", timeout=30),
        "metrics": lambda: httpx.get(f"{base_url}/metrics", timeout=30),
    }


def assert_unavailable(name: str, response: httpx.Response, elapsed: float) -> None:
    assert response.status_code == 503, (name, response.status_code, response.text)
    error = response.json()["error"]
    # The error object of docs/api.md#conventions (contract_problems refuses any 5xx, so its checks
    # are spelt out here).
    assert set(error) == {"message", "type", "param", "code", "request_id"}, (name, error)
    assert (error["type"], error["code"], error["param"]) == (
        "api_error",
        "database_unavailable",
        None,
    ), (name, error)
    assert error["request_id"] == response.headers["x-request-id"]
    assert response.headers["content-type"] == "application/json"
    assert elapsed < 10, f"{name} took {elapsed:.1f} s to fail"


def test_requests_fail_cleanly_while_the_database_is_away_and_work_again_after(
    pg_url: str, tmp_path: Path
) -> None:
    name = make_url(pg_url).database
    assert name
    # One worker, so that the requests below are sure to reach every pool it has (with two, the
    # kernel may hand all of a kind to one of them; each pool behaves the same).
    server = ServerProcess(pg_url, tmp_path / "server", workers=1).start()
    try:
        _keys, accounts = seed(pg_url, server.base_url, MODEL)
        response = httpx.post(
            f"{server.base_url}/admin/v1/accounts/{accounts['prepaid']}/grants",
            json={"amount_cents": 10_000, "idempotency_key": "seed"},
            headers=ADMIN,
        )
        assert response.status_code == 201, response.text
        secret = httpx.post(
            f"{server.base_url}/admin/v1/accounts/{accounts['prepaid']}/api-keys",
            json={"name": "gw"},
            headers=ADMIN,
        ).json()["key"]
        requests = requests_of(server.base_url, secret, accounts["prepaid"])
        # Every path has connections in its pool.
        for _ in range(6):
            for kind, request in requests.items():
                assert request().status_code == 200, kind

        take_down(name)
        try:
            for _ in range(3):  # each pool meets the outage, more than once
                for kind, request in requests.items():
                    started = time.monotonic()
                    assert_unavailable(kind, request(), time.monotonic() - started)
        finally:
            bring_up(name)

        # Back within seconds: every kind answers 200 again (a 503 meanwhile at most).
        came_back = time.monotonic()
        pending = set(requests)
        while pending:
            assert time.monotonic() - came_back < 10, f"still failing 10 s later: {pending}"
            for kind in sorted(pending):
                response = requests[kind]()
                if response.status_code == 200:
                    pending.discard(kind)
                else:
                    assert_unavailable(kind, response, 0)
            time.sleep(0.05)
        # And then steadily.
        for _ in range(10):
            for kind, request in requests.items():
                response = request()
                assert response.status_code == 200, (kind, response.text)
    finally:
        server.stop()
        bring_up(name)


def test_an_exhausted_connection_pool_is_a_prompt_503(pg_url: str, tmp_path: Path) -> None:
    """Every connection of the pool held busy (issue 35, defect 4): a request waits
    ``METERING_DB_WAIT_SECONDS`` for one, then 503 ``database_unavailable`` with
    ``Retry-After`` (it was a 500 ``QueuePool limit … reached`` after 30 s); once one is free
    again, it is served."""
    settings = make_settings(pg_url, tmp_path, db_pool_size=1, db_wait_seconds=1)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        database: Database = client.app.state.database  # type: ignore[attr-defined]
        busy = database.engine.connect()  # the pool's one connection
        try:
            calls = {
                "read": lambda: client.get("/admin/v1/accounts", headers=ADMIN),
                "write": lambda: client.post(
                    "/admin/v1/accounts", json={"name": "n", "billing": "prepaid"}, headers=ADMIN
                ),
            }
            for name, call in calls.items():
                started = time.monotonic()
                response = call()
                assert_unavailable(name, response, time.monotonic() - started)
                assert response.headers["retry-after"] == "1"
        finally:
            busy.close()
        assert client.get("/admin/v1/accounts", headers=ADMIN).status_code == 200
        created = client.post(
            "/admin/v1/accounts", json={"name": "n", "billing": "prepaid"}, headers=ADMIN
        )
        assert created.status_code == 201, created.text
