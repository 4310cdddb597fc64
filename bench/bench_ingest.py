"""Usage ingest over loopback HTTP against PostgreSQL (issue 4's benchmark).

(a) events/s with batches of 1000 events, 8 concurrent senders, while the peak RSS of the server
processes is read from /proc (VmHWM); (b) single-event requests/s, 8 concurrent senders. Every
event is new (unique request_id) and billable: priced, inserted, debited, aggregated.

Ceilings measured in the same run: a plain ``COPY`` of the same rows into a bare table (no
index, no constraint: what PostgreSQL alone can take on this machine), and ``bench.baseline_app``
(a FastAPI endpoint accepting the same body and doing no work) with the same worker count.

The machine has two cores shared by the load generator, the server and PostgreSQL, so the server
runs ``WORKERS`` uvicorn workers (2: one per core; more only adds context switches).

Run: ``python -m bench ingest`` (or ``make bench``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from bench.common import Result, bench_database, percentile
from bench.loadgen import Connection, LoadResult, run_load
from metering.accounts import service as accounts
from metering.catalog.importer import import_catalog
from metering.catalog.schemas import CatalogFile
from metering.db import Database
from metering.kit.timeutil import format_timestamp
from metering.models import Account, UsageEvent
from metering.usage.verify import verify
from tests.conftest import GATEWAY_TOKEN
from tests.servers import ServerProcess, free_port

WORKERS = int(os.environ.get("BENCH_INGEST_WORKERS", "2"))
DURATION = float(os.environ.get("BENCH_INGEST_SECONDS", "10"))
SENDERS = 8
BATCH = 1000
ACCOUNTS = 20
KEYS_PER_ACCOUNT = 2
MODELS = ("Bench-GLM", "Bench-Flash")
GLM_RATES = (22_000_000, 339_000_000, 17_750_000)
HEADERS = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
PATH = "/v1/usage/events"


@dataclass
class Fixture:
    url: str
    key_ids: list[str]


def _setup(url: str) -> Fixture:
    """Models priced since a day ago, prepaid accounts with two keys each (service layer)."""
    database = Database.from_url(url, pool_size=1)
    now = datetime.now(UTC)
    since = format_timestamp(now - timedelta(days=1))
    catalog = CatalogFile.model_validate(
        {
            "models": [
                {
                    "id": model,
                    "display_name": model,
                    "context_length": 131072,
                    "prices": [
                        {
                            "effective_at": since,
                            "input_microcents_per_million": GLM_RATES[0],
                            "output_microcents_per_million": GLM_RATES[1],
                            "cache_read_microcents_per_million": GLM_RATES[2],
                        }
                    ],
                }
                for model in MODELS
            ]
        }
    )
    key_ids: list[str] = []
    try:
        with database.unit_of_work() as session:
            import_catalog(session, catalog, now)
            for index in range(ACCOUNTS):
                account = accounts.create_account(session, f"bench-{index}", "prepaid", now)
                for _ in range(KEYS_PER_ACCOUNT):
                    key, _secret = accounts.create_api_key(session, account, "bench", None, now)
                    key_ids.append(key.id)
    finally:
        database.dispose()
    return Fixture(url, key_ids)


def _event(key_id: str, model: str, request_id: str, at: str, n: int) -> dict[str, object]:
    return {
        "request_id": request_id,
        "api_key_id": key_id,
        "model": model,
        "api": "chat_completions",
        "usage": {
            "prompt_tokens": 1000 + n % 3000,
            "completion_tokens": 20 + n % 500,
            "total_tokens": 1020 + n % 3000 + n % 500,
            "prompt_tokens_details": {"cached_tokens": n % 1000},
            "completion_tokens_details": {"reasoning_tokens": n % 20},
        },
        "occurred_at": at,
        "outcome": "completed",
    }


class Bodies:
    """Request bodies with fresh request ids, built from serialised templates so the load
    generator spends its CPU on sending, not on JSON (it shares the two cores). A batch spreads
    over every key; single events take the keys in turn."""

    def __init__(self, key_ids: list[str], size: int) -> None:
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
        variants = 1 if size > 1 else len(key_ids) * len(MODELS)
        self.templates = []
        for variant in range(variants):
            # As a gateway sends them: each event at its own millisecond.
            events = [
                _event(
                    key_ids[(variant + i) % len(key_ids)],
                    MODELS[(variant // len(key_ids) + i) % len(MODELS)],
                    f"@@{i:04d}",
                    format_timestamp(start + timedelta(milliseconds=variant + i)),
                    variant + i,
                )
                for i in range(size)
            ]
            self.templates.append(json.dumps({"events": events}, separators=(",", ":")).encode())
        self.size = size
        self.run = os.urandom(3).hex()

    def body(self, client: int, iteration: int) -> bytes:
        template = self.templates[(iteration * SENDERS + client) % len(self.templates)]
        return template.replace(b"@@", f"{self.run}-{client}-{iteration}-".encode())


def _drive(base_url: str, bodies: Bodies) -> LoadResult:
    async def operation(connection: Connection, client: int, iteration: int) -> int:
        response = await connection.request("POST", PATH, bodies.body(client, iteration))
        if response.status != 200:
            return response.status
        if bodies.size == 1 and b'"recorded":1' not in response.body:
            return 599  # anything but a recorded event counts as an error
        return response.status

    return run_load(base_url, SENDERS, DURATION, operation, headers=HEADERS, warmup=2.0)


def _peak_rss_mb(pid: int) -> tuple[float, float]:
    """(largest VmHWM of one process, sum over the server and its workers) in MB."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    peaks = []
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        except FileNotFoundError:
            continue
    return max(peaks), sum(peaks)


