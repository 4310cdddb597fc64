"""Embedded SQLite under ordinary mixed load (issue 21, defect 4), over loopback HTTP.

The embedded default is the first thing every user runs. Two uvicorn workers of the service on
one SQLite file serve, all at once: one sender of 1,000-event batches (one after the other),
authorizations over many connections (each released by a void before the connection's next
one), and one reader of ``GET /v1/usage`` (hourly buckets of the last day, again and again,
``READER_PAUSE`` apart, until the rest is done). The figures: requests that failed (any answer
but the one expected — an authorization 200 ``active``, a void 200 ``voided``, a batch 200 with
every event recorded, a report 200 — or a 5xx, or a broken connection: target 0), the p99 and
the slowest latency of
every request of every kind (targets ≤ 1 s and ≤ 5 s), and the ingest's rate while it shares
the database. After each round every batch must be stored exactly (events counted in the
database), ``metering verify`` must pass, and the account's balance must be its grant less the
price oracle's charges (``tests/oracle.py``) of the events answered as recorded, nothing held.

It used to answer 500 ``database is locked`` with ~30 s stalls (every transaction, reads
included, began with ``BEGIN IMMEDIATE`` and polled SQLite's busy handler).

Run: ``python -m bench embedded`` (or ``make bench``). ``tests/reliability`` runs the same load,
smaller, as a test.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import common
from bench.common import (
    GATEWAY_TOKEN,
    Admin,
    Books,
    CodeUnderTest,
    Result,
    catalog_file,
    format_timestamp,
    median,
    percentile,
    rounds_label,
)
from bench.loadgen import Connection, HttpError, Unexpected, expect
from tests import oracle

MODEL = "Bench-Embedded"
RATES = (22_000_000, 339_000_000, 17_750_000)
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}  # every event's
CHARGE = oracle.event_charge({"api": "chat_completions", "usage": USAGE}, RATES).total_microcents
GRANT_CENTS = 10**9
P99_SECONDS, MAX_SECONDS = 1.0, 5.0
# The reader is a dashboard refreshing as fast as it can but for this pause between reports (a
# report of the last day's hours costs the server ~10 ms of CPU; back to back, one reader alone
# would take a core of this two-core machine away from the writers it shares it with).
READER_PAUSE = 0.05


@dataclass
class Config:
    """What a run does; the defaults are ``make bench``'s (a test runs it small)."""

    batches: int = int(os.environ.get("BENCH_EMBEDDED_BATCHES", "16"))
    batch_size: int = 1000
    connections: int = 60
    authorizations: int = 600  # over all connections
    workers: int = 2
    rounds: int = common.ROUNDS
    code: CodeUnderTest = field(default_factory=CodeUnderTest)


@dataclass
class Samples:
    """Every request of a mixed load: its kind, latency, and what went wrong."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    started: dict[str, list[float]] = field(default_factory=dict)  # since the load began
    origin: float = field(default_factory=time.perf_counter)
    errors: list[str] = field(default_factory=list)
    recorded: int = 0
    charged: Counter[str] = field(default_factory=Counter)  # by key id: the oracle's charges
    ingest_seconds: float = 0.0
    request_ids: list[str] = field(default_factory=list)

    def add(self, kind: str, seconds: float) -> None:
        self.latencies.setdefault(kind, []).append(seconds)
        self.started.setdefault(kind, []).append(time.perf_counter() - seconds - self.origin)

    def all(self) -> list[float]:
        return [t for values in self.latencies.values() for t in values]

    def p99(self) -> float:
        return percentile(self.all(), 99)

    def slowest(self) -> float:
        return max(self.all())

    def problems(self) -> list[str]:
        """The load's answers against its targets (empty: met)."""
        found = []
        if self.errors:
            found.append(f"{len(self.errors)} requests failed, e.g. " + " | ".join(self.errors[:2]))
        for kind, values in sorted(self.latencies.items()):
            p99, slowest = percentile(values, 99), max(values)
            if p99 > P99_SECONDS:
                found.append(f"{kind}: p99 {p99:.3f} s > {P99_SECONDS} s")
            if slowest > MAX_SECONDS:
                found.append(f"{kind}: slowest {slowest:.3f} s > {MAX_SECONDS} s")
        return found

    def summary(self) -> str:
        """Per kind: count, p99, and the slowest three with when they began (s into the load)."""
        parts = []
        for kind, values in sorted(self.latencies.items()):
            worst = sorted(zip(values, self.started[kind], strict=True), reverse=True)[:3]
            slowest = ", ".join(f"{t:.3f}s at {at:.1f}" for t, at in worst)
            parts.append(f"{kind}: n={len(values)} p99={percentile(values, 99):.3f}s ({slowest})")
        return "; ".join(parts)


