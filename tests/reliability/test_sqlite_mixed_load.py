"""Embedded SQLite under ordinary mixed load (issue 21, defect 4): two workers of the real server
on one SQLite file, one sender of 1,000-event batches, authorizations over many connections and a
reader of ``GET /v1/usage``, all at once: no 5xx, p99 ≤ 1 s, nothing over 5 s, and the books
agree afterwards (every batch recorded exactly, ``verify`` clean).

It used to answer 500 ``database is locked`` with ~30 s stalls: every transaction, reads
included, began with ``BEGIN IMMEDIATE`` and polled SQLite's busy handler for up to 30 s. Now
writers take turns in the process and across processes (a lock, then a file lock) before
``BEGIN IMMEDIATE``, and readers use a plain ``BEGIN`` on WAL, never waiting (metering/db.py).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx

from metering import migrate
from metering.db import Database
from metering.usage.verify import verify
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN
from tests.servers import ServerProcess

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
BATCHES, BATCH_SIZE = 6, 1000
AUTH_CONNECTIONS, AUTHS_PER_CONNECTION = 60, 10
P99_SECONDS, MAX_SECONDS = 1.0, 5.0


class Recorder:
    """Every request's status and latency, from all threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.samples: dict[str, list[tuple[int, float]]] = {}

    def timed(self, kind: str, call: Callable[[], httpx.Response]) -> httpx.Response:
        started = time.perf_counter()
        try:
            response = call()
            status = response.status_code
        except httpx.HTTPError:
            response, status = None, 0  # type: ignore[assignment]
        elapsed = time.perf_counter() - started
        with self._lock:
            self.samples.setdefault(kind, []).append((status, elapsed))
        return response

    def problems(self) -> list[str]:
        found = []
        for kind, samples in sorted(self.samples.items()):
            bad = [s for s, _ in samples if s == 0 or s >= 500]
            latencies = sorted(t for _, t in samples)
            p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
            if bad:
                found.append(f"{kind}: {len(bad)} of {len(samples)} failed ({sorted(set(bad))})")
            if p99 > P99_SECONDS:
                found.append(f"{kind}: p99 {p99:.3f} s > {P99_SECONDS} s")
            if latencies[-1] > MAX_SECONDS:
                found.append(f"{kind}: slowest {latencies[-1]:.3f} s > {MAX_SECONDS} s")
        return found

    def summary(self) -> str:
        parts = []
        for kind, samples in sorted(self.samples.items()):
            latencies = sorted(t for _, t in samples)
            p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
            parts.append(f"{kind}: n={len(samples)} p99={p99:.3f}s max={latencies[-1]:.3f}s")
        return "; ".join(parts)


def _seed(base_url: str) -> tuple[str, str, str]:
    """A priced model, a prepaid account with credit and a key: (model, key id, key secret)."""
    model = f"Mixed-{secrets.token_hex(3)}"
    with httpx.Client(base_url=base_url, headers=ADMIN, timeout=30) as admin:
        response = admin.put(
            f"/admin/v1/models/{model}", json={"display_name": model, "context_length": 131072}
        )
        assert response.status_code in (200, 201), response.text
        response = admin.post(
            f"/admin/v1/models/{model}/prices",
            json={
                "effective_at": (datetime.now(UTC) + timedelta(seconds=2)).isoformat(),
                "input_microcents_per_million": 22_000_000,
                "output_microcents_per_million": 339_000_000,
                "cache_read_microcents_per_million": 17_750_000,
            },
        )
        assert response.status_code == 201, response.text
        account = admin.post("/admin/v1/accounts", json={"name": "mixed", "billing": "prepaid"})
        account_id = account.json()["id"]
        response = admin.post(
            f"/admin/v1/accounts/{account_id}/grants",
            json={"amount_cents": 10**9, "idempotency_key": "seed"},
        )
        assert response.status_code == 201, response.text
        key = admin.post(f"/admin/v1/accounts/{account_id}/api-keys", json={"name": "k"}).json()
    time.sleep(2.5)  # the price is in force from then on
    return model, key["id"], key["key"]


def _batch(key_id: str, model: str, at: datetime) -> list[dict[str, Any]]:
    return [
        {
            "request_id": secrets.token_hex(8),
            "api_key_id": key_id,
            "model": model,
            "api": "chat_completions",
            "usage": {"prompt_tokens": 1000, "completion_tokens": 100},
            "occurred_at": at.isoformat(),
            "outcome": "completed",
        }
        for _ in range(BATCH_SIZE)
    ]


def test_mixed_load_on_embedded_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metering.db'}"
    migrate.upgrade(url)
    server = ServerProcess(url, tmp_path / "server", workers=2).start()
    try:
        model, key_id, secret = _seed(server.base_url)
        recorder = Recorder()
        done = threading.Event()
        recorded: list[int] = []

        def sender() -> None:
            with httpx.Client(base_url=server.base_url, headers=GATEWAY, timeout=30) as c:
                for _ in range(BATCHES):
                    events = _batch(key_id, model, datetime.now(UTC) - timedelta(seconds=1))
                    response = recorder.timed(
                        "ingest", lambda e=events: c.post("/v1/usage/events", json={"events": e})
                    )
                    if response is not None and response.status_code == 200:
                        recorded.append(response.json()["recorded"])

        def authorizer() -> None:
            with httpx.Client(base_url=server.base_url, headers=GATEWAY, timeout=30) as c:
                body = {
                    "api_key": secret,
                    "model": model,
                    "api": "chat_completions",
                    "prompt_tokens": 1000,
                    "max_tokens": 100,
                }
                for _ in range(AUTHS_PER_CONNECTION):
                    response = recorder.timed(
                        "authorize", lambda: c.post("/v1/authorizations", json=body)
                    )
                    if response is not None and response.status_code == 200:
                        hold = response.json()["id"]
                        recorder.timed("void", lambda h=hold: c.delete(f"/v1/authorizations/{h}"))

        def reader() -> None:
            starting = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
            headers = {"Authorization": f"Bearer {secret}"}
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as c:
                while not done.is_set():
                    recorder.timed(
                        "usage report",
                        lambda: c.get(
                            "/v1/usage", params={"starting_at": starting, "bucket_width": "1h"}
                        ),
                    )

        threads = [threading.Thread(target=sender)] + [
            threading.Thread(target=authorizer) for _ in range(AUTH_CONNECTIONS)
        ]
        read = threading.Thread(target=reader)
        read.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        read.join()

        print(recorder.summary())
        assert recorder.problems() == [], recorder.summary()
        assert recorded == [BATCH_SIZE] * BATCHES
        assert len(recorder.samples["authorize"]) == AUTH_CONNECTIONS * AUTHS_PER_CONNECTION
        assert len(recorder.samples["usage report"]) > 0
    finally:
        server.stop()
    database = Database.from_url(url)
    try:
        with database.reading() as session:
            assert verify(session) == []
    finally:
        database.dispose()
