"""The service as deployed (real uvicorn processes on PostgreSQL): a SIGKILL in the middle of a
stream of batches loses nothing and, after every batch is resent, records nothing twice; the
same request_id in two batches sent at once to two processes is recorded once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import func, select

from metering.catalog.importer import import_catalog
from metering.catalog.schemas import CatalogFile
from metering.db import Database
from metering.models import Account, UsageEvent
from metering.usage.verify import verify
from tests import oracle
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN
from tests.factories import chat_usage
from tests.servers import ServerProcess, running_servers
from tests.threads import Workers, workers

pytestmark = pytest.mark.pg_only

# 2.5 µ¢ per uncached input token, 7.5 per output token, 0.5 per cached one: every odd count
# ends in half a microcent, which the price oracle rounds up (tests/oracle.py).
RATES = (2_500_000, 7_500_000, 500_000)


def seed(url: str, base_url: str, model: str) -> tuple[dict[str, str], dict[str, str]]:
    """A model priced since 2026-01-01; a prepaid and an unbilled account with a key each."""
    database = Database.from_url(url)
    try:
        catalog = CatalogFile.model_validate(
            {
                "models": [
                    {
                        "id": model,
                        "display_name": model,
                        "context_length": 131072,
                        "prices": [
                            {
                                "effective_at": "2026-01-01T00:00:00Z",
                                "input_microcents_per_million": RATES[0],
                                "output_microcents_per_million": RATES[1],
                                "cache_read_microcents_per_million": RATES[2],
                            }
                        ],
                    }
                ]
            }
        )
        with database.unit_of_work() as session:
            import_catalog(session, catalog, datetime.now(UTC))
            session.commit()
    finally:
        database.dispose()
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    keys = {}
    accounts = {}
    for billing in ("prepaid", "unbilled"):
        account = httpx.post(
            f"{base_url}/admin/v1/accounts",
            json={"name": billing, "billing": billing},
            headers=admin,
        ).json()["id"]
        key = httpx.post(
            f"{base_url}/admin/v1/accounts/{account}/api-keys", json={"name": "k"}, headers=admin
        ).json()["id"]
        keys[billing], accounts[billing] = key, account
    return keys, accounts


def make_batches(
    keys: dict[str, str], model: str, count: int, size: int
) -> list[list[dict[str, Any]]]:
    """Deterministic batches; each repeats three events of the one before (gateway retries)."""
    at = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    batches: list[list[dict[str, Any]]] = []
    for b in range(count):
        batch = []
        for i in range(size):
            n = b * size + i
            batch.append(
                {
                    "request_id": f"crash-{n}",
                    "api_key_id": keys["unbilled" if n % 10 == 0 else "prepaid"],
                    "model": model,
                    "api": "chat_completions",
                    "usage": chat_usage(100 + n % 97, 10 + n % 13, cached=n % 50, reasoning=n % 7),
                    "occurred_at": at,
                    "outcome": "completed",
                }
            )
        if batches:
            batch.extend(batches[-1][:3])
        batches.append(batch)
    return batches


def expected_totals(
    batches: list[list[dict[str, Any]]], keys: dict[str, str]
) -> tuple[int, int, int]:
    """(distinct events, prepaid charges in µ¢ by the price oracle, prompt tokens): summed from
    what was sent."""
    distinct = {e["request_id"]: e for batch in batches for e in batch}
    prepaid = [e for e in distinct.values() if e["api_key_id"] == keys["prepaid"]]
    prompt = sum(e["usage"]["prompt_tokens"] for e in distinct.values())
    return len(distinct), oracle.total(prepaid, RATES), prompt


@contextmanager
def gateway(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}, timeout=30
    ) as client:
        yield client


def test_sigkill_mid_stream_then_resend_converges(pg_url: str, tmp_path: Path) -> None:
    server = ServerProcess(pg_url, tmp_path / "server").start()
    try:
        keys, accounts = seed(pg_url, server.base_url, "Crash-1")
        batches = make_batches(keys, "Crash-1", count=60, size=200)
        acknowledged: list[int] = []

        def stream() -> None:
            with gateway(server.base_url) as client:
                for index, batch in enumerate(batches):
                    try:
                        response = client.post("/v1/usage/events", json={"events": batch})
                    except httpx.HTTPError:
                        return
                    assert response.status_code == 200, response.text
                    acknowledged.append(index)

        sender = Workers()
        sender.start(stream)
        deadline = time.monotonic() + 60
        while len(acknowledged) < 5 and time.monotonic() < deadline and not sender.failed():
            time.sleep(0.01)
        server.kill()  # mid-stream: a batch is in flight
        sender.join(30)  # a status other than 200 before the kill fails the test here
        assert 5 <= len(acknowledged) < len(batches), "the kill did not land mid-stream"
    finally:
        server.stop()

    restarted = ServerProcess(pg_url, tmp_path / "restarted").start()
    try:
        with gateway(restarted.base_url) as client:
            for index, batch in enumerate(batches):
                resent = client.post("/v1/usage/events", json={"events": batch})
                assert resent.status_code == 200, resent.text
                body = resent.json()
                assert body["quarantined"] == body["rejected"] == 0, body
                if index in acknowledged:  # acknowledged before the crash: durably there
                    assert body["recorded"] == 0, (index, body)
    finally:
        restarted.stop()

    count, cost, prompt = expected_totals(batches, keys)
    database = Database.from_url(pg_url)
    try:
        with database.unit_of_work() as session:
            report = verify(session)
            assert report.ok, report.mismatches
            stored = session.execute(
                select(
                    func.count(),
                    func.count(func.distinct(UsageEvent.request_id)),
                    func.sum(UsageEvent.prompt_tokens),
                )
            ).one()
            assert tuple(stored) == (count, count, prompt)
            charged = session.execute(
                select(func.sum(UsageEvent.total_microcents)).where(
                    UsageEvent.account_id == accounts["prepaid"]
                )
            ).scalar_one()
            assert charged == cost
            assert session.get(Account, accounts["prepaid"]).balance_microcents == -cost  # type: ignore[union-attr]
    finally:
        database.dispose()


def test_the_same_request_ids_at_the_same_moment_on_two_processes(
    pg_url: str, tmp_path: Path
) -> None:
    sent: list[list[dict[str, Any]]] = []
    with running_servers(pg_url, tmp_path, count=2) as servers:
        keys, accounts = seed(pg_url, servers[0].base_url, "Race-1")
        for round_ in range(5):
            batch = make_batches(keys, "Race-1", count=1, size=300)[0]
            for event in batch:
                event["request_id"] = f"race-{round_}-{event['request_id']}"
            sent.append(batch)
            # Opposite orders: the service sorts its writes, so this cannot deadlock.
            bodies: list[dict[str, Any]] = [{}, {}]
            barrier = threading.Barrier(2)

            def send(
                slot: int,
                events: list[dict[str, Any]],
                barrier: threading.Barrier = barrier,
                bodies: list[dict[str, Any]] = bodies,
            ) -> None:
                with gateway(servers[slot].base_url) as client:
                    barrier.wait()
                    response = client.post("/v1/usage/events", json={"events": events})
                    assert response.status_code == 200, response.text
                    bodies[slot] = response.json()

            with workers(60) as pool:
                pool.start(send, 0, batch)
                pool.start(send, 1, batch[::-1])
            recorded: dict[str, int] = {}
            for body in bodies:
                for result in body["data"]:
                    assert result["status"] in ("recorded", "duplicate"), result
                    if result["status"] == "recorded":
                        recorded[result["request_id"]] = recorded.get(result["request_id"], 0) + 1
            assert sorted(recorded) == sorted({e["request_id"] for e in batch})
            assert set(recorded.values()) == {1}
    count, cost, _prompt = expected_totals(sent, keys)
    database = Database.from_url(pg_url)
    try:
        with database.unit_of_work() as session:
            assert verify(session).ok
            stored = session.execute(select(func.count()).select_from(UsageEvent)).scalar_one()
            assert stored == count == 5 * 300
            # Recorded once each, at the oracle's charge: the account has no credit.
            prepaid = session.get(Account, accounts["prepaid"])
            assert prepaid is not None and prepaid.balance_microcents == -cost < 0
    finally:
        database.dispose()
