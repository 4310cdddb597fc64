"""What one gateway request costs, counted in ways a busy machine does not change: the server's
instructions (valgrind's callgrind), the statements and round trips it sends PostgreSQL
(``pg_stat_statements``), and, with ``--profile``, a cProfile of the server's Python (of its
event loop's thread: a batch is recorded in the thread pool, which the profile does not see).

One server process (uvicorn, one worker) of the code under test, one sequential client on one
keep-alive connection (the benchmarks' own client, ``bench.loadgen``), on a fresh database set
up as the ledger and ingest benchmarks set theirs up (a priced model, accounts with three
grants, access rules). Each operation is sent ``--warmup`` times, then ``--requests`` times
counted: the counters are zeroed before the counted requests and read after them
(``callgrind_control``), so start-up and warm-up (imports, the first statements' preparation,
the remembered resolutions) are left out, and the total divided by the count is one request.
The operations:

- ``ingest``: ``POST /v1/usage/events`` with one new, billable event;
- ``ingest-batch``: the same with a batch of ``--batch`` (1,000) new, billable events across the
  account's keys and both models, as the ingest benchmark sends them (``bench_ingest.Bodies``):
  a tenth of ``--requests`` batches counted, after a third of ``--warmup`` (20 after 10 by
  default: past the fifth, from which psycopg prepares a statement), the figures per event;
- ``authorize``: ``POST /v1/authorizations`` of a known key (its resolution remembered after
  the warm-up), credit plentiful, no spend limit, then ``DELETE /v1/authorizations/{id}`` of
  its hold: the ledger benchmark's loop, counted as one;
- ``authorize-limited``: the same, of a key set up as the ledger benchmark's case (e) sets its
  keys up (``bench_ledger.layered_account``: a project limit, a member limit and the key's own,
  the key having spent once; on code without projects, the key's own limit alone), so every
  spend-limit check the code has runs on each authorization;
- ``ingest-together`` and ``authorize-together``: ``ingest`` or ``authorize`` from four
  keep-alive clients at once (``TOGETHER``), each sending its next when its last is answered:
  what requests that arrive together cost (the figures per request);

and each again against the do-nothing FastAPI app (``bench.baseline_app``) unless
``--no-baseline``: the ratio of instructions is the server's share of the throughput ratio the
benchmarks report.

Statements are counted only when the database has ``pg_stat_statements`` loaded
(``shared_preload_libraries``; ``pg_stat_statements.track = all`` counts those run inside
functions too): "round trips" are the statements the server sent, "in functions" those the
server-side functions ran (``pg_stat_statements_reset()`` clears the whole server's: use a
PostgreSQL of your own). WAL bytes are what the server's WAL grew by over the counted requests.
Backend CPU (``/proc``, 10 ms ticks) is the database's CPU over them, a rough figure under load.
``--database-callgrind USER``: the database runs under callgrind too (docs/performance.md says
how), and its backends' instructions are counted the same way.

The server under callgrind runs about fifty times slower than it would (under ``--profile``'s
cProfile, a few times): the longest a single event waits after a call for its clients' next
(``METERING_USAGE_GATHER_WAIT_MS``, 5 ms by default) is raised to 100 ms for both
(``SLOWED_SERVER``), so that ``ingest-together``'s four clients make the groups a real load
makes (code without that setting ignores it).

Run: ``python -m bench.per_request [--code DIR] [--profile] [--batch N] [ingest ingest-batch
ingest-together authorize authorize-together authorize-limited]`` with
``METERING_TEST_PG_URL`` naming the PostgreSQL server (its maintenance database).
The harness never imports ``metering``, as ``bench.common`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg

from bench import bench_ingest, bench_ledger
from bench.common import (
    GATEWAY_TOKEN,
    HARNESS_ROOT,
    Admin,
    CodeUnderTest,
    bench_database,
    catalog_file,
    format_timestamp,
    free_port,
    libpq_url,
)
from bench.loadgen import Connection, expect

# The server's settings, measured slowed (above): its waits scaled as its speed is.
SLOWED_SERVER = (("METERING_USAGE_GATHER_WAIT_MS", "100"),)

OPERATIONS = (
    "ingest",
    "ingest-batch",
    "ingest-together",
    "authorize",
    "authorize-together",
    "authorize-limited",
)
_HEADERS = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
# What an operation ``…-together`` sends at once: its operation on each of as many connections.
TOGETHER = 4
# ``ingest-batch`` sends this fraction of ``--requests`` and of ``--warmup``: each is a batch.
BATCHES_PER_REQUEST, WARMUP_BATCHES_PER_REQUEST = 1 / 10, 1 / 3
# A thread's count in ``callgrind_control -e`` ("Th 1  1,234,567").
_THREAD_TOTAL = re.compile(r"^\s*Th \d+\s+([\d,]+)", re.MULTILINE)
# The server of the code under test, with a cProfile switched on by SIGUSR1 and written out by
# SIGUSR2 (argv: app, port, profile file); uvicorn handles only SIGINT and SIGTERM itself.
_SERVE = """
import cProfile, signal, sys, uvicorn
profile = cProfile.Profile()
def _start(*_):
    global profile
    profile = cProfile.Profile()
    profile.enable()
