"""The gateway tests' parts: a real metering server process with the shipped catalog, accounts
made through the admin API, and the charge a usage object should cost, computed by the tests'
oracle from the catalog file's rates (never by metering's own pricing code)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests import oracle
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, migrated_database
from tests.servers import ServerProcess, run_cli

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


# -- the expected charge --------------------------------------------------------------------------


def expected_charge(model: str, api: str, usage: dict[str, Any], at: datetime) -> int:
    """The total microcents ``usage`` (as the SDK received it) costs at the list price in force
    at ``at`` in the shipped catalog file, by the tests' oracle (tests/oracle.py)."""
    rates = oracle.rates_at(oracle.catalog_prices(model), at)
    assert rates is not None, f"no price of {model} in force at {at}"
    return oracle.charge(oracle.tokens_of(api, usage), rates).total_microcents


# -- metering -------------------------------------------------------------------------------------


@dataclass
class Customer:
    account_id: str
    key_id: str
    key: str


@dataclass
class Metering:
    """A metering server process on a migrated database with the shipped catalog."""

    backend: str
    database_url: str
    workdir: Path
    server: ServerProcess

    @property
    def url(self) -> str:
        return self.server.base_url

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers=ADMIN, timeout=30, **kwargs)

    def customer(
        self,
        credit_cents: int | None = 1000,
        *,
        max_concurrent_requests: int | None = None,
        allowed_models: list[str] | None = None,
    ) -> Customer:
        response = self.admin(
            "POST", "/admin/v1/accounts", json={"name": "gateway-test", "billing": "prepaid"}
        )
        assert response.status_code == 201, response.text
        account_id = response.json()["id"]
        if max_concurrent_requests is not None:
            response = self.admin(
                "PATCH",
                f"/admin/v1/accounts/{account_id}",
                json={"max_concurrent_requests": max_concurrent_requests},
            )
            assert response.status_code == 200, response.text
        if credit_cents:
            response = self.admin(
                "POST",
                f"/admin/v1/accounts/{account_id}/grants",
                json={"amount_cents": credit_cents, "idempotency_key": "credit"},
            )
            assert response.status_code == 201, response.text
        key_body: dict[str, Any] = {"name": "customer"}
        if allowed_models is not None:
            key_body["allowed_models"] = allowed_models
        response = self.admin("POST", f"/admin/v1/accounts/{account_id}/api-keys", json=key_body)
        assert response.status_code == 201, response.text
        return Customer(account_id, response.json()["id"], response.json()["key"])

    def event(self, customer: Customer, request_id: str) -> dict[str, Any] | None:
        response = self.admin(
            "GET",
            f"/admin/v1/usage/events/{request_id}",
            params={"account_id": customer.account_id},
        )
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_for_event(
        self, customer: Customer, request_id: str, timeout: float = 15.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self.event(customer, request_id)
            if event is not None:
                return event
            time.sleep(0.1)
        raise AssertionError(f"request {request_id} was not recorded in {timeout} s")

    def charges(self, customer: Customer) -> list[dict[str, Any]]:
        """The account's ledger entries of kind ``charge`` (every page)."""
        entries: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 1000}
        while True:
            response = self.admin(
                "GET", f"/admin/v1/accounts/{customer.account_id}/ledger", params=params
            )
            assert response.status_code == 200, response.text
            page = response.json()
            entries += [e for e in page["data"] if e["kind"] == "charge"]
            if not page["has_more"]:
                return entries
            params["after"] = page["next_cursor"]

    def holds(self, customer: Customer, status: str) -> list[dict[str, Any]]:
        response = self.admin(
            "GET",
            "/admin/v1/authorizations",
            params={"account_id": customer.account_id, "status": status, "limit": 1000},
        )
        assert response.status_code == 200, response.text
        holds: list[dict[str, Any]] = response.json()["data"]
        return holds

    def verify(self) -> None:
        """``metering verify`` on the database: the books agree with their sources."""
        result = run_cli(self.database_url, self.workdir, "verify")
        assert result.returncode == 0, result.stdout + result.stderr

    def restart(self) -> None:
        """A new server process on the same database and port (after ``server.kill()``)."""
        self.server = ServerProcess(self.database_url, self.workdir, port=self.server.port).start()


@contextmanager
def running_metering(backend: str, workdir: Path, port: int | None = None) -> Iterator[Metering]:
    """Metering on a fresh migrated database of ``backend`` with the shipped catalog."""
    with migrated_database(backend, workdir) as url:
        loaded = run_cli(url, workdir, "catalog", "import")
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        server = ServerProcess(url, workdir, port=port or 0).start()
        metering = Metering(backend, url, workdir, server)
        try:
            yield metering
        finally:
            metering.server.stop()


def now() -> datetime:
    return datetime.now(UTC)


GATEWAY = GATEWAY_TOKEN
