"""Secrets never leave the response that shows them: after creating keys and driving traffic —
good keys in both headers, wrong keys, revoked keys, wrong service tokens, keys inside gateway
bodies — neither the database (the SQLite file with its WAL, a ``pg_dump`` of PostgreSQL) nor the
logs (everything the app logs at DEBUG, SQLAlchemy's statements and parameters included, in
process and in real server processes) contain any key secret or any admin or gateway token.

Key secrets are checked whole and by their part after the public prefix (``prefix`` is stored
and shown on purpose: ``mk_`` and 7 characters, too few to matter).
"""

from __future__ import annotations

import logging
import secrets
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from metering.accounts.service import DISPLAY_PREFIX_LENGTH
from tests.conftest import (
    APP_BACKENDS,
    CITUS_MAINTENANCE_URL,
    NOW,
    citus_nodes,
    migrated_database,
    running_api,
)
from tests.factories import GLM_RATES
from tests.security.helpers import assert_books_reconcile
from tests.servers import running_servers

Call = Callable[..., Any]  # (method, path, headers=..., json=...) -> response


def secret_fragments(values: list[str]) -> list[str]:
    """What must appear nowhere: each secret, and each key secret's undisclosed part."""
    fragments = []
    for value in values:
        fragments.append(value)
        if value.startswith("mk_"):
            fragments.append(value[DISPLAY_PREFIX_LENGTH:])
    return fragments


def assert_nowhere(fragments: list[str], where: str, text: str) -> None:
    leaked = [fragment for fragment in fragments if fragment in text]
    assert not leaked, f"{len(leaked)} secret(s) found in {where}: {leaked[:3]}"


def drive_traffic(call: Call, admin: str, gateway: str) -> list[str]:
    """Accounts, keys and every kind of authentication, right and wrong; returns every secret
    that was sent or shown."""
    as_admin = {"Authorization": f"Bearer {admin}"}
    as_gateway = {"Authorization": f"Bearer {gateway}"}
    seen = [admin, gateway]

    model = f"Sec-{secrets.token_hex(3)}"
    assert (
        call(
            "PUT",
            f"/admin/v1/models/{model}",
            headers=as_admin,
            json={"display_name": model, "context_length": 131072},
        ).status_code
        == 201
    )
    price = {
        "effective_at": "2030-01-01T00:00:00Z",
        "input_microcents_per_million": GLM_RATES[0],
        "output_microcents_per_million": GLM_RATES[1],
        "cache_read_microcents_per_million": GLM_RATES[2],
    }
    call("POST", f"/admin/v1/models/{model}/prices", headers=as_admin, json=price)

    account = call("POST", "/admin/v1/accounts", headers=as_admin, json={"name": "sec"}).json()
    keys = []
    for index in range(3):
        created = call(
            "POST",
            f"/admin/v1/accounts/{account['id']}/api-keys",
            headers=as_admin,
            json={"name": f"k{index}", "monthly_spend_limit_cents": 100},
        ).json()
        keys.append(created)
        seen.append(created["key"])
    call(
        "POST",
        f"/admin/v1/accounts/{account['id']}/grants",
        headers=as_admin,
        json={"amount_cents": 500, "idempotency_key": "g"},
    )
    listed = call("GET", f"/admin/v1/accounts/{account['id']}/api-keys", headers=as_admin)
    assert all(key["key"] not in listed.text for key in keys)  # shown once, at creation

    wrong = [f"mk_{secrets.token_urlsafe(32)}" for _ in range(3)]
    wrong_tokens = [f"tok_{secrets.token_urlsafe(24)}" for _ in range(2)]
    seen += wrong + wrong_tokens
    for key in keys:
        for headers in ({"Authorization": f"Bearer {key['key']}"}, {"x-api-key": key["key"]}):
            assert call("GET", "/v1/credits", headers=headers).status_code == 200
            call("GET", "/v1/usage?starting_at=2026-11-01", headers=headers)
            call("GET", "/v1/models", headers=headers)
    for bad in wrong:
        assert call("GET", "/v1/credits", headers={"x-api-key": bad}).status_code == 401
        assert (
            call("GET", "/v1/models", headers={"Authorization": f"Bearer {bad}"}).status_code == 401
        )
    for token in [*wrong_tokens, keys[0]["key"]]:
        assert (
            call(
                "GET", "/admin/v1/accounts", headers={"Authorization": f"Bearer {token}"}
            ).status_code
            == 401
        )
        assert (
            call(
                "POST",
                "/v1/usage/events",
                headers={"Authorization": f"Bearer {token}"},
                json={"events": []},
            ).status_code
            == 401
        )
    # Service tokens where keys go, and the other way round.
    assert call("GET", "/v1/credits", headers=as_admin).status_code == 401
    assert call("GET", "/v1/credits", headers=as_gateway).status_code == 401

    for secret in [keys[0]["key"], keys[1]["key"], *wrong]:
        body = {
            "api_key": secret,
            "model": model,
            "api": "chat_completions",
            "prompt_tokens": 10,
            "max_tokens": 10,
        }
        call("POST", "/v1/authorizations", headers=as_gateway, json=body)
        # A 400 whose body names the request's fields, with the key in the request.
        call("POST", "/v1/authorizations", headers=as_gateway, json={**body, "n": "x"})
        call("POST", "/v1/authorizations", headers=as_gateway, json={**body, "extra": 1})
    call("DELETE", f"/admin/v1/api-keys/{keys[2]['id']}", headers=as_admin)
    assert call("GET", "/v1/credits", headers={"x-api-key": keys[2]["key"]}).status_code == 401
    call("PATCH", f"/admin/v1/api-keys/{keys[1]['id']}", headers=as_admin, json={"name": "r"})
    return seen