signal.signal(signal.SIGUSR1, _start)
def _dump(*_):
    profile.disable()
    profile.dump_stats(sys.argv[3])
signal.signal(signal.SIGUSR2, _dump)
uvicorn.run(sys.argv[1], factory=True, host="127.0.0.1", port=int(sys.argv[2]),
            log_level="warning", access_log=False)
"""


@dataclass
class Figures:
    """One operation's counts, per request."""

    operation: str
    requests: int  # what the figures are divided by (events, for ``ingest-batch``)
    per_request: int = 1  # of those in one request (the statements are listed per request)
    instructions: float | None = None
    round_trips: float | None = None
    in_functions: float | None = None
    backend_cpu_us: float | None = None
    database_instructions: float | None = None
    wal_bytes: float | None = None
    # calls, nested (0 or 1), milliseconds (planning and execution, inclusive), text
    statements: list[tuple[int, int, float, str]] = field(default_factory=list)


class Process:
    """The server under test: uvicorn of ``app`` in ``root``, under callgrind or cProfile."""

    def __init__(self, app: str, root: Path, env: dict[str, str], workdir: Path, how: str) -> None:
        self.port = free_port()
        self.how = how
        self.profile = workdir / f"profile-{self.port}.pstats"
        self.callgrind = workdir / f"callgrind-{self.port}.out"
        command = [sys.executable, "-c", _SERVE, app, str(self.port), str(self.profile)]
        if how == "callgrind":
            command = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={self.callgrind}", *command,
            ]  # fmt: skip
        self.log = workdir / f"server-{self.port}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5).status_code:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("the server did not start")

    def instrument(self) -> None:
        """Callgrind's instrumentation on, from before the warm-up: the code it runs is then
        translated by the time it is counted."""
        if self.how == "callgrind":
            _callgrind_control("--instr=on", self.process.pid)

    def start_counting(self) -> None:
        if self.how == "callgrind":
            _callgrind_control("--zero", self.process.pid)
        else:
            os.kill(self.process.pid, signal.SIGUSR1)
            time.sleep(0.5)

    def stop_counting(self) -> float | str:
        """The instructions since ``start_counting`` (callgrind), or the profile's file."""
        if self.how != "callgrind":
            os.kill(self.process.pid, signal.SIGUSR2)
            time.sleep(1.0)
            return str(self.profile)
        before = set(self.callgrind.parent.glob(self.callgrind.name + "*"))
        _callgrind_control("--dump", self.process.pid)
        [dump] = set(self.callgrind.parent.glob(self.callgrind.name + "*")) - before
        found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
        assert found is not None, dump
        return float(found.group(1))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def _callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


