"""Refused batches (issue 35): how long the service takes over a batch the database refuses for
the range, on each backend, and over reprocessing a large quarantine on the Citus cluster.

On each backend (embedded SQLite, one PostgreSQL server, the local Citus cluster: a fresh
database each, migrated by ``metering migrate``, one server of one worker): a prepaid account
whose balance sits near the bottom of the signed 64-bit range (an adjustment of −9×10¹² cents),
a model at the schema's maximum rates, and a batch of 999 events of that account, each of the
largest usage, with one event of another account in the middle. The first few fit, the rest
would take the balance beyond the range: quarantined ``invalid_usage``; the other account's
event is recorded. Figure: the batch's time (target ≤ 5 s, what a gateway's client waits).

On the cluster, the account's quarantine is then filled to 2,000 entries with more such
batches and ``POST /admin/v1/quarantine/reprocess`` (no body: every entry) timed (target ≤
30 s): every entry stays, one more attempt counted.

Every answer is checked against the price oracle (tests/oracle.py): the events recorded, the
balances, the counts; any difference is a problem that makes the figure not met.

Run: ``make bench BENCH=refusals`` (``python -m bench refusals``); ``BENCH_REFUSALS_BACKENDS``
(``sqlite,postgresql,citus``) picks the backends.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.bench_citus import CITUS_URL, citus_database, ensure_cluster
from bench.common import (
    GATEWAY_TOKEN,
    Admin,
    CodeUnderTest,
    Result,
    bench_database,
    format_timestamp,
)
from tests import oracle

MODEL = "Refusal-Max"
MAX_RATE = 10**12  # microcents per million tokens: the schema's maximum
MAX_TOKENS = 2**31 - 1
RATES = (MAX_RATE, MAX_RATE, MAX_RATE)
INT64_MIN = -(2**63)
NEAR_BOTTOM_CENTS = -9 * 10**12
BATCH_TARGET_SECONDS = 5.0
REPROCESS_TARGET_SECONDS = 30.0
TIMEOUT = 900.0  # the old code took minutes: measured, not cut short


@dataclass
class Config:
    backends: tuple[str, ...] = tuple(
        os.environ.get("BENCH_REFUSALS_BACKENDS", "sqlite,postgresql,citus").split(",")
    )
    quarantine: int = 2000  # entries reprocessed on the cluster
    code: CodeUnderTest = field(default_factory=CodeUnderTest)


@contextmanager
def _database(backend: str, workdir: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'refusals.db'}"
    elif backend == "postgresql":
        with bench_database() as url:
            yield url
    else:
        ensure_cluster(CITUS_URL)
        with citus_database(CITUS_URL, 32) as url:
            yield url


def _catalog(workdir: Path) -> Path:
    price = {
        "effective_at": "2000-01-01T00:00:00Z",
        "input_microcents_per_million": MAX_RATE,
        "output_microcents_per_million": MAX_RATE,
        "cache_read_microcents_per_million": MAX_RATE,
    }
    model = {"id": MODEL, "display_name": MODEL, "context_length": MAX_TOKENS, "prices": [price]}
    path = workdir / "refusals-catalog.json"
    path.write_text(json.dumps({"models": [model]}))
    return path


def _event(key_id: str, prompt: int, output: int, at: datetime) -> dict[str, Any]:
    return {
        "request_id": secrets.token_hex(8),
        "api_key_id": key_id,
        "model": MODEL,
        "api": "chat_completions",
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
        },
        "occurred_at": format_timestamp(at),
        "outcome": "completed",
    }


def _send(client: httpx.Client, events: list[dict[str, Any]]) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    response = client.post("/v1/usage/events", json={"events": events})
    return time.monotonic() - started, response


def _balance(admin: Admin, account_id: str) -> int:
    return int(
        admin.client.get(f"/admin/v1/accounts/{account_id}/credits").json()["balance_microcents"]
    )


def _one(config: Config, backend: str, workdir: Path) -> list[Result]:
    results = []
    code = config.code
    with _database(backend, workdir) as url:
        code.migrate(url, workdir)
        code.import_catalog(url, workdir, _catalog(workdir))
        server = code.server(url, workdir / "server", 1).start()
        try:
            gateway = httpx.Client(
                base_url=server.base_url,
                headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
                timeout=TIMEOUT,
            )
            with Admin(server.base_url) as admin, gateway:
                near = admin.account("near the bottom")
                admin._post(
                    f"/admin/v1/accounts/{near}/adjustments",
                    {
                        "amount_cents": NEAR_BOTTOM_CENTS,
                        "idempotency_key": "near",
                        "reason": "bench",
                    },
                )
                near_key, _ = admin.key(near)
                other = admin.account("other")
                admin.grant(other, 100)
                other_key, _ = admin.key(other)
                start, other_start = _balance(admin, near), _balance(admin, other)
                at = datetime.now(UTC) - timedelta(minutes=5)
                big = [_event(near_key, MAX_TOKENS, MAX_TOKENS, at) for _ in range(999)]
                small = _event(other_key, 10, 1, at)
                charge = oracle.event_charge(big[0], RATES).total_microcents
                fitting = (start - INT64_MIN) // charge
                seconds, answer = _send(gateway, [*big[:500], small, *big[500:]])
                problems = []
                if answer.status_code != 200:
                    problems.append(f"batch: {answer.status_code} {answer.text[:200]}")
                else:
                    body = answer.json()
                    expected = (fitting + 1, 999 - fitting)
                    if (body["recorded"], body["quarantined"]) != expected:
                        problems.append(
                            f"batch: {body['recorded']}, {body['quarantined']} != {expected}"
                        )
                    if _balance(admin, near) != start - fitting * charge:
                        problems.append("the account's balance is not the oracle's")
                    small_charge = oracle.event_charge(small, RATES).total_microcents
                    if _balance(admin, other) != other_start - small_charge:
                        problems.append("the other account's balance is not the oracle's")
                results.append(
                    Result(
                        f"refusals.batch.{backend}",
                        f"a batch of 999 events beyond the range + 1 of another account, {backend}",
                        f"<= {BATCH_TARGET_SECONDS:g} s",
                        round(seconds, 2),
                        "s",
                        seconds <= BATCH_TARGET_SECONDS,
                        "one batch",
                        higher_is_better=False,
                        problems=tuple(problems),
                    )
                )
                if backend == "citus":
                    results.append(_reprocess(config, admin, gateway, near_key, 999 - fitting, at))
        finally:
            server.stop()
    return results


def _reprocess(
    config: Config,
    admin: Admin,
    gateway: httpx.Client,
    key_id: str,
    quarantined: int,
    at: datetime,
) -> Result:
    """The quarantine filled to ``config.quarantine`` entries, then one reprocess of all."""
    problems = []
    while quarantined < config.quarantine:
        size = min(1000, config.quarantine - quarantined)
        _, answer = _send(
            gateway, [_event(key_id, MAX_TOKENS, MAX_TOKENS, at) for _ in range(size)]
        )
        if answer.status_code != 200 or answer.json()["quarantined"] != size:
            problems.append(f"filling: {answer.status_code} {answer.text[:200]}")
            break
        quarantined += size
    started = time.monotonic()
    answer = admin.client.post("/admin/v1/quarantine/reprocess", timeout=TIMEOUT)
    seconds = time.monotonic() - started
    if answer.status_code != 200:
        problems.append(f"reprocess: {answer.status_code} {answer.text[:200]}")
    elif (answer.json()["recorded"], answer.json()["quarantined"]) != (0, quarantined):
        problems.append(
            f"reprocess: {answer.json()['recorded']} recorded, {answer.json()['quarantined']} kept"
        )
    return Result(
        "refusals.reprocess.citus",
        f"POST /admin/v1/quarantine/reprocess of {config.quarantine:,} entries beyond the "
        "range, citus",
        f"<= {REPROCESS_TARGET_SECONDS:g} s",
        round(seconds, 2),
        "s",
        seconds <= REPROCESS_TARGET_SECONDS,
        "one reprocess",
        higher_is_better=False,
        problems=tuple(problems),
    )


def run(config: Config | None = None) -> list[Result]:
    config = config or Config()
    results: list[Result] = []
    for backend in config.backends:
        with tempfile.TemporaryDirectory(prefix=f"bench-refusals-{backend}-") as tmp:
            results.extend(_one(config, backend, Path(tmp)))
    for result in results:
        problems = f" (problems: {'; '.join(result.problems)})" if result.problems else ""
        print(f"   {result.name}: {result.measured} s{problems}", flush=True)
    return results
