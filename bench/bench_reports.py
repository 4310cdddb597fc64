"""Usage report latency on PostgreSQL (issue 5's benchmark).

One prepaid account with ``EVENTS`` (10,000,000) usage events spread evenly over 93 days, 20
models and 50 keys, loaded in-process through the ingest service (``record_events``: priced,
inserted, debited and aggregated, exactly as ``POST /v1/usage/events`` does it, in batches of
``BATCH`` by ``LOADERS`` processes). Then, over loopback HTTP against a real server process
(one uvicorn worker, one keep-alive connection, requests one after another as a finance script
sends them): p50/p95 latency of the 93-bucket daily report and the 168-bucket hourly report, by
model and by key. The in-run baseline is the same daily report computed with ``GROUP BY`` over
the raw events; the benchmark also checks that both give the same numbers.

Run: ``python -m bench reports`` (``BENCH_REPORTS_EVENTS=1000000`` for a quicker run: from
~1M events on, almost every hour has every key and model, so the reports read as many rows).
Batches stay at 5,000: hold settlement's ``(account_id, request_id) IN (…)`` list exceeds
PostgreSQL's stack depth from about 10,000 events per call.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from bench.common import Result, bench_database, percentile
from bench.loadgen import Connection
from metering.accounts import service as accounts
from metering.catalog.importer import import_catalog
from metering.catalog.schemas import CatalogFile
from metering.db import Database
from metering.kit.timeutil import format_timestamp
from tests.servers import ServerProcess

EVENTS = int(os.environ.get("BENCH_REPORTS_EVENTS", "10000000"))
LOADERS = int(os.environ.get("BENCH_REPORTS_LOADERS", "2"))
SAMPLES = int(os.environ.get("BENCH_REPORTS_SAMPLES", "200"))
BATCH = 5_000
MODELS = [f"Bench-Model-{index:02d}" for index in range(20)]
KEYS = 50
FIRST_DAY = datetime(2026, 8, 28, tzinfo=UTC)
DAYS = 93
LAST_WEEK = FIRST_DAY + timedelta(days=DAYS - 7)
INGEST_NOW = FIRST_DAY + timedelta(days=DAYS)  # the ingest clock: every event is in the past
TARGET_MS = 50.0
WARMUP = 10  # requests before measuring, per report
RATES = (22_000_000, 339_000_000, 17_750_000)

REPORTS = {
    "daily": {
        "starting_at": format_timestamp(FIRST_DAY),
        "ending_at": format_timestamp(FIRST_DAY + timedelta(days=DAYS)),
        "bucket_width": "1d",
    },
    "hourly": {
        "starting_at": format_timestamp(LAST_WEEK),
        "ending_at": format_timestamp(LAST_WEEK + timedelta(days=7)),
        "bucket_width": "1h",
    },
}


def _setup(url: str) -> tuple[str, str, list[str]]:
    """Catalog, account and keys (service layer): (account id, one key's secret, key ids)."""
    database = Database.from_url(url, pool_size=1)
    now = datetime.now(UTC)
    price = {
        "effective_at": "2026-01-01T00:00:00Z",
        "input_microcents_per_million": RATES[0],
        "output_microcents_per_million": RATES[1],
        "cache_read_microcents_per_million": RATES[2],
    }
    catalog = CatalogFile.model_validate(
        {
            "models": [
                {"id": m, "display_name": m, "context_length": 131072, "prices": [price]}
                for m in MODELS
            ]
        }
    )
    try:
        with database.unit_of_work() as session:
            import_catalog(session, catalog, now)
            account = accounts.create_account(session, "bench-reports", "prepaid", now)
            key_ids, secret = [], ""
            for index in range(KEYS):
                key, secret = accounts.create_api_key(
                    session, account, f"key-{index:02d}", None, now
                )
                key_ids.append(key.id)
            return account.id, secret, key_ids
    finally:
        database.dispose()


_database: Database | None = None
_key_ids: list[str] = []


def _init_loader(url: str, key_ids: list[str]) -> None:
    global _database, _key_ids
    _database = Database.from_url(url, pool_size=1)
    _key_ids = key_ids


def _load_chunk(chunk: int) -> int:
    """Events [chunk × BATCH, …): evenly spaced in time, random key, model and tokens."""
    from metering.usage.service import record_events

    assert _database is not None
    rng = random.Random(chunk)
    span_us = DAYS * 86_400_000_000
    first = chunk * BATCH
    raws = []
    for index in range(first, min(first + BATCH, EVENTS)):
        prompt = rng.randrange(1, 8000)
        cached = rng.randrange(0, prompt + 1) if rng.random() < 0.6 else 0
        output = rng.randrange(1, 2000)
        at = FIRST_DAY + timedelta(microseconds=index * span_us // EVENTS)
        raws.append(
            {
                "request_id": f"bench-{index}",
                "api_key_id": _key_ids[rng.randrange(KEYS)],
                "model": MODELS[rng.randrange(len(MODELS))],
                "api": "chat_completions",
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": output,
                    "total_tokens": prompt + output,
                    "prompt_tokens_details": {"cached_tokens": cached},
                    "completion_tokens_details": {"reasoning_tokens": output // 4},
                },
                "occurred_at": format_timestamp(at),
                "outcome": "completed",
            }
        )
    with _database.unit_of_work() as session:
        outcome = record_events(session, raws, INGEST_NOW)
    recorded = outcome.count("recorded")
    assert recorded == len(raws), f"chunk {chunk}: {recorded} of {len(raws)} recorded"
    return recorded


def _load(url: str, key_ids: list[str]) -> float:
    chunks = range(-(-EVENTS // BATCH))
    started = time.monotonic()
    done = 0
    context = multiprocessing.get_context("spawn")
    with context.Pool(LOADERS, initializer=_init_loader, initargs=(url, key_ids)) as pool:
        for recorded in pool.imap(_load_chunk, chunks):
            done += recorded
            if done % 1_000_000 < BATCH:
                rate = done / (time.monotonic() - started)
                print(f"   loaded {done:,} events ({rate:,.0f}/s)", flush=True)
    assert done == EVENTS
    return time.monotonic() - started


def _psycopg_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _vacuum(url: str) -> None:
    """What autovacuum does soon after a bulk load: visibility map and planner statistics."""
    with psycopg.connect(_psycopg_url(url), autocommit=True) as connection:
        for name in ("usage_rollups", "usage_events"):
            connection.execute(f"VACUUM (ANALYZE) {name}")


RAW_DAILY = """
SELECT date_trunc('day', occurred_at AT TIME ZONE 'UTC') AS day, {column}, count(*),
       sum(prompt_tokens), sum(cached_tokens), sum(output_tokens), sum(total_microcents)
FROM usage_events
WHERE account_id = %s AND occurred_at >= %s AND occurred_at < %s
GROUP BY 1, 2 ORDER BY 1, 2
"""
RAW_COLUMNS = {"model": "model_id", "api_key": "api_key_id"}


def _raw_daily(url: str, account_id: str, group_by: str, runs: int = 3) -> tuple[float, list[Any]]:
    """The daily report straight from the events: (median seconds, rows)."""
    timings, rows = [], []
    end = FIRST_DAY + timedelta(days=DAYS)
    sql = RAW_DAILY.format(column=RAW_COLUMNS[group_by])
    with psycopg.connect(_psycopg_url(url)) as connection:
        for _ in range(runs):
            started = time.perf_counter()
            rows = connection.execute(sql, (account_id, FIRST_DAY, end)).fetchall()
            timings.append(time.perf_counter() - started)
    return sorted(timings)[len(timings) // 2], rows


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc): what a request costs the server,
    whatever else the machine is running."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(port: int, secret: str, path: str, samples: int) -> tuple[list[float], bytes]:
    connection = Connection("127.0.0.1", port, {"Authorization": f"Bearer {secret}"})
    latencies: list[float] = []
    body = b""
    try:
        for index in range(samples + WARMUP):
            started = time.perf_counter()
            response = await connection.request("GET", path)
            elapsed = time.perf_counter() - started
            assert response.status == 200, response.body[:500]
            body = response.body
            if index >= WARMUP:  # the first requests warm the connection pool and caches
                latencies.append(elapsed)
    finally:
        await connection.close()
    return latencies, body


def _path(report: str, group_by: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {**REPORTS[report], "group_by": group_by}.items())
    return f"/v1/usage?{query}"


def _matches_raw(report_body: dict[str, Any], raw_rows: list[Any], group_by: str) -> bool:
    """Whether the daily report equals the GROUP BY over the events, bucket by bucket."""
    expected = {
        (format_timestamp(day.replace(tzinfo=UTC)), group): (n, p, c, o, cost)
        for day, group, n, p, c, o, cost in raw_rows
    }
    seen = {
        (bucket["starting_at"], r[group_by]): (
            r["requests"],
            r["input_tokens"],
            r["cache_read_tokens"],
            r["output_tokens"],
            r["cost_microcents"],
        )
        for bucket in report_body["data"]
        for r in bucket["results"]
    }
    return seen == expected and report_body["totals"]["requests"] == EVENTS


def run() -> list[Result]:
    import asyncio
    import json

    results: list[Result] = []
    with bench_database() as url, tempfile.TemporaryDirectory() as workdir:
        account_id, secret, key_ids = _setup(url)
        load_seconds = _load(url, key_ids)
        vacuum_started = time.monotonic()
        _vacuum(url)
        vacuum_seconds = time.monotonic() - vacuum_started
        print(f"   load {load_seconds:.0f} s, vacuum analyze {vacuum_seconds:.0f} s", flush=True)
        results.append(
            Result(
                f"load {EVENTS:,} events via record_events ({LOADERS} processes, "
                f"batches of {BATCH:,})",
                "-",
                EVENTS / load_seconds,
                "events/s",
                None,
                f"{load_seconds:,.0f} s (+ {vacuum_seconds:,.0f} s VACUUM ANALYZE)",
            )
        )
        raw = {group_by: _raw_daily(url, account_id, group_by) for group_by in RAW_COLUMNS}

        matches: list[bool] = []
        server = ServerProcess(url, Path(workdir) / "server").start()
        load_before = os.getloadavg()[0]
        try:
            for report in ("daily", "hourly"):
                buckets = "93 daily" if report == "daily" else "168 hourly"
                for group_by in ("model", "api_key"):
                    assert server.process is not None
                    cpu_before = _cpu_seconds(server.process.pid)
                    latencies, body = asyncio.run(
                        _measure(server.port, secret, _path(report, group_by), SAMPLES)
                    )
                    cpu_ms = (_cpu_seconds(server.process.pid) - cpu_before) * 1000
                    cpu_ms /= SAMPLES + WARMUP
                    p50 = percentile(latencies, 50) * 1000
                    p95 = percentile(latencies, 95) * 1000
                    size = f"{len(body) / 1024:,.0f} KiB"
                    figure = f"report {buckets} buckets, group_by={group_by} ({size})"
                    results.append(
                        Result(
                            f"{figure} p50",
                            "-",
                            p50,
                            "ms",
                            None,
                            f"server CPU {cpu_ms:.1f} ms per request",
                        )
                    )
                    baseline = ""
                    if report == "daily":
                        raw_seconds, raw_rows = raw[group_by]
                        matches.append(_matches_raw(json.loads(body), raw_rows, group_by))
                        baseline = (
                            f"GROUP BY over raw events: {raw_seconds * 1000:,.0f} ms "
                            f"(SQL only) = {raw_seconds * 1000 / p50:,.0f}x this p50"
                        )
                    results.append(
                        Result(
                            f"{figure} p95",
                            f"<= {TARGET_MS:.0f} ms",
                            p95,
                            "ms",
                            p95 <= TARGET_MS,
                            baseline,
                        )
                    )
        finally:
            server.stop()
        results.append(
            Result(
                "machine load average (1 min) around the latency runs (2 cores: above 2, "
                "requests queue for a core)",
                "-",
                os.getloadavg()[0],
                "",
                None,
                f"{load_before:.1f} before",
            )
        )
        same = len(matches) == 2 and all(matches)
        results.append(
            Result(
                "daily reports equal the GROUP BY over the raw events (both group-bys)",
                "yes",
                float(same),
                "(1 = yes)",
                same,
            )
        )
        for group_by, (raw_seconds, _) in raw.items():
            results.append(
                Result(
                    f"daily report by {group_by} as GROUP BY over the raw events "
                    "(median of 3, SQL only)",
                    "-",
                    raw_seconds * 1000,
                    "ms",
                    None,
                )
            )
    return results