class Statements:
    """``pg_stat_statements`` of the database, when the server has it loaded; and the CPU of
    the database's backends (the harness's own connection left out)."""

    def __init__(self, url: str, database_user: str | None) -> None:
        self.database_user = database_user
        self.connection = psycopg.connect(libpq_url(url), autocommit=True)
        try:
            self.connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.connection.execute("SELECT count(*) FROM pg_stat_statements")
            self.available = True
        except psycopg.Error:
            self.available = False

    def reset(self) -> None:
        if self.available:
            self.connection.execute("SELECT pg_stat_statements_reset()")
        self._cpu = self._backend_cpu()
        self._wal = self._wal_position()
        if self.database_user:
            for pid in self._pids():
                self._control("--instr=on", pid)
                self._control("--zero", pid)

    def read(self, figures: Figures) -> None:
        ticks = self._backend_cpu() - self._cpu
        figures.backend_cpu_us = ticks * 1e6 / os.sysconf("SC_CLK_TCK") / figures.requests
        figures.wal_bytes = (self._wal_position() - self._wal) / figures.requests
        if self.database_user:
            pids = self._pids()
            counted = [self._control("-e", pid) for pid in pids]
            for pid in pids:  # each backend's profile of the operation, for callgrind_annotate
                self._control(f"--dump={figures.operation}", pid)
            found = [int(n.replace(",", "")) for out in counted for n in _THREAD_TOTAL.findall(out)]
            figures.database_instructions = sum(found) / figures.requests
        if not self.available:
            return
        rows = self.connection.execute(
            "SELECT calls, toplevel, total_exec_time + total_plan_time, query"
            " FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            # the harness's own statements
            " AND query NOT LIKE '%pg\\_stat\\_%' AND query NOT LIKE '%pg\\_wal\\_%'"
            " ORDER BY toplevel DESC, calls DESC"
        ).fetchall()
        figures.round_trips = sum(c for c, top, _ms, _q in rows if top) / figures.requests
        figures.in_functions = sum(c for c, top, _ms, _q in rows if not top) / figures.requests
        figures.statements = [
            (c, 0 if top else 1, ms, " ".join(q.split())) for c, top, ms, q in rows
        ]

    def _wal_position(self) -> int:
        """Where the server's WAL is written to: with no other activity on the server, the
        difference is what the requests wrote (the commits' records included)."""
        row = self.connection.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def _pids(self) -> list[int]:
        rows = self.connection.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    def _control(self, option: str, pid: int) -> str:
        """``callgrind_control`` of a backend, as the database's user and with no USER,
        LOGNAME or HOST: PostgreSQL overwrites its environment (the process title), so its
        children name their vgdb pipes without them."""
        assert self.database_user is not None
        done = subprocess.run(
            ["runuser", "-u", self.database_user, "--", "env", "-i", "PATH=/usr/bin:/bin",
             "callgrind_control", option, str(pid)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout

    def _backend_cpu(self) -> int:
        total = 0
        for pid in self._pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # not on this machine, or gone
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total

    def close(self) -> None:
        self.connection.close()


@dataclass
class Client:
    """The requests of each operation, as the benchmarks send them."""

    key_ids: list[str]  # the events' keys, in turn
    secret: str  # the authorizations' key
    limited_secret: str  # the limited authorizations' key
    batch: int = 1000  # events per ``ingest_batch``
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    sent: int = 0
    _bodies: bench_ingest.Bodies | None = None

    async def ingest(self, connection: Connection) -> None:
        self.sent += 1
        key_id = self.key_ids[self.sent % len(self.key_ids)]
        at = format_timestamp(datetime.now(UTC))
        model = bench_ingest.MODELS[self.sent % len(bench_ingest.MODELS)]
        event = bench_ingest._event(key_id, model, f"{self.run_id}-e{self.sent}", at, self.sent)
        response = await connection.request("POST", bench_ingest.PATH, {"events": [event]})
        expect(response, 200, "single event", recorded=1, duplicates=0, quarantined=0)

    async def ingest_batch(self, connection: Connection) -> None:
        """A batch of new, billable events, as the ingest benchmark sends it."""
        if self._bodies is None:
            self._bodies = bench_ingest.Bodies(self.key_ids, self.batch, 1)
        self.sent += 1
        body = self._bodies.body(self.run_id, 0, self.sent)
        bench_ingest.check_counts(
            await connection.request("POST", bench_ingest.PATH, body), self.batch
        )

    async def authorize(self, connection: Connection) -> None:
        """An authorization, then its void: the ledger benchmark's loop."""
        await self._authorize(connection, self.secret)

    async def authorize_limited(self, connection: Connection) -> None:
        """The same of the key with a project, a member and a spend limit of its own."""
        await self._authorize(connection, self.limited_secret)

    async def _authorize(self, connection: Connection, secret: str) -> None:
        self.sent += 1
        request_id = f"{self.run_id}-a{self.sent}"
        body = {
            "api_key": secret,
            "request_id": request_id,
            "model": bench_ledger.MODEL,
            "api": "chat_completions",
            "prompt_tokens": 1000,
            "max_tokens": 256,
        }
        response = await connection.request("POST", "/v1/authorizations", body)
        hold = expect(response, 200, "authorization", status="active", request_id=request_id)
        response = await connection.request("DELETE", f"/v1/authorizations/{hold['id']}")
        expect(response, 200, "void", id=hold["id"], status="voided")


async def _send(port: int, client: Client, name: str, count: int) -> None:
    """``count`` operations from one keep-alive connection; ``ingest-together`` and
    ``authorize-together``: ``count`` of the operation from each of ``TOGETHER`` connections at
    once, each sending its next when its last is answered (a gateway's many requests in
    flight)."""
    if name.endswith("-together"):
        alone = name.removesuffix("-together")
        await asyncio.gather(*(_send(port, client, alone, count) for _ in range(TOGETHER)))
        return
    operation: Callable[[Connection], Any] = getattr(client, name.replace("-", "_"))
    connection = Connection("127.0.0.1", port, _HEADERS)
    for _ in range(count):
        await operation(connection)
    await connection.close()


def _count(name: str, requests: int, warmup: int, batch: int) -> tuple[int, int, int]:
    """How many requests of operation ``name`` are counted, how many are sent before them, and
    what the figures are divided by: the events of ``ingest-batch``, the requests of the
    ``TOGETHER`` clients of an operation ``…-together``."""
    if name == "ingest-batch":
        batches = max(1, round(requests * BATCHES_PER_REQUEST))
        return batches, max(1, round(warmup * WARMUP_BATCHES_PER_REQUEST)), batches * batch
    return requests, warmup, requests * (TOGETHER if name.endswith("-together") else 1)


def _setup(code: CodeUnderTest, url: str, workdir: Path, batch: int = Client.batch) -> Client:
    """Both benchmarks' models, priced; an account with two keys, three grants and access
    rules (the ledger benchmark's); and an account of the ledger benchmark's case (e), its key
    having spent once."""
    code.migrate(url, workdir)
    models = sorted({*bench_ingest.MODELS, bench_ledger.MODEL})
    code.import_catalog(url, workdir, catalog_file(workdir, models, bench_ledger.GLM_RATES))
    server = code.server(url, workdir, 1).start()
    try:
        with Admin(server.base_url) as admin:
            account = admin.account("per-request")
            keys = [admin.key(account) for _ in range(2)]
            admin.three_grants(account, bench_ledger.GRANT_CENTS)
            admin.access_rules(account, models, bench_ledger.CONCURRENCY)
            _, limited, limited_secret, _ = bench_ledger.layered_account(
                admin, "per-request-limited", True
            )
            problem = bench_ledger.spend_once(admin, limited)
            if problem is not None:
                raise RuntimeError(problem)
    finally:
        server.stop()
    return Client([key_id for key_id, _secret in keys], keys[0][1], limited_secret, batch)


def measure(
    code: CodeUnderTest,
    operations: Sequence[str],
    requests: int,
    warmup: int,
    how: str,
    baseline: bool,
    database_user: str | None = None,
    batch: int = 1000,
) -> list[Figures]:
    workdir = Path(tempfile.mkdtemp(prefix="metering-per-request-"))
    results: list[Figures] = []
    try:
        with bench_database() as url:
            client = _setup(code, url, workdir, batch)
            statements = Statements(url, database_user)
            env = code.env(url, workdir, server=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "metrics")
            (workdir / "metrics").mkdir()
            sides = [("", "metering.asgi:create", code.root, statements)]
            if baseline:
                sides.append(("baseline ", "bench.baseline_app:create", HARNESS_ROOT, None))
            for label, app, root, counter in sides:
                server = Process(app, root, env, workdir, how)
                try:
                    server.instrument()
                    for name in operations:
                        counted_requests, warmup_requests, sent = _count(
                            name, requests, warmup, batch
                        )
                        asyncio.run(_send(server.port, client, name, warmup_requests))
                        figures = Figures(label + name, sent, sent // counted_requests)
                        if counter:
                            counter.reset()
                        server.start_counting()
                        asyncio.run(_send(server.port, client, name, counted_requests))
                        counted = server.stop_counting()
                        if counter:
                            counter.read(figures)
                        if isinstance(counted, float):
                            figures.instructions = counted / sent
                        else:
                            _print_profile(figures.operation, counted, sent)
                        results.append(figures)
                finally:
                    server.stop()
            statements.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _print_profile(operation: str, path: str, requests: int) -> None:
    import pstats

    print(f"\n== cProfile of {requests} × {operation}: by own time, then cumulative")
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


def report(results: Sequence[Figures], statements: bool) -> None:
    print("\n| operation | server instructions | database instructions | round trips "
          "| statements in functions | WAL bytes | backend CPU µs |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for f in results:
        instructions = f"{f.instructions / 1000:,.0f}k" if f.instructions else "-"
        trips = f"{f.round_trips:.2f}" if f.round_trips is not None else "-"
        nested = f"{f.in_functions:.2f}" if f.in_functions is not None else "-"
        cpu = f"{f.backend_cpu_us:.0f}" if f.backend_cpu_us is not None else "-"
        database = f"{f.database_instructions / 1000:,.0f}k" if f.database_instructions else "-"
        wal = f"{f.wal_bytes:,.0f}" if f.wal_bytes is not None else "-"
        print(
            f"| {f.operation} | {instructions} | {database} | {trips} | {nested} | {wal} | {cpu} |"
        )
    by_name = {f.operation: f for f in results}
    for f in results:
        base = by_name.get("baseline " + f.operation)
        if base and base.instructions and f.instructions:
            print(f"{f.operation}: the do-nothing app's instructions are "
                  f"{base.instructions / f.instructions:.2f}× ours")  # fmt: skip
    if statements:
        for f in results:
            if f.statements:
                requests = f.requests / f.per_request
                print(
                    f"\n== statements of {f.operation}: calls and µs per request (planning and "
                    "execution, a function's including its statements'); nested marked >"
                )
                for calls, nested, ms, query in f.statements:
                    per = calls / requests
                    mark = ">" if nested else " "
                    print(f"{per:5.2f} {ms * 1000 / requests:7.0f} {mark} {query[:140]}")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.per_request", description=__doc__)
    parser.add_argument("operations", nargs="*", help=f"of {', '.join(OPERATIONS)} (default: all)")
    parser.add_argument("--code", type=Path, help="the checkout to measure (default: this one)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1000, help="events per ingest-batch request")
    parser.add_argument("--profile", action="store_true", help="cProfile instead of callgrind")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--statements", action="store_true", help="list each statement")
    parser.add_argument(
        "--database-callgrind",
        metavar="USER",
        help="the database runs under callgrind (--trace-children=yes) as USER: count its "
        "backends' instructions too",
    )
    args = parser.parse_args(argv)
    code = CodeUnderTest(args.code.resolve() if args.code else HARNESS_ROOT, SLOWED_SERVER)
    unknown = set(args.operations) - set(OPERATIONS)
    if unknown:
        raise SystemExit(f"no such operation: {', '.join(sorted(unknown))}")
    operations = [name for name in OPERATIONS if not args.operations or name in args.operations]
    how = "profile" if args.profile else "callgrind"
    if how == "callgrind" and shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (callgrind_control) is not installed")
    results = measure(
        code,
        operations,
        args.requests,
        args.warmup,
        how,
        not args.no_baseline,
        args.database_callgrind,
        args.batch,
    )
    report(results, args.statements)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
