"""Usage ingest over loopback HTTP against PostgreSQL (issue 4's benchmark).

(a) events/s with batches of 1000 events, 8 concurrent senders, while the peak RSS of the server
processes is read from /proc (VmHWM); (b) single-event requests/s, 8 concurrent senders. Every
event is new (unique request_id) and billable: priced, inserted, debited, aggregated.

Every answer is checked: 200 with ``recorded`` equal to the events sent and no duplicate,
quarantined or rejected one; anything else is an error, and a figure with any error is not met.
After each of our rounds the database must hold exactly the events sent (an SQL count of
``usage_events``; warm-up included), ``metering verify`` must pass, and every account's balance
must be its grants less the price oracle's charges (``tests/oracle.py``) of the events sent with
its keys. The peak RSS is read from every process of the server (its supervisor and each
worker); when the workers cannot all be found the figure says it is unmeasured.

Ceilings, alternated with our rounds (ours, do-nothing FastAPI, bare COPY, ...) for ``ROUNDS``
rounds, each figure the median of its rounds: a plain ``COPY`` of the same rows into a table with
no index or constraint (what PostgreSQL alone can take on this machine), and
``bench.baseline_app`` (a FastAPI endpoint accepting the same body and doing no work) with the
same worker count.

The machine has two cores shared by the load generator, the server and PostgreSQL, so the server
runs ``WORKERS`` uvicorn workers (2: one per core; more only adds context switches).

Run: ``python -m bench ingest`` (or ``make bench``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from bench import common
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
from bench.loadgen import Connection, LoadResult, Response, Unexpected, run_load
from tests import oracle

MODELS = ("Bench-GLM", "Bench-Flash")
GLM_RATES = (22_000_000, 339_000_000, 17_750_000)
GRANT_CENTS = 10**9  # ten million dollars: never runs out
PATH = "/v1/usage/events"


@dataclass
class Config:
    """What a run does; the defaults are ``make bench``'s (a test runs it small)."""

    seconds: float = float(os.environ.get("BENCH_INGEST_SECONDS", "10"))
    warmup: float = 2.0
    rounds: int = common.ROUNDS
    workers: int = int(os.environ.get("BENCH_INGEST_WORKERS", "2"))
    senders: int = 8
    batch: int = 1000
    accounts: int = 20
    keys_per_account: int = 2
    copy_rows: int = 200_000
    code: CodeUnderTest = field(default_factory=CodeUnderTest)
    # Called with the database URL after the setup, and after each of our rounds before it is
    # checked (tests break the service's data with them, to show the figures are then not met).
    after_setup: Callable[[str], None] | None = None
    after_round: Callable[[str], None] | None = None


def _setup(config: Config, url: str, base_url: str, workdir: Path) -> Books:
    """Models priced since 2000 (``metering catalog import``), prepaid accounts with two keys
    and three grants each (one promotional expiring, two paid: every batch's charges are
    allocated over them) (admin API); their books (the key ids in order of creation)."""
    config.code.import_catalog(url, workdir, catalog_file(workdir, MODELS, GLM_RATES))
    books = Books()
    with Admin(base_url) as admin:
        for index in range(config.accounts):
            account = admin.account(f"bench-{index}")
            keys = [admin.key(account) for _ in range(config.keys_per_account)]
            admin.three_grants(account, GRANT_CENTS)
            books.open(account, GRANT_CENTS, keys)
    return books


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
    over every key; single events take the keys in turn. Each template's charges, by key, are
    the price oracle's (every model has the same rates)."""

    def __init__(self, key_ids: list[str], size: int, senders: int) -> None:
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
        variants = 1 if size > 1 else len(key_ids) * len(MODELS)
        self.templates = []
        self.charges: list[Counter[str]] = []
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
            charges: Counter[str] = Counter()
            for event in events:
                charges[str(event["api_key_id"])] += oracle.event_charge(
                    event, GLM_RATES
                ).total_microcents
            self.charges.append(charges)
        self.size = size
        self.senders = senders

    def _template(self, client: int, iteration: int) -> int:
        return (iteration * self.senders + client) % len(self.templates)

    def body(self, run: str, client: int, iteration: int) -> bytes:
        template = self.templates[self._template(client, iteration)]
        return template.replace(b"@@", f"{run}-{client}-{iteration}-".encode())

    def charged(self, client: int, iteration: int) -> Counter[str]:
        """The charges of ``body(…, client, iteration)``'s events, by key id."""
        return self.charges[self._template(client, iteration)]


# The answer's counts, read without decoding its 1000 results: each must appear once.
_COUNT = re.compile(rb'"(recorded|duplicates|quarantined|rejected)":\s*(-?\d+)')