def _copy_ceiling(url: str, bodies: Bodies, total_rows: int) -> float:
    """Rows/s of one ``COPY`` of usage_events-shaped rows into a table with no index."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    events = json.loads(bodies.templates[0])["events"]
    now = datetime.now(UTC)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(
            "CREATE UNLOGGED TABLE IF NOT EXISTS bench_copy (LIKE usage_events INCLUDING DEFAULTS)"
        )
        connection.execute("ALTER TABLE bench_copy SET LOGGED")  # as durable as our tables
        connection.execute("TRUNCATE bench_copy")
        started = time.perf_counter()
        with connection.transaction(), connection.cursor() as cursor:
            columns = (
                "id, account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, "
                "recorded_at, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, "
                "input_microcents, cache_read_microcents, output_microcents, total_microcents, "
                "price_version_id"
            )
            with cursor.copy(f"COPY bench_copy ({columns}) FROM STDIN") as copy:
                for n in range(total_rows):
                    e = events[n % len(events)]
                    usage = e["usage"]
                    copy.write_row(
                        (
                            n,
                            "acct_bench",
                            f"copy-{n}",
                            e["api_key_id"],
                            e["model"],
                            e["api"],
                            e["outcome"],
                            now,
                            now,
                            usage["prompt_tokens"],
                            usage["prompt_tokens_details"]["cached_tokens"],
                            usage["completion_tokens"],
                            usage["completion_tokens_details"]["reasoning_tokens"],
                            1,
                            2,
                            3,
                            6,
                            "price_bench",
                        )
                    )
        elapsed = time.perf_counter() - started
        connection.execute("DROP TABLE bench_copy")
    return total_rows / elapsed


def _baseline(workdir: Path, bodies: Bodies) -> LoadResult:
    port = free_port()
    log = open(workdir / "baseline.log", "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "bench.baseline_app:create",
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(WORKERS),
         "--no-access-log", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                import httpx2 as httpx

                if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                    break
            except Exception:
                time.sleep(0.1)
        return _drive(base_url, bodies)
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def _line(name: str, load: LoadResult, per_op: int) -> str:
    p50 = percentile(load.latencies, 50) * 1000
    p99 = percentile(load.latencies, 99) * 1000
    return (
        f"   {name}: {load.rate * per_op:,.0f}/s ({load.operations} requests, "
        f"{load.errors} errors, p50 {p50:.0f} ms, p99 {p99:.0f} ms, statuses {load.statuses})"
    )


def run() -> list[Result]:
    results: list[Result] = []
    # Other work on the machine takes cores from every side of the measurement: the in-run
    # ratios to the two ceilings are the fair figures when the load is high.
    print(f"   load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        fixture = _setup(url)
        batches, singles = Bodies(fixture.key_ids, BATCH), Bodies(fixture.key_ids, 1)
        server = ServerProcess(url, workdir / "server", workers=WORKERS).start()
        try:
            batch_load = _drive(server.base_url, batches)
            peak_one, peak_all = _peak_rss_mb(server.process.pid)  # type: ignore[union-attr]
            single_load = _drive(server.base_url, singles)
        finally:
            server.stop()
        print(_line("batches of 1000", batch_load, BATCH))
        print(_line("single events", single_load, 1))

        database = Database.from_url(url, pool_size=1)
        try:
            with database.unit_of_work() as session:
                report = verify(session)
                stored = session.execute(select(func.count()).select_from(UsageEvent)).scalar_one()
                balance = session.execute(select(func.sum(Account.balance_microcents))).scalar_one()
        finally:
            database.dispose()
        print(f"   stored {stored:,} events; balances {balance:,} µ¢; verify ok: {report.ok}")
        if not report.ok:
            raise SystemExit(f"verify failed after the benchmark: {report.mismatches[:5]}")

        copy_rate = _copy_ceiling(url, batches, 200_000)
        baseline_batches = _baseline(workdir, batches)
        baseline_singles = _baseline(workdir, singles)
        print(f"   COPY ceiling: {copy_rate:,.0f} rows/s")
        print(f"   load average at end: {os.getloadavg()[0]:.1f}")
        print(_line("baseline app, batches of 1000", baseline_batches, BATCH))
        print(_line("baseline app, single events", baseline_singles, 1))

    events_rate = batch_load.rate * BATCH
    base_events = baseline_batches.rate * BATCH
    results.append(
        Result(
            f"ingest events/s, batches of {BATCH}, {SENDERS} senders, {WORKERS} workers",
            ">= 20000/s",
            events_rate,
            "/s",
            events_rate >= 20_000 and batch_load.errors == 0,
            f"{events_rate / copy_rate:.0%} of bare COPY ({copy_rate:,.0f}/s); "
            f"{events_rate / base_events:.0%} of do-nothing FastAPI ({base_events:,.0f}/s)",
        )
    )
    single_rate = single_load.rate
    results.append(
        Result(
            f"ingest single-event requests/s, {SENDERS} senders, {WORKERS} workers",
            ">= 1000/s",
            single_rate,
            "/s",
            single_rate >= 1000 and single_load.errors == 0,
            f"{single_rate / copy_rate:.1%} of bare COPY rows/s; "
            f"{single_rate / baseline_singles.rate:.0%} of do-nothing FastAPI "
            f"({baseline_singles.rate:,.0f}/s)",
        )
    )
    results.append(
        Result(
            f"ingest peak RSS, largest server process (all {WORKERS + 1}: {peak_all:.0f} MB)",
            "<= 300 MB",
            peak_one,
            "MB",
            peak_one <= 300,
        )
    )
    return results
