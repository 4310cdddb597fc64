"""The gateway tests' parts: a real metering server process with the shipped catalog, accounts
made through the admin API, and the charge a usage object should cost, computed here from the
catalog file's rates (never by metering's own pricing code)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, migrated_database
from tests.servers import ServerProcess, run_cli

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "metering" / "data" / "catalog.json"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MILLION = 1_000_000


# -- the expected charge --------------------------------------------------------------------------
# TODO(lead): switch to the shared oracle (tests/oracle.py, branch `oracle`) once it lands.


def _rates_in_force(model: str, at: datetime) -> tuple[int, int, int]:
    """(input, output, cache read) microcents per million tokens of ``model``'s list price
    version in force at ``at``, read from the shipped catalog file."""
    for entry in json.loads(CATALOG.read_text())["models"]:
        if entry["id"].lower() != model.lower():
            continue
        versions = sorted(
            (datetime.fromisoformat(p["effective_at"].replace("Z", "+00:00")), p)
            for p in entry["prices"]
        )
        in_force = [p for effective_at, p in versions if effective_at <= at]
        assert in_force, f"no price of {model} in force at {at}"
        price = in_force[-1]
        return (
            price["input_microcents_per_million"],
            price["output_microcents_per_million"],
            price["cache_read_microcents_per_million"],
        )
    raise AssertionError(f"{model} is not in {CATALOG}")


def _half_up(tokens: int, rate: int) -> int:
    """tokens × rate / 10⁶ microcents, rounded to the nearest microcent, halves up."""
    whole, rest = divmod(tokens * rate, MILLION)
    return whole + (1 if 2 * rest >= MILLION else 0)


def expected_charge(model: str, api: str, usage: dict[str, Any], at: datetime) -> int:
    """The total microcents ``usage`` (as the SDK received it) costs at list prices."""
    if api == "messages":
        prompt = usage["input_tokens"]
        cached = usage.get("cache_read_input_tokens") or 0
        output = usage["output_tokens"]
    elif api == "responses":
        prompt = usage["input_tokens"]
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        output = usage["output_tokens"]
    else:
        prompt = usage["prompt_tokens"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        output = usage["completion_tokens"]
    input_rate, output_rate, cache_rate = _rates_in_force(model, at)
    return (
        _half_up(prompt - cached, input_rate)
        + _half_up(cached, cache_rate)
        + _half_up(output, output_rate)
    )


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
