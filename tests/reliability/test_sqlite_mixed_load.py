"""Embedded SQLite under ordinary mixed load (issue 21, defect 4): two workers of the real server
on one SQLite file, one sender of 1,000-event batches, authorizations over many connections and a
reader of ``GET /v1/usage``, all at once: no 5xx, the books agree afterwards (every batch
recorded exactly, ``verify`` clean, the balance the grant less the price oracle's charge of
every event, tests/oracle.py, and nothing held), and no request stalls (none over
``STALL_SECONDS``). The latency targets (p99 ≤ 1 s, nothing over 5 s) are the benchmark's
(``make bench BENCH=embedded``): a unit test timed against them failed whenever the machine was
busy, which says nothing about the code.

It used to answer 500 ``database is locked`` with ~30 s stalls: every transaction, reads
included, began with ``BEGIN IMMEDIATE`` and polled SQLite's busy handler for up to 30 s. Now
writers take turns in the process and across processes (a lock, then a file lock) before
``BEGIN IMMEDIATE``, readers use a plain ``BEGIN`` on WAL, never waiting, and the
authorizations and voids waiting for a turn share it, with one commit (metering/db.py). Found by
this test: with a commit each, a wave of 60 authorizations queued for 60 durable commits (p99
2.8 s on this machine), and SQLite's check-and-hold compiled one of its statements afresh every
time (SQLAlchemy could not cache a statement holding ``byte_order``: ~5 ms each).

The load is the benchmark's (bench/bench_embedded.py), smaller.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx2 as httpx
from sqlalchemy import text

from bench import bench_embedded
from bench.bench_embedded import mixed_load
from bench.common import CodeUnderTest
from metering import migrate
from metering.catalog.importer import CatalogFile, import_catalog
from metering.db import Database
from metering.usage.verify import verify
from tests import oracle
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN
from tests.servers import ServerProcess

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "Mixed-Load"
# Smaller than the benchmark's load (``make bench BENCH=embedded``: 16 batches, 600
# authorizations over 60 connections), for CI; the same shape and targets.
BATCHES, CONNECTIONS, AUTHORIZATIONS = 4, 30, 300
# What the defect looked like: requests waiting out SQLite's 30 s busy handler. Far above any
# latency of a healthy run on a busy machine, far below the stall.
STALL_SECONDS = 15.0
GLM_RATES = (22_000_000, 339_000_000, 17_750_000)
GRANT_CENTS = 10**9


def _seed(url: str, base_url: str) -> tuple[str, str]:
    """A model priced since 2026-01-01, a prepaid account with credit and a key (id, secret)."""
    database = Database.from_url(url)
    try:
        price = {
            "effective_at": "2026-01-01T00:00:00Z",
            "input_microcents_per_million": GLM_RATES[0],
            "output_microcents_per_million": GLM_RATES[1],
            "cache_read_microcents_per_million": GLM_RATES[2],
        }
        catalog = CatalogFile.model_validate(
            {"models": [{"id": MODEL, "display_name": MODEL, "context_length": 131072,
                         "prices": [price]}]}
        )  # fmt: skip
        with database.unit_of_work() as session:
            import_catalog(session, catalog, datetime.now(UTC))
            session.commit()
    finally:
        database.dispose()
    with httpx.Client(base_url=base_url, headers=ADMIN, timeout=30) as admin:
        account = admin.post("/admin/v1/accounts", json={"name": "mixed", "billing": "prepaid"})
        account_id = account.json()["id"]
        response = admin.post(
            f"/admin/v1/accounts/{account_id}/grants",
            json={"amount_cents": GRANT_CENTS, "idempotency_key": "seed"},
        )
        assert response.status_code == 201, response.text
        key = admin.post(f"/admin/v1/accounts/{account_id}/api-keys", json={"name": "k"}).json()
    return key["id"], key["key"]


def test_mixed_load_on_embedded_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metering.db'}"
    migrate.upgrade(url)
    server = ServerProcess(url, tmp_path / "server", workers=2).start()
    try:
        key_id, secret = _seed(url, server.base_url)
        samples = mixed_load(
            server.base_url,
            key_id,
            secret,
            MODEL,
            batches=BATCHES,
            connections=CONNECTIONS,
            authorizations=AUTHORIZATIONS,
            gateway_token=GATEWAY_TOKEN,
        )
        credits = httpx.get(
            f"{server.base_url}/v1/credits", headers={"Authorization": f"Bearer {secret}"}
        )
    finally:
        server.stop()
    print(samples.summary())
    assert samples.errors == [], samples.summary()
    stalled = {kind: max(values) for kind, values in samples.latencies.items()}
    assert all(slowest < STALL_SECONDS for slowest in stalled.values()), samples.summary()
    assert samples.recorded == BATCHES * 1000
    assert len(samples.latencies["authorize"]) == len(samples.latencies["void"]) == AUTHORIZATIONS
    assert samples.latencies["usage report"]
    database = Database.from_url(url)
    try:
        with database.reading() as session:
            report = verify(session)
            assert report.ok and report.accounts >= 1, report.mismatches
            stored = session.execute(text("SELECT count(*) FROM usage_events")).scalar_one()
        assert stored == BATCHES * 1000
    finally:
        database.dispose()
    # Every event at the oracle's charge, every hold released.
    event = {"api": "chat_completions", "usage": bench_embedded.USAGE}
    charge = oracle.event_charge(event, GLM_RATES).total_microcents
    assert credits.status_code == 200, credits.text
    shown = (credits.json()["balance_microcents"], credits.json()["held_microcents"])
    assert shown == (GRANT_CENTS * 10**6 - BATCHES * 1000 * charge, 0)


SMALL = {"batches": 1, "batch_size": 50, "connections": 4, "authorizations": 8, "rounds": 1}
FIGURES = ["embedded.errors", "embedded.p99", "embedded.max", "embedded.ingest"]


def test_the_benchmark_small_healthy_then_broken() -> None:
    """``make bench BENCH=embedded``, small: healthy, its figures come without problems; with a
    gateway token that no longer matches, every authorization and batch fails, and no figure is
    met whatever its number."""
    results = {r.name: r for r in bench_embedded.run(bench_embedded.Config(**SMALL))}
    assert list(results) == FIGURES
    assert all(not r.problems for r in results.values()), [r.problems for r in results.values()]
    assert results["embedded.errors"].measured == 0 and results["embedded.errors"].met
    assert results["embedded.ingest"].measured > 0

    broken = CodeUnderTest(server_env=(("METERING_GATEWAY_TOKENS", "another-token"),))
    config = bench_embedded.Config(**SMALL, code=broken)
    results = {r.name: r for r in bench_embedded.run(config)}
    assert results["embedded.errors"].measured > 0
    assert all(r.met is False for r in results.values()), results