def check_counts(response: Response, sent: int) -> None:
    """``Unexpected`` unless the answer is 200 with every event sent recorded."""
    if response.status != 200:
        raise Unexpected(f"batch: {response.status}, expected 200: {response.body[:160]!r}")
    found = _COUNT.findall(response.body)
    counts = {name.decode(): int(value) for name, value in found}
    expected = {"recorded": sent, "duplicates": 0, "quarantined": 0, "rejected": 0}
    if len(found) != 4 or counts != expected:
        raise Unexpected(f"batch of {sent}: counts {counts}, expected {expected}")


@dataclass
class Sent:
    """Events sent (every request, warm-up included), and their charges by key id."""

    events: int = 0
    charged: Counter[str] = field(default_factory=Counter)


def _drive(config: Config, base_url: str, bodies: Bodies, sent: Sent) -> LoadResult:
    run = os.urandom(3).hex()

    async def operation(connection: Connection, client: int, iteration: int) -> None:
        sent.events += bodies.size
        sent.charged.update(bodies.charged(client, iteration))
        response = await connection.request("POST", PATH, bodies.body(run, client, iteration))
        check_counts(response, bodies.size)

    return run_load(
        base_url,
        config.senders,
        config.seconds,
        operation,
        headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
        warmup=config.warmup,
    )


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from each process's ``stat``: no kernel option
    needed, unlike ``/proc/PID/task/PID/children``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _is_worker(pid: int) -> bool:
    """Whether ``pid`` is one of uvicorn's worker processes (spawned by multiprocessing, beside
    its resource tracker)."""
    try:
        return b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _peak_rss_mb(pid: int, workers: int) -> tuple[float, float, str | None]:
    """(largest VmHWM of one process, sum over the server and its workers) in MB, and why the
    figure is unmeasured when it is (None: every process was read). With one worker uvicorn
    serves from the process itself; with more, from that many children of its supervisor."""
    pids = [pid]
    if workers > 1:
        found = [child for child in _children(pid) if _is_worker(child)]
        pids += found
        if len(found) != workers:
            return 0.0, 0.0, f"{len(found)} of the server's {workers} worker processes found"
    peaks = []
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            return 0.0, 0.0, f"process {p} of the server could not be read"
        peaks += [
            int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")
        ]
    if len(peaks) != len(pids):
        return 0.0, 0.0, "no VmHWM in /proc/PID/status"
    return max(peaks), sum(peaks), None


# The shape of usage_events' stored columns, fixed here (not copied from the code under test's
# schema) so that the ceiling is the same work whichever checkout is measured.
_COPY_TABLE = """
CREATE TABLE bench_copy (
    id bigint, account_id varchar(32), request_id varchar(64), api_key_id varchar(32),
    model_id varchar(100), api varchar(20), outcome varchar(10), occurred_at timestamptz,
    recorded_at timestamptz, prompt_tokens integer, cached_tokens integer,
    output_tokens integer, reasoning_tokens integer, input_microcents bigint,
    cache_read_microcents bigint, output_microcents bigint, total_microcents bigint,
    price_version_id varchar(32)
)"""


def _copy_ceiling(url: str, bodies: Bodies, total_rows: int) -> float:
    """Rows/s of one ``COPY`` of usage_events-shaped rows into a table with no index."""
    events = json.loads(bodies.templates[0])["events"]
    now = datetime.now(UTC)
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS bench_copy")
        connection.execute(_COPY_TABLE)
        started = time.perf_counter()
        with (
            connection.transaction(),
            connection.cursor() as cursor,
            cursor.copy("COPY bench_copy FROM STDIN") as copy,
        ):
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


