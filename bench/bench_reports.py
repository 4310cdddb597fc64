"""Usage report latency on PostgreSQL (issue 5's benchmark).

One prepaid account with ``EVENTS`` (10,000,000) usage events spread evenly over the 93 days
before today, 20 models and 50 keys, sent through ``POST /v1/usage/events`` (batches of 1000
from ``SENDERS`` connections to a 2-worker server: priced, inserted, debited and aggregated), every
answer checked (all recorded), then the stored count checked, ``metering verify`` run, and the
account's balance held to minus the price oracle's charges of every event (``tests/oracle.py``;
it has no grant), as is the daily report's total cost. Then,
over loopback HTTP against a real server process (one uvicorn worker, one keep-alive connection,
requests one after another as a finance script sends them): p50/p95 latency of the 93-bucket
daily report and the 168-bucket hourly report, by model and by key, ``ROUNDS`` rounds each
alternated with the in-run baseline — the same daily report computed with ``GROUP BY`` over the
raw events; figures are medians of the rounds. The benchmark also checks that both give the
same numbers.

Run: ``python -m bench reports`` (``BENCH_REPORTS_EVENTS=1000000`` for a quicker run: from
~1M events on, almost every hour has every key and model, so the reports read as many rows).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg

from bench import common
from bench.bench_ingest import check_counts
from bench.common import (
    GATEWAY_TOKEN,
    Admin,
    Books,
    CodeUnderTest,
    Result,
    bench_database,
    catalog_file,
    format_timestamp,
    libpq_url,
    load_average,
    median,
    percentile,
    rounds_label,
)
from bench.loadgen import Connection, Unexpected, expect
from tests import oracle

MODELS = [f"Bench-Model-{index:02d}" for index in range(20)]
KEYS = 50
DAYS = 93
BATCH = 1000  # the most one request may carry
TARGET_MS = 50.0
# The billing portal's Usage page for the 93 days by key (a browser's request, session cookie).
PORTAL_TARGET_MS = 300.0
CSRF = re.compile(rb'name="csrf_token" value="([^"]+)"')
RATES = (22_000_000, 339_000_000, 17_750_000)


@dataclass
class Config:
    """What a run does; the defaults are ``make bench``'s (a test runs it small)."""

    events: int = int(os.environ.get("BENCH_REPORTS_EVENTS", "10000000"))
    senders: int = int(os.environ.get("BENCH_REPORTS_SENDERS", "4"))
    samples: int = int(os.environ.get("BENCH_REPORTS_SAMPLES", "200"))
    warmup: int = 10  # requests before measuring, per report and round
    rounds: int = common.ROUNDS
    code: CodeUnderTest = field(default_factory=CodeUnderTest)
    # The 93 days end at the start of today (UTC): every event is in the past.
    first_day: datetime = field(
        default_factory=lambda: (
            datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            - timedelta(days=DAYS)
        )
    )

    @property
    def last_week(self) -> datetime:
        return self.first_day + timedelta(days=DAYS - 7)

    def window(self, report: str) -> dict[str, str]:
        if report == "daily":
            start, end, width = self.first_day, self.first_day + timedelta(days=DAYS), "1d"
        else:
            start, end, width = self.last_week, self.last_week + timedelta(days=7), "1h"
        return {
            "starting_at": format_timestamp(start),
            "ending_at": format_timestamp(end),
            "bucket_width": width,
        }


def _setup(
    config: Config, url: str, base_url: str, workdir: Path
) -> tuple[str, str, list[str], Books]:
    """Catalog (``metering catalog import``), account and keys (admin API): (account id, one
    key's secret, key ids, its books: no grant)."""
    config.code.import_catalog(url, workdir, catalog_file(workdir, MODELS, RATES))
    with Admin(base_url) as admin:
        account = admin.account("bench-reports")
        keys = [admin.key(account) for _ in range(KEYS)]
    books = Books()
    books.open(account, 0, keys)
    return account, keys[-1][1], [key_id for key_id, _ in keys], books


