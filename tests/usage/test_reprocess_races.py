"""Concurrent reprocesses of the same quarantined events (issue 35, defect 3), on PostgreSQL
and the Citus cluster: every one answers 200, and each event is recorded, and charged, exactly
once. Six at once used to deadlock (``deadlock detected``: 503 for one to four of them), their
transactions taking the same accounts', rollups' and entries' rows in different orders; now a
reprocess owns the quarantine until it commits (a transaction's advisory lock, metering.citus),
and the next one finds the events it recorded gone from it.

Real server process, real database; the charges are the price oracle's (tests/oracle.py)."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from metering.catalog.importer import import_catalog
from metering.catalog.schemas import CatalogFile
from metering.db import Database
from tests import oracle
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN
from tests.factories import chat_usage
from tests.servers import ServerProcess
from tests.usage.test_crash_and_concurrency import RATES, seed

pytestmark = pytest.mark.pg_only

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
ROUNDS, EVENTS, AT_ONCE = 3, 60, 6


def _add_model(url: str, model: str) -> None:
    """The model the quarantined events named, priced since before them."""
    price = {
        "effective_at": "2026-01-01T00:00:00Z",
        "input_microcents_per_million": RATES[0],
        "output_microcents_per_million": RATES[1],
        "cache_read_microcents_per_million": RATES[2],
    }
    catalog = CatalogFile.model_validate(
        {"models": [{"id": model, "display_name": model, "context_length": 131072,
                     "prices": [price]}]}
    )  # fmt: skip
    database = Database.from_url(url)
    try:
        with database.unit_of_work() as session:
            import_catalog(session, catalog, datetime.now(UTC))
            session.commit()
    finally:
        database.dispose()


def test_concurrent_reprocesses_record_each_event_once(pg_url: str, tmp_path: Path) -> None:
    server = ServerProcess(pg_url, tmp_path / "server").start()
    try:
        base = server.base_url
        keys, accounts = seed(pg_url, base, "Known")
        charged = 0  # the prepaid account's (an unbilled one is never charged)
        with httpx.Client(base_url=base, timeout=60) as client:
            for round_ in range(ROUNDS):
                model = f"Late-{round_}"
                events: list[dict[str, Any]] = []
                for index in range(EVENTS):
                    billing = ("prepaid", "unbilled")[index % 2]
                    events.append(
                        {
                            "request_id": secrets.token_hex(8),
                            "api_key_id": keys[billing],
                            # Every third event's model stays unknown: it stays.
                            "model": f"Never-{round_}" if index % 3 == 2 else model,
                            "api": "chat_completions",
                            "usage": chat_usage(1001 + index, 11 + index, cached=index),
                            "occurred_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                            "outcome": "completed",
                        }
                    )
                sent = client.post("/v1/usage/events", json={"events": events}, headers=GATEWAY)
                assert sent.status_code == 200 and sent.json()["quarantined"] == EVENTS, sent.text
                listed = client.get(
                    "/admin/v1/quarantine", params={"limit": 100}, headers=ADMIN
                ).json()["data"]
                ids = [e["id"] for e in listed if e["model"] in (model, f"Never-{round_}")]
                assert len(ids) == EVENTS
                _add_model(pg_url, model)

                def reprocess(_: int, ids: list[int] = ids) -> httpx.Response:
                    return client.post(
                        "/admin/v1/quarantine/reprocess", json={"ids": ids}, headers=ADMIN
                    )

                with ThreadPoolExecutor(AT_ONCE) as pool:
                    answers = list(pool.map(reprocess, range(AT_ONCE)))
                assert [a.status_code for a in answers] == [200] * AT_ONCE, [
                    a.text[:300] for a in answers if a.status_code != 200
                ]
                bodies = [a.json() for a in answers]
                billable = [e for e in events if e["model"] == model]
                assert sum(b["recorded"] for b in bodies) == len(billable)
                # The others stay, one more attempt counted by each reprocess.
                assert [b["quarantined"] for b in bodies] == [EVENTS - len(billable)] * AT_ONCE
                prepaid = [e for e in billable if e["api_key_id"] == keys["prepaid"]]
                charged += sum(oracle.event_charge(e, RATES).total_microcents for e in prepaid)
            # Each event charged exactly once: the balance is the oracle's.
            credits = client.get(f"/admin/v1/accounts/{accounts['prepaid']}/credits", headers=ADMIN)
            assert credits.status_code == 200, credits.text
            assert credits.json()["balance_microcents"] == -charged
            remaining = client.get("/admin/v1/quarantine", headers=ADMIN).json()["data"]
            assert {e["model"] for e in remaining} == {f"Never-{r}" for r in range(ROUNDS)}
            assert {e["attempts"] for e in remaining} == {1 + AT_ONCE}
    finally:
        server.stop()