async def _timed(
    samples: Samples, kind: str, connection: Connection, method: str, path: str, body: Any = None
) -> Any:
    """One request; its latency recorded, its answer returned (None when it broke)."""
    started = time.perf_counter()
    try:
        response = await connection.request(method, path, body)
    except (HttpError, OSError, asyncio.IncompleteReadError) as exc:
        samples.errors.append(f"{kind}: connection: {exc!r}")
        await connection.close()
        return None
    finally:
        samples.add(kind, time.perf_counter() - started)
    return response


async def _mixed(
    host: str,
    port: int,
    key_id: str,
    secret: str,
    model: str,
    batches: int,
    batch_size: int,
    connections: int,
    authorizations: int,
    gateway: dict[str, str],
    reader_pause: float,
) -> Samples:
    samples = Samples()
    done = asyncio.Event()
    run_id = secrets.token_hex(4)

    async def sender() -> None:
        connection = Connection(host, port, gateway)
        started = time.perf_counter()
        try:
            for number in range(batches):
                at = format_timestamp(datetime.now(UTC) - timedelta(seconds=1))
                events = [
                    {
                        "request_id": f"{run_id}-{number}-{i}",
                        "api_key_id": key_id,
                        "model": model,
                        "api": "chat_completions",
                        "usage": USAGE,
                        "occurred_at": at,
                        "outcome": "completed",
                    }
                    for i in range(batch_size)
                ]
                samples.request_ids.extend(e["request_id"] for e in events)
                response = await _timed(
                    samples, "ingest", connection, "POST", "/v1/usage/events", {"events": events}
                )
                if response is None:
                    continue
                try:
                    expect(response, 200, "batch", recorded=batch_size, quarantined=0)
                    samples.recorded += batch_size
                    samples.charged[key_id] += batch_size * CHARGE
                except Unexpected as exc:
                    samples.errors.append(str(exc))
        finally:
            samples.ingest_seconds = time.perf_counter() - started
            await connection.close()

    body = {
        "api_key": secret,
        "model": model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "max_tokens": 100,
    }

    async def warm(connection: Connection) -> None:
        """One authorization and its void on a new connection, not timed (the connection and
        the server's first statements warm up), its answers checked all the same."""
        try:
            hold = expect(
                await connection.request("POST", "/v1/authorizations", body),
                200,
                "warm-up authorization",
                status="active",
            )
            response = await connection.request("DELETE", f"/v1/authorizations/{hold['id']}")
            expect(response, 200, "warm-up void", status="voided")
        except (Unexpected, HttpError, OSError, asyncio.IncompleteReadError) as exc:
            samples.errors.append(f"warm-up: {exc!r}")

    async def authorizer(connection: Connection, count: int) -> None:
        try:
            for _ in range(count):
                response = await _timed(
                    samples, "authorize", connection, "POST", "/v1/authorizations", body
                )
                if response is None:
                    continue
                try:
                    hold = expect(response, 200, "authorization", status="active")
                except Unexpected as exc:
                    samples.errors.append(str(exc))
                    continue
                path = f"/v1/authorizations/{hold['id']}"
                response = await _timed(samples, "void", connection, "DELETE", path)
                if response is not None:
                    try:
                        expect(response, 200, "void", status="voided")
                    except Unexpected as exc:
                        samples.errors.append(str(exc))
        finally:
            await connection.close()

    async def reader() -> None:
        connection = Connection(host, port, {"Authorization": f"Bearer {secret}"})
        starting = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
        path = f"/v1/usage?starting_at={starting}&bucket_width=1h"
        try:
            while not done.is_set():
                response = await _timed(samples, "usage report", connection, "GET", path)
                if response is not None:
                    try:
                        expect(response, 200, "usage report", object="usage_report")
                    except Unexpected as exc:
                        samples.errors.append(str(exc))
                await asyncio.sleep(reader_pause)
        finally:
            await connection.close()

    per, extra = divmod(authorizations, connections)
    pool = [Connection(host, port, gateway) for _ in range(connections)]
    await asyncio.gather(*(warm(connection) for connection in pool))
    samples.origin = time.perf_counter()
    writers = [sender()] + [
        authorizer(connection, per + (i < extra)) for i, connection in enumerate(pool)
    ]
    reading = asyncio.create_task(reader())
    await asyncio.gather(*writers)
    done.set()
    await reading
    return samples