class Events:
    """Batch ``chunk`` of the load: events [chunk × BATCH, …), evenly spaced in time, with a
    random key, model and tokens (seeded by the chunk), written as JSON text directly (the
    sender shares the two cores with the server)."""

    def __init__(self, config: Config, key_ids: list[str]) -> None:
        self.config = config
        self.key_ids = key_ids
        self.span_us = DAYS * 86_400_000_000
        self.days = [
            (config.first_day + timedelta(days=d)).strftime("%Y-%m-%d") for d in range(DAYS + 1)
        ]

    def at(self, index: int) -> str:
        micros = index * self.span_us // self.config.events
        day, rest = divmod(micros, 86_400_000_000)
        seconds, fraction = divmod(rest, 1_000_000)
        hours, seconds = divmod(seconds, 3600)
        minutes, seconds = divmod(seconds, 60)
        return f"{self.days[day]}T{hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}Z"

    def body(self, chunk: int) -> tuple[bytes, int, Counter[str]]:
        """The batch's JSON, its number of events, and their charges by key id (the price
        oracle's: every model has the same rates)."""
        rng = random.Random(chunk)
        first = chunk * BATCH
        events = []
        charged: Counter[str] = Counter()
        for index in range(first, min(first + BATCH, self.config.events)):
            prompt = rng.randrange(1, 8000)
            cached = rng.randrange(0, prompt + 1) if rng.random() < 0.6 else 0
            output = rng.randrange(1, 2000)
            key = self.key_ids[rng.randrange(KEYS)]
            model = MODELS[rng.randrange(len(MODELS))]
            tokens = oracle.Tokens(prompt, cached, output, output // 4)
            charged[key] += oracle.charge(tokens, RATES).total_microcents
            events.append(
                f'{{"request_id":"bench-{index}","api_key_id":"{key}","model":"{model}",'
                f'"api":"chat_completions","usage":{{"prompt_tokens":{prompt},'
                f'"completion_tokens":{output},"total_tokens":{prompt + output},'
                f'"prompt_tokens_details":{{"cached_tokens":{cached}}},'
                f'"completion_tokens_details":{{"reasoning_tokens":{output // 4}}}}},'
                f'"occurred_at":"{self.at(index)}","outcome":"completed"}}'
            )
        return ('{"events":[' + ",".join(events) + "]}").encode(), len(events), charged


async def _send_all(
    config: Config, port: int, events: Events
) -> tuple[int, Counter[str], list[str]]:
    """Every batch, from ``senders`` connections; (events answered as recorded, their charges
    by key id, problems)."""
    chunks = iter(range(-(-config.events // BATCH)))
    recorded = 0
    charged: Counter[str] = Counter()
    problems: list[str] = []
    started = time.monotonic()
    reported = 0

    async def sender() -> None:
        nonlocal recorded, reported
        connection = Connection("127.0.0.1", port, {"Authorization": f"Bearer {GATEWAY_TOKEN}"})
        try:
            for chunk in chunks:
                body, count, charges = events.body(chunk)
                try:
                    check_counts(await connection.request("POST", "/v1/usage/events", body), count)
                except Unexpected as exc:
                    if len(problems) < 3:
                        problems.append(f"load: {exc}")
                    continue
                recorded += count
                charged.update(charges)
                if recorded - reported >= 1_000_000:
                    reported = recorded
                    rate = recorded / (time.monotonic() - started)
                    print(f"   loaded {recorded:,} events ({rate:,.0f}/s)", flush=True)
        finally:
            await connection.close()

    await asyncio.gather(*(sender() for _ in range(config.senders)))
    return recorded, charged, problems


def _vacuum(url: str) -> None:
    """What autovacuum does soon after a bulk load: visibility map and planner statistics."""
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
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


def _raw_daily(config: Config, url: str, account_id: str, group_by: str) -> tuple[float, list[Any]]:
    """The daily report straight from the events: (seconds, rows)."""
    end = config.first_day + timedelta(days=DAYS)
    sql = RAW_DAILY.format(column=RAW_COLUMNS[group_by])
    with psycopg.connect(libpq_url(url)) as connection:
        started = time.perf_counter()
        rows = connection.execute(sql, (account_id, config.first_day, end)).fetchall()
        return time.perf_counter() - started, rows


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc): what a request costs the server,
    whatever else the machine is running."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    config: Config, port: int, secret: str, path: str
) -> tuple[list[float], bytes, list[str]]:
    """Latencies of ``samples`` requests after ``warmup`` ones (which warm the connection, the
    pool and the caches and are not recorded); the last body; problems."""
    connection = Connection("127.0.0.1", port, {"Authorization": f"Bearer {secret}"})
    latencies: list[float] = []
    body = b""
    problems: list[str] = []
    try:
        for index in range(config.samples + config.warmup):
            started = time.perf_counter()
            response = await connection.request("GET", path)
            elapsed = time.perf_counter() - started
            try:
                expect(response, 200, "report", object="usage_report")
            except Unexpected as exc:
                problems.append(str(exc))
                break
            body = response.body
            if index >= config.warmup:
                latencies.append(elapsed)
    finally:
        await connection.close()
    return latencies, body, problems


def _portal_cookie(base_url: str, account_id: str) -> str:
    """A portal session's cookie, got as a customer gets one: an operator's sign-in link,
    its confirmation page, its button (a POST with the page's CSRF token)."""
    with Admin(base_url) as admin:
        created = admin.client.post(f"/admin/v1/accounts/{account_id}/portal-sessions")
    if created.status_code != 201:
        raise Unexpected(f"portal link: {created.status_code} {created.text[:160]}")
    path = "/billing/sign-in/" + str(created.json()["url"]).rsplit("/", 1)[1]
    with httpx.Client(base_url=base_url, timeout=60) as browser:
        page = browser.get(path)
        match = CSRF.search(page.content)
        if page.status_code != 200 or match is None:
            raise Unexpected(f"portal confirmation page: {page.status_code}")
        signed_in = browser.post(path, data={"csrf_token": match.group(1).decode()})
        cookie = browser.cookies.get("metering_portal")
    if signed_in.status_code not in (200, 303) or not cookie:
        raise Unexpected(f"portal sign-in: {signed_in.status_code}")
    return f"metering_portal={cookie}"


async def _measure_portal(
    config: Config, port: int, cookie: str, path: str
) -> tuple[list[float], list[str]]:
    """Latencies of the portal page, as ``_measure`` does for the JSON report."""
    connection = Connection("127.0.0.1", port, {"Cookie": cookie})
    latencies: list[float] = []
    problems: list[str] = []
    try:
        for index in range(config.samples + config.warmup):
            started = time.perf_counter()
            response = await connection.request("GET", path)
            elapsed = time.perf_counter() - started
            try:
                expect(response, 200, "portal usage page")
                if b'id="usage-table"' not in response.body:
                    raise Unexpected("portal usage page: no usage table")
            except Unexpected as exc:
                problems.append(str(exc))
                break
            if index >= config.warmup:
                latencies.append(elapsed)
    finally:
        await connection.close()
    return latencies, problems


def _path(config: Config, report: str, group_by: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {**config.window(report), "group_by": group_by}.items())
    return f"/v1/usage?{query}"


def _matches_raw(
    config: Config, report_body: dict[str, Any], raw_rows: list[Any], group_by: str, cost: int
) -> bool:
    """Whether the daily report equals the GROUP BY over the events, bucket by bucket, and its
    total cost is ``cost`` (the oracle's charges of every event sent)."""
    expected = {
        (day.strftime("%Y-%m-%dT%H:%M:%SZ"), group): (n, p, c, o, cost)
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
    totals = report_body["totals"]
    return (
        seen == expected
        and totals["requests"] == config.events
        and totals["cost_microcents"] == cost
    )


@dataclass
class Report:
    """One report's rounds."""

    name: str
    buckets: str
    group_by: str
    p50: list[float] = field(default_factory=list)
    p95: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    raw_ms: list[float] = field(default_factory=list)  # the daily report's in-run baseline
    size_kib: float = 0.0
    problems: list[str] = field(default_factory=list)


def run(config: Config | None = None) -> list[Result]:
    config = config or Config()
    reports = [
        Report(name, "93 daily" if name == "daily" else "168 hourly", group_by)
        for name in ("daily", "hourly")
        for group_by in ("model", "api_key")
    ]
    matches: list[bool] = []
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        cli = workdir / "cli"
        config.code.migrate(url, cli)
        loader = config.code.server(url, workdir / "loader", workers=2).start()
        try:
            account_id, secret, key_ids, books = _setup(config, url, loader.base_url, cli)
            load_started = time.monotonic()
            recorded, charged, load_problems = asyncio.run(
                _send_all(config, loader.port, Events(config, key_ids))
            )
            load_seconds = time.monotonic() - load_started
            load_problems += books.problems(loader.base_url, charged)
        finally:
            loader.stop()
        stored = common.sql_scalar(url, "SELECT count(*) FROM usage_events")
        if stored != config.events or recorded != config.events:
            load_problems.append(
                f"{config.events:,} events sent, {recorded:,} answered as recorded, "
                f"{stored:,} stored"
            )
        verify_started = time.monotonic()
        load_problems += config.code.verify(url, cli)
        verify_seconds = time.monotonic() - verify_started
        vacuum_started = time.monotonic()
        _vacuum(url)
        vacuum_seconds = time.monotonic() - vacuum_started
        print(
            f"   load {load_seconds:.0f} s, verify {verify_seconds:.0f} s, vacuum analyze "
            f"{vacuum_seconds:.0f} s; {load_problems or 'every event recorded and stored'}",
            flush=True,
        )

        server = config.code.server(url, workdir / "server", workers=1).start()
        load_before = load_average()
        portal = Report("portal", "93 daily", "api_key")
        try:
            try:
                cookie = _portal_cookie(server.base_url, account_id)
            except (Unexpected, httpx.HTTPError) as exc:
                cookie = ""
                portal.problems.append(str(exc))
            for index in range(config.rounds):
                for report in reports:
                    if report.name == "daily":
                        raw_seconds, raw_rows = _raw_daily(config, url, account_id, report.group_by)
                        report.raw_ms.append(raw_seconds * 1000)
                    cpu_before = _cpu_seconds(server.pid)
                    path = _path(config, report.name, report.group_by)
                    latencies, body, problems = asyncio.run(
                        _measure(config, server.port, secret, path)
                    )
                    report.problems += problems
                    if not latencies:
                        continue
                    cpu = (_cpu_seconds(server.pid) - cpu_before) / (len(latencies) + config.warmup)
                    report.cpu_ms.append(cpu * 1000)
                    report.p50.append(percentile(latencies, 50) * 1000)
                    report.p95.append(percentile(latencies, 95) * 1000)
                    report.size_kib = len(body) / 1024
                    if report.name == "daily" and index == 0:
                        same = _matches_raw(
                            config, json.loads(body), raw_rows, report.group_by, charged.total()
                        )
                        matches.append(same)
                if cookie:
                    cpu_before = _cpu_seconds(server.pid)
                    portal_path = _path(config, "daily", "api_key").replace(
                        "/v1/usage", "/billing/usage"
                    )
                    latencies, problems = asyncio.run(
                        _measure_portal(config, server.port, cookie, portal_path)
                    )
                    portal.problems += problems
                    if latencies:
                        cpu = (_cpu_seconds(server.pid) - cpu_before) / (
                            len(latencies) + config.warmup
                        )
                        portal.cpu_ms.append(cpu * 1000)
                        portal.p50.append(percentile(latencies, 50) * 1000)
                        portal.p95.append(percentile(latencies, 95) * 1000)
                print(
                    f"   round {index + 1}: p95 "
                    + ", ".join(f"{r.name}/{r.group_by} {r.p95[-1]:.1f} ms" for r in reports)
                    + f"; load {load_average():.1f}",
                    flush=True,
                )
        finally:
            server.stop()

    label = rounds_label(config.rounds)
    results = [
        Result(
            "reports.load",
            f"load {config.events:,} events via POST /v1/usage/events ({config.senders} "
            f"connections, batches of {BATCH:,}, 2 workers)",
            "-",
            config.events / load_seconds,
            "events/s",
            None,
            "1 run",
            f"{load_seconds:,.0f} s (+ {verify_seconds:,.0f} s metering verify, "
            f"{vacuum_seconds:,.0f} s VACUUM ANALYZE)",
            problems=tuple(load_problems),
        )
    ]
    for report in reports:
        figure = (
            f"report {report.buckets} buckets, group_by={report.group_by} "
            f"({report.size_kib:,.0f} KiB)"
        )
        p50, p95 = median(report.p50), median(report.p95)
        problems = tuple(load_problems + report.problems)
        results.append(
            Result(
                f"reports.{report.name}.{report.group_by}.p50",
                f"{figure} p50",
                "-",
                p50,
                "ms",
                None,
                label,
                f"server CPU {median(report.cpu_ms):.1f} ms per request",
                higher_is_better=False,
                problems=problems,
            )
        )
        raw = median(report.raw_ms)
        results.append(
            Result(
                f"reports.{report.name}.{report.group_by}.p95",
                f"{figure} p95",
                f"<= {TARGET_MS:.0f} ms",
                p95,
                "ms",
                p95 <= TARGET_MS,
                label,
                f"GROUP BY over raw events: {raw:,.0f} ms (SQL only) = {raw / p50:,.0f}x this p50"
                if raw and p50
                else "",
                raw or None,
                higher_is_better=False,
                problems=problems,
            )
        )
    portal_p95 = median(portal.p95)
    results.append(
        Result(
            "reports.portal.usage.api_key.p95",
            "billing portal Usage page, 93 daily buckets by key (HTML: table and chart) p95",
            f"<= {PORTAL_TARGET_MS:.0f} ms",
            portal_p95,
            "ms",
            portal_p95 <= PORTAL_TARGET_MS if portal.p95 else False,
            label,
            f"p50 {median(portal.p50):.1f} ms; "
            f"server CPU {median(portal.cpu_ms):.1f} ms per request",
            higher_is_better=False,
            problems=tuple(load_problems + portal.problems),
        )
    )
    results.append(
        Result(
            "reports.load_average",
            "machine load average (1 min) around the latency runs (2 cores: above 2, "
            "requests queue for a core)",
            "-",
            load_average(),
            "",
            None,
            "at the end",
            f"{load_before:.1f} before",
            higher_is_better=False,
        )
    )
    same = len(matches) == 2 and all(matches)
    results.append(
        Result(
            "reports.equal_raw",
            "daily reports equal the GROUP BY over the raw events (both group-bys), their "
            "total cost the oracle's",
            "yes",
            float(same),
            "(1 = yes)",
            same,
            "first round",
        )
    )
    return results