@dataclass
class Side:
    """The rounds of one load on one side."""

    loads: list[LoadResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def rates(self, per_operation: int = 1) -> list[float]:
        return [load.rate * per_operation for load in self.loads]


def _line(name: str, load: LoadResult, per_op: int) -> str:
    p50 = percentile(load.latencies, 50) * 1000 if load.latencies else 0.0
    p99 = percentile(load.latencies, 99) * 1000 if load.latencies else 0.0
    return (
        f"   {name}: {load.rate * per_op:,.0f}/s ({load.operations} requests measured, "
        f"{load.errors} errors of {load.attempted}, p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
        f"connections per server process {load.spread})"
    )


def _check_round(
    config: Config,
    url: str,
    workdir: Path,
    load: LoadResult,
    sent: Sent,
    books: Books,
    base_url: str,
) -> list[str]:
    """Every event sent is stored (each answered as recorded), no more, the books reconcile,
    and every balance is its grants less the oracle's charges of what was sent."""
    problems = load.problems("ours")
    if config.after_round:
        config.after_round(url)
    stored = common.sql_scalar(url, "SELECT count(*) FROM usage_events")
    if stored != sent.events:
        problems.append(f"{stored:,} events stored of {sent.events:,} sent")
    return problems + config.code.verify(url, workdir) + books.problems(base_url, sent.charged)


def run(config: Config | None = None) -> list[Result]:
    config = config or Config()
    # Other work on the machine takes cores from every side of the measurement: the in-run
    # ratios to the two ceilings are the fair figures when the load is high.
    print(f"   load average at start: {load_average():.1f}", flush=True)
    ours_batches, ours_singles, base_batches, base_singles = Side(), Side(), Side(), Side()
    copy_rates: list[float] = []
    peak_one = peak_all = 0.0
    unmeasured: list[str] = []
    sent = Sent()
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        cli = workdir / "cli"
        config.code.migrate(url, cli)
        server = config.code.server(url, workdir / "server", config.workers)
        baseline = common.baseline_server(workdir / "baseline", config.workers)
        try:
            server.start()
            baseline.start()
            books = _setup(config, url, server.base_url, cli)
            if config.after_setup:
                config.after_setup(url)
            key_ids = list(books.accounts)
            batches = Bodies(key_ids, config.batch, config.senders)
            singles = Bodies(key_ids, 1, config.senders)
            for index in range(config.rounds):
                for bodies, ours, base in (
                    (batches, ours_batches, base_batches),
                    (singles, ours_singles, base_singles),
                ):
                    load = _drive(config, server.base_url, bodies, sent)
                    ours.loads.append(load)
                    ours.problems += _check_round(
                        config, url, cli, load, sent, books, server.base_url
                    )
                    one, every, why = _peak_rss_mb(server.pid, config.workers)
                    peak_one, peak_all = max(peak_one, one), max(peak_all, every)
                    unmeasured += [why] if why else []
                    load = _drive(config, baseline.base_url, bodies, Sent())
                    base.loads.append(load)
                    base.problems += load.problems("do-nothing FastAPI")
                    if bodies is batches:
                        copy_rates.append(_copy_ceiling(url, batches, config.copy_rows))
                print(
                    f"   round {index + 1}: batches {ours_batches.rates(config.batch)[-1]:,.0f} "
                    f"events/s (FastAPI {base_batches.rates(config.batch)[-1]:,.0f}, COPY "
                    f"{copy_rates[-1]:,.0f}); single events {ours_singles.rates()[-1]:,.0f}/s "
                    f"(FastAPI {base_singles.rates()[-1]:,.0f}); load {load_average():.1f}",
                    flush=True,
                )
        finally:
            server.stop()
            baseline.stop()
    print(_line("batches of 1000, last round", ours_batches.loads[-1], config.batch))
    print(_line("single events, last round", ours_singles.loads[-1], 1))
    print(f"   sent {sent.events:,} events; load average at end: {load_average():.1f}")
    for side in (ours_batches, ours_singles, base_batches, base_singles):
        for problem in side.problems:
            print(f"   PROBLEM {problem}")
    for why in unmeasured[:1]:
        print(f"   UNMEASURED peak RSS: {why}")

    label = rounds_label(config.rounds)
    # uvicorn's supervisor and its workers, or its one process when it has one worker.
    processes = config.workers + 1 if config.workers > 1 else 1
    events_rate = median(ours_batches.rates(config.batch))
    base_events = median(base_batches.rates(config.batch))
    copy_rate = median(copy_rates)
    single_rate = median(ours_singles.rates())
    base_single = median(base_singles.rates())
    batch_problems = tuple(ours_batches.problems + base_batches.problems)
    return [
        Result(
            "ingest.batches",
            f"ingest events/s, batches of {config.batch}, {config.senders} senders, "
            f"{config.workers} workers, accounts with three grants each",
            ">= 20000/s",
            events_rate,
            "/s",
            events_rate >= 20_000,
            label,
            f"{events_rate / base_events:.0%} of do-nothing FastAPI ({base_events:,.0f}/s); "
            f"{events_rate / copy_rate:.0%} of bare COPY ({copy_rate:,.0f}/s)",
            base_events,
            problems=batch_problems,
        ),
        Result(
            "ingest.singles",
            f"ingest single-event requests/s, {config.senders} senders, {config.workers} workers",
            ">= 1000/s",
            single_rate,
            "/s",
            single_rate >= 1000,
            label,
            f"{single_rate / base_single:.0%} of do-nothing FastAPI ({base_single:,.0f}/s); "
            f"{single_rate / copy_rate:.1%} of bare COPY rows/s",
            base_single,
            problems=tuple(ours_singles.problems + base_singles.problems),
        ),
        Result(
            "ingest.rss",
            f"ingest peak RSS, largest server process (all {processes}: {peak_all:.0f} MB)",
            "<= 300 MB",
            peak_one,
            "MB",
            None if unmeasured else peak_one <= 300,
            f"UNMEASURED: {unmeasured[0]}"
            if unmeasured
            else f"peak over {config.rounds} rounds"
            if config.rounds > 1
            else "peak of 1 round",
            higher_is_better=False,
            problems=batch_problems,
        ),
    ]