def mixed_load(
    base_url: str,
    key_id: str,
    secret: str,
    model: str,
    *,
    batches: int,
    batch_size: int = 1000,
    connections: int = 60,
    authorizations: int = 600,
    gateway_token: str = GATEWAY_TOKEN,
    reader_pause: float = READER_PAUSE,
) -> Samples:
    """The mixed load against the server at ``base_url`` (an account's key with credit for
    it, a model priced now); every request's latency and what went wrong."""
    host, _, port = base_url.removeprefix("http://").rstrip("/").partition(":")
    return asyncio.run(
        _mixed(
            host,
            int(port),
            key_id,
            secret,
            model,
            batches,
            batch_size,
            connections,
            authorizations,
            {"Authorization": f"Bearer {gateway_token}"},
            reader_pause,
        )
    )


def _stored(path: Path, request_ids: list[str]) -> int:
    """How many of ``request_ids`` are stored usage events (plain SQL on the file)."""
    with sqlite3.connect(path) as connection:
        prefix = request_ids[0].split("-", 1)[0] if request_ids else ""
        row = connection.execute(
            "SELECT count(*) FROM usage_events WHERE request_id LIKE ?", (f"{prefix}-%",)
        ).fetchone()
    return int(row[0])


def run(config: Config | None = None) -> list[Result]:
    config = config or Config()
    rounds: list[Samples] = []
    problems: list[str] = []
    charged: Counter[str] = Counter()  # over every round
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = workdir / "metering.db"
        url = f"sqlite:///{path}"
        cli = workdir / "cli"
        config.code.migrate(url, cli)
        config.code.import_catalog(url, cli, catalog_file(cli, [MODEL], RATES))
        server = config.code.server(url, workdir / "server", config.workers)
        try:
            server.start()
            books = Books()
            with Admin(server.base_url) as admin:
                account = admin.account("embedded")
                key_id, secret = admin.key(account)
                admin.grant(account, GRANT_CENTS)
                books.open(account, GRANT_CENTS, [(key_id, secret)])
            for _ in range(config.rounds):
                samples = mixed_load(
                    server.base_url,
                    key_id,
                    secret,
                    MODEL,
                    batches=config.batches,
                    batch_size=config.batch_size,
                    connections=config.connections,
                    authorizations=config.authorizations,
                )
                stored = _stored(path, samples.request_ids)
                if stored != samples.recorded or stored != config.batches * config.batch_size:
                    samples.errors.append(
                        f"{stored} events stored; {samples.recorded} answered recorded of "
                        f"{config.batches * config.batch_size} sent"
                    )
                problems += config.code.verify(url, cli)
                charged.update(samples.charged)
                problems += books.problems(server.base_url, charged)
                print(f"   {samples.summary()}", flush=True)
                rounds.append(samples)
        finally:
            server.stop()

    for samples in rounds:
        problems += [e for e in samples.errors[:2]]
    errors = [float(len(s.errors)) for s in rounds]
    p99 = median([s.p99() * 1000 for s in rounds])
    slowest = max(s.slowest() * 1000 for s in rounds)
    rate = median([s.recorded / s.ingest_seconds for s in rounds if s.ingest_seconds])
    label = rounds_label(config.rounds)
    shape = (
        f"{config.workers} workers on one SQLite file: {config.batch_size}-event batches, "
        f"{config.authorizations} authorizations over {config.connections} connections, "
        "a reader"
    )
    return [
        Result(
            "embedded.errors",
            f"failed requests, {shape}",
            "0",
            max(errors),
            "",
            max(errors) == 0,
            rounds_label(config.rounds, "max"),
            problems=tuple(problems),
        ),
        Result(
            "embedded.p99",
            "  p99 latency of every request of that load",
            "<= 1000 ms",
            p99,
            "ms",
            p99 <= P99_SECONDS * 1000,
            label,
            higher_is_better=False,
            problems=tuple(problems),
        ),
        Result(
            "embedded.max",
            "  the slowest request of that load",
            "<= 5000 ms",
            slowest,
            "ms",
            slowest <= MAX_SECONDS * 1000,
            rounds_label(config.rounds, "max"),
            higher_is_better=False,
            problems=tuple(problems),
        ),
        Result(
            "embedded.ingest",
            "  usage events/s recorded meanwhile",
            "-",
            rate,
            "/s",
            None,
            label,
            problems=tuple(problems),
        ),
    ]