class TestInProcess:
    @pytest.fixture(params=APP_BACKENDS)
    def backend(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    def test_no_secret_in_the_database_or_the_logs(
        self, backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        admin, gateway = f"adm_{secrets.token_urlsafe(24)}", f"gw_{secrets.token_urlsafe(24)}"
        caplog.set_level(logging.DEBUG)
        # SQL statements with their parameters, as an operator debugging would turn on.
        caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
        with (
            migrated_database(backend, tmp_path) as url,
            running_api(
                backend, url, tmp_path, admin_tokens=[admin], gateway_tokens=[gateway]
            ) as api,
        ):
            api.clock.set(NOW + timedelta(days=365 * 4))  # after the price above
            seen = drive_traffic(api.client.request, admin, gateway)
            assert_books_reconcile(api)
            logged = "\n".join(
                f"{record.getMessage()} {record.exc_text or ''}" for record in caplog.records
            )
            assert "SELECT" in logged  # the statements really were logged
            fragments = secret_fragments(seen)
            assert_nowhere(fragments, "the logs", logged)
            api.database.dispose()
            assert_nowhere(fragments, "the database", database_text(backend, url))


def database_text(backend: str, url: str) -> str:
    """Everything the database holds, as text: the SQLite files (main, WAL and shared memory,
    as bytes) or a plain ``pg_dump``."""
    if backend == "sqlite":
        path = Path(make_url(url).database or "")
        files = [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))]
        data = b"".join(f.read_bytes() for f in files if f.exists())
        assert data
        return data.decode("latin-1")
    dumps = [_pg_dump(node) for node in _nodes_of(url)]
    assert all("COPY public.api_keys" in dump for dump in dumps)
    return "\n".join(dumps)


def _nodes_of(url: str) -> list[str]:
    """The database on each node that holds it: one, or a Citus cluster's coordinator and
    workers (each a database of the same name; a worker's dump reads the distributed tables
    through its copy of the metadata, the rows of its shards and the others')."""
    parsed = make_url(url)
    if parsed.port != make_url(CITUS_MAINTENANCE_URL).port:
        return [url]
    return [
        make_url(node).set(database=parsed.database).render_as_string(hide_password=False)
        for node in citus_nodes()
    ]


def _pg_dump(url: str) -> str:
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return subprocess.run(
        ["pg_dump", "--no-owner", "--dbname", libpq],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout


def test_no_secret_in_server_logs_or_pg_dump(pg_url: str, tmp_path: Path) -> None:
    """Two real server processes on one PostgreSQL, logging at DEBUG. The app logs little when
    all is well, so the database connections are cut under them mid-run: the requests that find
    their connection dead fail (503 database_unavailable), and each is logged — exactly the log an
    operator reads during an incident, and the one most likely to carry a request's data."""
    admin, gateway = f"adm_{secrets.token_urlsafe(24)}", f"gw_{secrets.token_urlsafe(24)}"
    env = {
        "METERING_ADMIN_TOKENS": admin,
        "METERING_GATEWAY_TOKENS": gateway,
        "METERING_LOG_LEVEL": "DEBUG",
    }
    with running_servers(pg_url, tmp_path, 2, extra_env=env) as servers:
        clients = [httpx.Client(base_url=server.base_url, timeout=30) for server in servers]
        turn = 0

        def call(method: str, path: str, **kwargs: Any) -> Any:
            nonlocal turn
            turn += 1
            return clients[turn % 2].request(method, path, **kwargs)

        try:
            seen = drive_traffic(call, admin, gateway)
            key = seen[2]  # a live key
            cut_connections(pg_url)
            statuses = []
            for client in clients:
                for _ in range(3):
                    body = {
                        "api_key": key,
                        "model": "Any",
                        "api": "chat_completions",
                        "prompt_tokens": 1,
                    }
                    statuses.append(
                        client.post(
                            "/v1/authorizations",
                            json=body,
                            headers={"Authorization": f"Bearer {gateway}"},
                        ).status_code
                    )
                    statuses.append(
                        client.get("/v1/credits", headers={"x-api-key": key}).status_code
                    )
            assert 503 in statuses, statuses
        finally:
            for client in clients:
                client.close()
    logs = "\n".join(
        path.read_text(errors="replace") for path in sorted(tmp_path.rglob("server-*.log"))
    )
    assert "database unavailable" in logs  # the failures were logged
    fragments = secret_fragments(seen)
    assert_nowhere(fragments, "the server logs", logs)
    assert_nowhere(fragments, "pg_dump", database_text("postgresql", pg_url))


def cut_connections(url: str) -> None:
    """Terminate every connection to the database (as a failover or an operator would), on
    the server that holds it (a Citus cluster's coordinator, which the servers connect to)."""
    name = make_url(url).database
    maintenance = make_url(url).set(database="postgres").render_as_string(hide_password=False)
    engine = create_engine(maintenance, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
    finally:
        engine.dispose()
