"""The ledger and ingest loads on a local Citus cluster beside one PostgreSQL server (issue 18's
benchmark; docs/citus.md).

Two databases made in the same run — a fresh one on the single PostgreSQL server
(``METERING_TEST_PG_URL``) and a fresh one on the local Citus cluster (a coordinator and two
workers; ``scripts/citus.sh start`` when its coordinator does not answer) — each migrated by
``metering migrate`` (which distributes the schema on the cluster) and set up the same way
through the admin API: ``accounts`` prepaid accounts with a key and three grants each (the first
``ingest_accounts`` with a second key), a priced model list and a concurrency limit each. Each
has its own server (``workers`` uvicorn workers). Each side first runs each load for
``warming`` seconds, measured apart and left out of the figures (a service that has run a while:
its pools full, each database backend past its first calls of each program it runs, which on
the cluster are each shard's own). Then, alternated for ``rounds`` rounds (one server, the
cluster, one server, ...), the same three loads on each:

* authorizations: ``clients`` clients over every account, each hold voided before the next
  request (bench_ledger's (a));
* ingest batches of ``batch`` events over the first accounts' keys, ``senders`` senders
  (bench_ingest's (a));
* single-event requests, ``senders`` senders (bench_ingest's (b)).

Every answer is checked as in those benchmarks, and after each round the holds and events stored
equal what was answered, ``metering verify`` is clean, and every account's balance is its grants
less the price oracle's charges of the events sent with its keys; any problem makes the figures
not met.

On one machine the cluster cannot be faster than one server: its three nodes share the same
cores, and a statement crosses one more process. What it shows is the cost of an operation on a
worker, from which each added worker's throughput is projected:

* **CPU per operation** of each tier, from ``/proc`` (utime + stime of each process) over each
  load: the API server's processes, and on each node the backends of the bench's database
  (``pg_stat_activity``); on the cluster's nodes also the backends that ended during a load
  (their postmaster's reaped children), and apart, in brackets, what backends started or ended
  during the load spent (a connection's set-up). Each load runs right after a brief unmeasured
  one of its kind, so that connections the load before cost are not charged to it. On the
  shared single server a backend that ended during a load is reported as lost.
* **Round trips per operation**: after the rounds, a server of its own sends a few operations of
  each kind with ``citus.log_remote_commands`` on for the cluster's database; the commands a
  node sent another are counted from the nodes' logs (each one network round trip), and the
  statements a worker ran itself by Citus' local execution (``citus.log_local_commands``).
* **The projection** (labelled as one): each operation runs on the one worker holding its
  account, so an added worker core takes ``1 / (worker CPU per operation)`` operations a second,
  under the assumptions printed with it (docs/citus.md); and the same without
  the CPU of backends started or ended during the load (an upper bound: their work after their
  start is left out with their start).

Run: ``make bench BENCH=citus`` (``python -m bench citus``). Settings: ``BENCH_ROUNDS`` (3),
``BENCH_CITUS_SECONDS`` (20 per load, after 1 s of warm-up), ``BENCH_CITUS_WARMING`` (30: each
load's seconds on each side before the rounds; docs/citus.md), ``BENCH_CITUS_NODES`` (``every``: the
cluster's API server connects to every node; ``coordinator``: to the coordinator only),
``BENCH_CITUS_WORKERS`` (2),
``METERING_TEST_PG_URL`` (the single server), ``CITUS_PORT`` (the coordinator's port, 9700, the
workers on the next two) and ``CITUS_DIR`` for ``scripts/citus.sh``, or ``BENCH_CITUS_URL`` (the
coordinator's maintenance URL; the nodes must run on this machine for their CPU to be read).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg
from sqlalchemy.engine import URL, make_url

from bench import common
from bench.__main__ import table
from bench.bench_ingest import GLM_RATES, MODELS, Bodies, Sent, check_counts
from bench.bench_ingest import Config as IngestConfig
from bench.bench_ingest import _drive as drive_ingest
from bench.bench_ledger import Load
from bench.bench_webhooks import ALLOW_PRIVATE, Receiver, check_messages, make_endpoint
from bench.common import (
    GATEWAY_TOKEN,
    HARNESS_ROOT,
    Admin,
    Books,
    CodeUnderTest,
    Result,
    Server,
    bench_database,
    catalog_file,
    libpq_url,
    median,
    rounds_label,
)
from bench.loadgen import LoadResult, Response, run_load

GRANT_CENTS = 10**9
CONCURRENCY = 1000  # every account's limit on requests in flight: far above the clients'
TICKS = os.sysconf("SC_CLK_TCK")
CITUS_PORT = int(os.environ.get("CITUS_PORT", "9700"))
CITUS_URL = os.environ.get(
    "BENCH_CITUS_URL", f"postgresql+psycopg://postgres@127.0.0.1:{CITUS_PORT}/postgres"
)

SINGLE, CLUSTER = "one PostgreSQL server", "Citus, coordinator + 2 workers"
AUTH, BATCH, EVENT = "authorization", "event in a batch", "single event"
PLURAL = {AUTH: "authorizations", BATCH: "events in batches", EVENT: "single events"}


@dataclass
class Config:
    """What a run does; the defaults are ``make bench BENCH=citus``'s (a test runs it small)."""

    seconds: float = float(os.environ.get("BENCH_CITUS_SECONDS", "20"))
    warmup: float = 1.0
    # Before the first round, each side runs each load this long, measured apart (the
    # "warming" figures) and left out of the rounds': a service that has run a while.
    warming: float = float(os.environ.get("BENCH_CITUS_WARMING", "30"))
    rounds: int = common.ROUNDS
    workers: int = int(os.environ.get("BENCH_CITUS_WORKERS", "2"))
    accounts: int = 100
    ingest_accounts: int = 20  # with two keys each, as bench_ingest's
    clients: int = 16
    senders: int = 8
    batch: int = 1000
    shard_count: int = 32  # Citus' default
    counted: int = 20  # operations of each kind sent with the remote commands logged
    ticks: int = 20  # scheduler ticks measured, after one unmeasured
    messages: int = 1000  # webhook messages delivered by the scheduler, measured
    message_accounts: int = 10  # over this many accounts, an endpoint each
    coordinator_url: str = CITUS_URL
    # The cluster's API server connects to every node (its METERING_DATABASE_URL names them
    # all, the coordinator first: docs/citus.md#connections-to-every-node), or to the
    # coordinator only (BENCH_CITUS_NODES=coordinator).
    every_node: bool = os.environ.get("BENCH_CITUS_NODES", "every") != "coordinator"
    # bench_refusals' figures of the cluster too (a refused batch, a reprocess of 2,000
    # entries), so that ``make bench BENCH=citus`` prints them.
    refusals: bool = True
    code: CodeUnderTest = field(default_factory=CodeUnderTest)


# --- The cluster and its database ------------------------------------------------------------


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3) as connection:
            connection.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def ensure_cluster(coordinator_url: str) -> None:
    """The local cluster up: ``scripts/citus.sh start`` (the harness's) when its coordinator does
    not answer (it builds Citus first when the system PostgreSQL 15 lacks it)."""
    if _answers(coordinator_url):
        return
    port = make_url(coordinator_url).port or 5432
    print(f"   starting the local Citus cluster (scripts/citus.sh start, port {port}) ...")
    subprocess.run(
        ["bash", "scripts/citus.sh", "start"],
        cwd=HARNESS_ROOT,
        env={**os.environ, "CITUS_PORT": str(port)},
        check=True,
    )


def _node_urls(coordinator_url: str) -> list[str]:
    """Maintenance URLs of the cluster's nodes, the coordinator first, then its workers."""
    with psycopg.connect(libpq_url(coordinator_url)) as connection:
        ports = [
            row[0]
            for row in connection.execute(
                "SELECT nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive ORDER BY 1"
            )
        ]
    if not ports:
        raise RuntimeError(f"the Citus coordinator at {coordinator_url} has no active worker")
    base = make_url(coordinator_url)
    return [
        coordinator_url,
        *(base.set(port=port).render_as_string(hide_password=False) for port in ports),
    ]


def _in(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def every_node_url(database_url: str, node_urls: Sequence[str]) -> str:
    """``database_url`` (on the coordinator) naming every node of the cluster as a ``host``,
    the coordinator first, with ``load_balance_hosts=random``: what an operator configures for
    no node to be one every request passes (docs/citus.md#connections-to-every-node)."""
    hosts = [f"{make_url(node).host}:{make_url(node).port}" for node in node_urls]
    parsed = make_url(database_url)
    url = URL.create(parsed.drivername, parsed.username, parsed.password, database=parsed.database)
    return url.update_query_pairs(
        [*(("host", host) for host in hosts), ("load_balance_hosts", "random")]
    ).render_as_string(hide_password=False)


@contextmanager
def citus_database(coordinator_url: str, shard_count: int) -> Iterator[str]:
    """A fresh database on every node of the cluster, as docs/citus.md's move onto a cluster
    makes one: the extension in it on each node, the coordinator and the workers registered in
    the coordinator's (Citus keeps its nodes per database). Dropped afterwards; its URL."""
    name = f"metering_bench_{secrets.token_hex(6)}"
    nodes = _node_urls(coordinator_url)
    made = []
    try:
        for node in nodes:
            with psycopg.connect(libpq_url(node), autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            made.append(node)
        for node in reversed(nodes):  # the workers' extension first, as citus_add_node expects
            with psycopg.connect(libpq_url(_in(node, name)), autocommit=True) as connection:
                connection.execute("CREATE EXTENSION citus")
        coordinator = make_url(nodes[0])
        with psycopg.connect(libpq_url(_in(nodes[0], name)), autocommit=True) as connection:
            connection.execute(f'ALTER DATABASE "{name}" SET citus.shard_count = {shard_count:d}')
            connection.execute(
                "SELECT citus_set_coordinator_host(%s, %s)", (coordinator.host, coordinator.port)
            )
            for worker in nodes[1:]:
                url = make_url(worker)
                connection.execute("SELECT citus_add_node(%s, %s)", (url.host, url.port))
        yield _in(nodes[0], name)
    finally:
        for node in made:
            with psycopg.connect(libpq_url(node), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- CPU, from /proc -------------------------------------------------------------------------


def cpu_seconds(pid: int, reaped: bool = False, one_thread: bool = False) -> float | None:
    """utime + stime of one process in seconds, every thread's, counted in clock ticks
    (``reaped``: cutime + cstime, of its children that ended and were waited for); for a
    process of ``one_thread`` (a PostgreSQL backend), the scheduler's own count of its thread
    (``schedstat``, in nanoseconds: a backend's few milliseconds are not rounded to ticks).
    None when it is gone."""
    try:
        if one_thread and not reaped:
            return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name: state is fields[0]
    first = 13 if reaped else 11
    return (int(fields[first]) + int(fields[first + 1])) / TICKS


def postmaster(node_url: str) -> int:
    """The pid of a (local) node's postmaster: the parent of a backend."""
    with psycopg.connect(libpq_url(node_url)) as connection:
        row = connection.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # Read while the backend lives (it ends with the connection).
        status = Path(f"/proc/{row[0]}/status").read_text()
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise RuntimeError(f"no parent process for the backend {row[0]} of {node_url}")


def _server_pids(server: Server) -> list[int]:
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children")
    found = [server.pid]
    if children.exists():
        found += [int(p) for p in children.read_text().split()]
    return found


def _backends(node_url: str, database: str) -> list[int]:
    """The pids of a node's backends in ``database`` (asked from its maintenance database, so
    the asking is not counted)."""
    with psycopg.connect(libpq_url(node_url), autocommit=True) as connection:
        return [
            row[0]
            for row in connection.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)
            )
        ]


def _sessions(node_url: str, database: str) -> int:
    """Sessions ever opened in ``database`` on a node (``pg_stat_database``): a connection made
    during a load costs the node a backend's start."""
    with psycopg.connect(libpq_url(node_url), autocommit=True) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        row = connection.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Tier:
    """One tier's processes whose CPU is read: the API server's, or a node's backends."""

    name: str
    pids: Any  # () -> list[int]
    # A node of the bench's own (a cluster node): its postmaster, whose children that ended
    # during a load (a backend whose connection was closed) are counted through it.
    postmaster: int | None = None
    sessions: Any = None  # () -> sessions ever opened in the bench's database on the node
    backends: bool = False  # PostgreSQL backends: one thread each


@dataclass
class Snapshot:
    cpu: dict[str, dict[int, float]]  # tier -> pid -> CPU seconds
    sessions: dict[str, int]


def snapshot(tiers: Sequence[Tier]) -> Snapshot:
    taken: dict[str, dict[int, float]] = {}
    sessions = {tier.name: tier.sessions() for tier in tiers if tier.sessions is not None}
    for tier in tiers:
        values = {}
        for pid in tier.pids():
            cpu = cpu_seconds(pid, one_thread=tier.backends)
            if cpu is not None:
                values[pid] = cpu
        if tier.postmaster is not None:
            values[-tier.postmaster] = cpu_seconds(tier.postmaster, reaped=True) or 0.0
        taken[tier.name] = values
    return Snapshot(taken, sessions)


@dataclass
class Spent:
    """CPU seconds each tier spent between two snapshots, and the processes that ended in
    between (whose CPU in the window is not counted)."""

    cpu: dict[str, float]
    lost: dict[str, int]
    sessions: dict[str, int]  # tier -> sessions opened (connections made to the node)
    # Of ``cpu``, what processes started or ended during the window spent (backends of
    # connections made or closed meanwhile: a backend's start is most of it).
    churn: dict[str, float]


def spent(before: Snapshot, after: Snapshot) -> Spent:
    cpu, lost, churn = {}, {}, {}
    for tier, now in after.cpu.items():
        then = before.cpu.get(tier, {})
        cpu[tier] = sum(value - then.get(pid, 0.0) for pid, value in now.items())
        churn[tier] = sum(
            value - then.get(pid, 0.0) for pid, value in now.items() if pid < 0 or pid not in then
        )
        # Ended processes are counted through their postmaster's reaped children, when it is
        # read; otherwise their CPU in the window is lost.
        lost[tier] = 0 if any(pid < 0 for pid in now) else len(set(then) - set(now))
    sessions = {tier: now - before.sessions.get(tier, 0) for tier, now in after.sessions.items()}
    return Spent(cpu, lost, sessions, churn)


# --- One side: a database, its server, its fixture -------------------------------------------


@dataclass
class Fixture:
    secrets: list[str]  # one key per account (the authorizations)
    key_ids: list[str]  # the first accounts' two keys each (ingest)
    books: Books  # every account
    accounts: list[str]  # every account's id, in the order made


@dataclass
class Measured:
    """One load's rounds on one side: rates, operations, CPU per tier."""

    rates: list[float] = field(default_factory=list)  # operations/s (events/s for batches)
    operations: int = 0  # every operation sent (warm-up included), in events for batches
    cpu: dict[str, float] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)  # tier -> processes ended in a load
    sessions: dict[str, int] = field(default_factory=dict)  # tier -> connections made to it
    churn: dict[str, float] = field(default_factory=dict)  # tier -> CPU of started/ended ones
    problems: list[str] = field(default_factory=list)

    def add(self, rate: float, operations: int, used: Spent) -> None:
        self.rates.append(rate)
        self.operations += operations
        for tier, seconds in used.cpu.items():
            self.cpu[tier] = self.cpu.get(tier, 0.0) + seconds
        for tier, count in used.lost.items():
            if count:
                self.lost[tier] = self.lost.get(tier, 0) + count
        for tier, count in used.sessions.items():
            self.sessions[tier] = self.sessions.get(tier, 0) + count
        for tier, seconds in used.churn.items():
            self.churn[tier] = self.churn.get(tier, 0.0) + seconds

    def churn_ms_per_operation(self, tiers: Sequence[str]) -> float:
        total = sum(self.churn.get(tier, 0.0) for tier in tiers)
        return total * 1000 / self.operations if self.operations else 0.0

    def sessions_per_1000(self, tiers: Sequence[str]) -> float:
        total = sum(self.sessions.get(tier, 0) for tier in tiers)
        return total * 1000 / self.operations if self.operations else 0.0

    def ms_per_operation(self, tiers: Sequence[str]) -> float:
        total = sum(self.cpu.get(tier, 0.0) for tier in tiers)
        return total * 1000 / self.operations if self.operations else 0.0


@dataclass
class Side:
    name: str
    url: str
    server: Server
    fixture: Fixture
    # (tier name, maintenance URL, postmaster of a node of the bench's own) of each node
    nodes: list[tuple[str, str, int | None]]
    server_url: str  # the URL its API server connects by
    sent: Sent = field(default_factory=Sent)
    loads: dict[str, Measured] = field(
        default_factory=lambda: {AUTH: Measured(), BATCH: Measured(), EVENT: Measured()}
    )
    # The loads run before the rounds (Config.warming), measured apart.
    warming: dict[str, Measured] = field(
        default_factory=lambda: {AUTH: Measured(), BATCH: Measured(), EVENT: Measured()}
    )
    verify_problems: list[str] = field(default_factory=list)

    def tiers(self) -> list[Tier]:
        database = make_url(self.url).database or ""
        found = [Tier("api", lambda: _server_pids(self.server))]
        for name, node, parent in self.nodes:
            found.append(
                Tier(
                    name,
                    lambda node=node: _backends(node, database),
                    parent,
                    lambda node=node: _sessions(node, database),
                    backends=True,
                )
            )
        return found


def _setup(config: Config, url: str, base_url: str, workdir: Path) -> Fixture:
    """Both models priced (``metering catalog import``); the accounts with their keys, grants
    and limits (admin API), as an operator sets them up."""
    config.code.import_catalog(url, workdir, catalog_file(workdir, MODELS, GLM_RATES))
    keys, key_ids, accounts = [], [], []
    books = Books()
    with Admin(base_url) as admin:
        for index in range(config.accounts):
            account = admin.account(f"bench-{index}")
            accounts.append(account)
            made = [admin.key(account)]
            keys.append(made[0][1])
            if index < config.ingest_accounts:
                made.append(admin.key(account))
                key_ids += [key_id for key_id, _secret in made]
            admin.three_grants(account, GRANT_CENTS)
            books.open(account, GRANT_CENTS, made)
            admin.access_rules(account, list(MODELS), CONCURRENCY)
    return Fixture(keys, key_ids, books, accounts)


def _measure(
    side: Side, kind: str, drive: Any, per_operation: int = 1, warming: bool = False
) -> LoadResult:
    tiers = side.tiers()
    before = snapshot(tiers)
    load: LoadResult = drive()
    used = spent(before, snapshot(tiers))
    measured = (side.warming if warming else side.loads)[kind]
    measured.add(load.rate * per_operation, load.attempted * per_operation, used)
    side.loads[kind].problems += load.problems(side.name)
    return load


def _voids(side: Side) -> Load:
    """Authorizations over every account's key, each hold voided before the next."""
    secrets_ = side.fixture.secrets
    return Load(lambda c, i: secrets_[(c * 7 + i) % len(secrets_)])


def _drive(
    config: Config,
    side: Side,
    kind: str,
    bodies: tuple[Bodies, Bodies],
    seconds: float,
    warmup: float,
    voids: Load | None = None,
) -> LoadResult:
    """One load of ``kind`` for ``seconds`` after ``warmup``: authorizations (``voids``, or
    fresh ones), or the batches or single events of ``bodies``."""
    if kind == AUTH:
        headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
        voids = voids or _voids(side)
        return run_load(side.server.base_url, config.clients, seconds, voids, headers, warmup)
    ingest = IngestConfig(seconds=seconds, warmup=warmup, senders=config.senders)
    these = bodies[0] if kind == BATCH else bodies[1]
    return drive_ingest(ingest, side.server.base_url, these, side.sent)


def _size(kind: str, bodies: tuple[Bodies, Bodies]) -> int:
    """Operations per request of ``kind``: an event in a batch is one."""
    return {AUTH: 1, BATCH: bodies[0].size, EVENT: bodies[1].size}[kind]


def _warm(config: Config, side: Side, bodies: tuple[Bodies, Bodies]) -> None:
    """Each load for ``config.warming`` seconds, before the rounds, measured apart: what a
    service that has run a while no longer pays. Its pools have opened their connections; each
    node's backend has compiled and planned, once in its life, the programs of every shard it
    has met (on the cluster each worker holds many shards, and each backend meets them all:
    docs/citus.md). Not measured here, they would be charged to the first round's loads, as
    many times over as that round is short."""
    if config.warming <= 0:
        return
    for kind in (AUTH, BATCH, EVENT):
        _vacuum(side)
        _measure(
            side,
            kind,
            lambda kind=kind: _drive(config, side, kind, bodies, config.warming, 0),
            _size(kind, bodies),
            warming=True,
        )


def _settle(config: Config, side: Side, kind: str, bodies: tuple[Bodies, Bodies]) -> None:
    """The load of ``kind``, briefly and not measured, right before it is measured: the
    server's pools have their connections, and on the cluster the coordinator's sessions theirs
    to the workers. A backend's start is costly, and the load before may have cost connections
    (a failed delegated call closes the coordinator's): counted in the next load, they would be
    charged to the wrong operation. The set-up a load causes itself stays in its own figures.
    First the side's database vacuumed (``_vacuum``), so that the brief load replans what the
    vacuum's analysis invalidated."""
    _vacuum(side)
    load = _drive(config, side, kind, bodies, config.warmup, 0.2)
    side.loads[kind].problems += load.problems(f"{side.name}, settling before the {kind} load")


def _round(config: Config, side: Side, bodies: tuple[Bodies, Bodies], workdir: Path) -> str:
    """The three loads on one side, each checked, then ``metering verify``; a one-line
    summary."""
    voids = _voids(side)
    _settle(config, side, AUTH, bodies)
    _measure(
        side,
        AUTH,
        lambda: _drive(config, side, AUTH, bodies, config.seconds, config.warmup, voids),
    )
    stored = dict(
        _rows(
            side.url,
            "SELECT status, count(*) FROM authorizations WHERE request_id LIKE %s GROUP BY 1",
            f"{voids.run_id}-%",
        )
    )
    if stored != ({"voided": voids.voided} if voids.voided else {}):
        side.loads[AUTH].problems.append(
            f"{side.name}: holds stored {stored}, but {voids.voided} were answered voided"
        )
    for kind in (BATCH, EVENT):
        _settle(config, side, kind, bodies)
        _measure(
            side,
            kind,
            lambda kind=kind: _drive(config, side, kind, bodies, config.seconds, config.warmup),
            _size(kind, bodies),
        )
        count = common.sql_scalar(side.url, "SELECT count(*) FROM usage_events")
        if count != side.sent.events:
            side.loads[kind].problems.append(
                f"{side.name}: {count:,} events stored of {side.sent.events:,} sent"
            )
        side.loads[kind].problems += [
            f"{side.name}: {p}"
            for p in side.fixture.books.problems(side.server.base_url, side.sent.charged)
        ]
    side.verify_problems += [f"{side.name}: {p}" for p in config.code.verify(side.url, workdir)]
    rates = {kind: measured.rates[-1] for kind, measured in side.loads.items()}
    return (
        f"{rates[AUTH]:,.0f} authorizations/s, {rates[BATCH]:,.0f} events/s in batches, "
        f"{rates[EVENT]:,.0f} single events/s"
    )


# --- The scheduler's work: its tick's per-account scans, its webhook deliveries --------------

BACKGROUND = Path(__file__).with_name("background_work.py")
SCHEDULER = "scheduler"  # the tier of the scheduler's process


@dataclass
class Background:
    """The scheduler's work of one kind on one side: CPU seconds per tier (the scheduler's own
    process as ``SCHEDULER``, each node's backends in the bench's database), over ``done``
    units (accounts scanned, over every tick; messages delivered)."""

    cpu: dict[str, float] = field(default_factory=dict)
    done: int = 0
    problems: list[str] = field(default_factory=list)

    def ms_per_unit(self, tiers: Sequence[str]) -> float:
        total = sum(self.cpu.get(tier, 0.0) for tier in tiers)
        return total * 1000 / self.done if self.done else 0.0


def _scheduler_work(
    config: Config, side: Side, workdir: Path, job: str, count: int, prepare: Any = None
) -> tuple[Background, int]:
    """``bench/background_work.py job count`` in the code under test, its start-up and first
    run unmeasured (then ``prepare()``, if given), the nodes' CPU read around the rest; the
    figures, and what the driver reports done (ticks, or messages delivered)."""
    measured = Background()
    env = {**config.code.env(side.url, workdir), **dict(ALLOW_PRIVATE)}
    log = (workdir / f"{job}.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, str(BACKGROUND), job, str(count)],
        cwd=config.code.root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=log, text=True,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        if process.stdout.readline().strip() != "ready":
            measured.problems.append(f"{side.name}: the scheduler's {job} did not start")
            return measured, 0
        if prepare is not None:
            prepare()
        _vacuum(side)
        tiers = [tier for tier in side.tiers() if tier.name != "api"]
        before = snapshot(tiers)
        process.stdin.write("go\n")
        process.stdin.flush()
        line = process.stdout.readline()
        used = spent(before, snapshot(tiers))
        process.stdin.close()  # then it closes its connections and ends
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    try:
        reported = json.loads(line)
    except ValueError:
        measured.problems.append(f"{side.name}: the scheduler's {job} failed: {line[:200]!r}")
        return measured, 0
    measured.cpu = {SCHEDULER: float(reported["cpu"]), **used.cpu}
    return measured, int(reported["done"])


def _ticks(config: Config, side: Side, workdir: Path) -> Background:
    """``config.ticks`` scheduler ticks over the side's accounts, as the rounds left them; per
    account in the database (on a cluster a tick's cost grows with the shards and the accounts
    having work more than with the accounts: docs/citus.md)."""
    measured, ticks = _scheduler_work(config, side, workdir, "tick", config.ticks)
    accounts = common.sql_scalar(side.url, "SELECT count(*) FROM accounts")
    measured.done = ticks * accounts
    if ticks != config.ticks:
        measured.problems.append(f"{side.name}: {ticks} of {config.ticks} ticks ran")
    return measured


def _deliveries(config: Config, side: Side, workdir: Path, receiver: Receiver) -> Background:
    """``config.messages`` webhook messages (``webhook.test``, queued through the API over the
    first ``config.message_accounts`` accounts, an endpoint each at the harness's receiver)
    delivered by the scheduler's passes; each checked as bench_webhooks checks it."""
    accounts = side.fixture.accounts[: config.message_accounts]
    slug = "single" if side.name == SINGLE else "cluster"
    expected: dict[str, dict[str, str]] = {}

    def queue() -> None:
        with Admin(side.server.base_url) as admin:
            for index, account in enumerate(accounts):
                name = f"{slug}-{index}"
                endpoint = make_endpoint(admin, receiver, name, ["webhook.test"], account)
                expected[name] = {}
                for _ in range(config.messages // len(accounts)):
                    answer = admin.client.post(f"/admin/v1/webhook-endpoints/{endpoint}/test")
                    answer.raise_for_status()
                    expected[name][answer.json()["id"]] = "webhook.test"

    total = config.messages // len(accounts) * len(accounts)
    measured, delivered = _scheduler_work(config, side, workdir, "deliver", total, queue)
    measured.done = delivered
    if delivered != total:
        measured.problems.append(f"{side.name}: {delivered} of {total} messages delivered")
    for name, ids in expected.items():
        measured.problems += check_messages(f"{side.name} {name}", receiver.arrived(name), ids)
    return measured


def _rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_url(url)) as connection:
        return [tuple(row) for row in connection.execute(query, params)]


# --- Round trips: the cluster's logs ---------------------------------------------------------

# One log record: "<time> [<pid>] db=<database> <LEVEL>:  <message>" (scripts/citus.sh's
# log_line_prefix), continued on lines that do not start with a time.
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[(?P<pid>\d+)\] db=(?P<db>\S*) "
    r"(?P<level>[A-Z]+):\s+(?P<message>.*?)(?=^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\Z)",
    re.MULTILINE | re.DOTALL,
)
LOCALLY = "executing the command locally: "
DELEGATED = re.compile(r"\bmetering_(\w+)_of_account\(")


@dataclass
class NodeLog:
    """A node's server log (read through SQL: ``pg_current_logfile``), from a mark."""

    url: str  # the node's maintenance URL
    offset: int = 0

    def _size(self) -> int:
        rows = _rows(self.url, "SELECT size FROM pg_stat_file(pg_current_logfile())")
        return int(rows[0][0])

    def mark(self) -> None:
        self.offset = self._size()

    def records(self, database: str, exclude: set[int] | None = None) -> list[tuple[str, str]]:
        """(level, message) of each record of ``database`` since the mark (but ``exclude``'s,
        by process)."""
        size = self._size()
        [(chunk,)] = _rows(
            self.url,
            "SELECT pg_read_file(pg_current_logfile(), %s, %s)",
            self.offset,
            size - self.offset,
        )
        return [
            (r["level"], r["message"].strip())
            for r in RECORD.finditer(chunk)
            if r["db"] == database and int(r["pid"]) not in (exclude or set())
        ]


@dataclass
class Trips:
    """Per operation of one kind: commands a node sent another (one round trip each),
    statements the workers ran themselves by Citus' local execution, and the one-account
    functions delegated."""

    operations: int = 0
    sent: int = 0
    local: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # the coordinator's ERROR records
    connections: list[int] = field(default_factory=list)  # made to each node, coordinator first

    def per(self, count: int) -> float:
        return count / self.operations if self.operations else 0.0


def _set_logging(nodes: list[str], database: str, on: bool) -> None:
    settings = ("citus.log_remote_commands", "citus.log_local_commands", "log_min_messages")
    for node in nodes:
        with psycopg.connect(libpq_url(_in(node, database)), autocommit=True) as connection:
            # Each node's own setting (a worker refuses to propagate it, and need not).
            connection.execute("SET citus.enable_ddl_propagation = off")
            for setting in settings:
                if on:
                    value = "notice" if setting == "log_min_messages" else "on"
                    connection.execute(f'ALTER DATABASE "{database}" SET {setting} = {value}')
                else:
                    connection.execute(f'ALTER DATABASE "{database}" RESET {setting}')


def count_round_trips(
    config: Config, url: str, fixture: Fixture, workdir: Path, server_url: str | None = None
) -> tuple[dict[str, Trips], list[str]]:
    """A few operations of each kind through a server of its own (on ``server_url``, the
    cluster side's, if given), with every node of the cluster logging what it sends and runs;
    what they sent, counted from the logs."""
    database = make_url(url).database or ""
    nodes = _node_urls(config.coordinator_url)
    _set_logging(nodes, database, True)
    logs = [NodeLog(node) for node in nodes]
    server = config.code.server(server_url or url, workdir / "counting", 1)
    trips = {AUTH: Trips(), BATCH: Trips(), EVENT: Trips()}
    problems: list[str] = []
    try:
        server.start()
        client = httpx.Client(
            base_url=server.base_url,
            headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
            timeout=120,
        )
        run = secrets.token_hex(3)
        batches = Bodies(fixture.key_ids, config.batch, 1)
        singles = Bodies(fixture.key_ids, 1, 1)

        def authorize(index: int) -> None:
            secret = fixture.secrets[index % len(fixture.secrets)]
            response = client.post(
                "/v1/authorizations",
                json={
                    "api_key": secret,
                    "request_id": f"{run}-a-{index}",
                    "model": MODELS[0],
                    "api": "chat_completions",
                    "prompt_tokens": 1000,
                    "max_tokens": 256,
                },
            )
            if response.status_code != 200:
                problems.append(f"counting: authorization {response.status_code}")
                return
            hold = response.json()["id"]
            if client.delete(f"/v1/authorizations/{hold}").status_code != 200:
                problems.append("counting: void failed")

        def ingest(bodies: Bodies, index: int) -> None:
            response = client.post("/v1/usage/events", content=bodies.body(run, 0, index))
            try:
                check_counts(Response(response.status_code, response.content), bodies.size)
            except Exception as exc:  # an Unexpected answer: reported, never counted as met
                problems.append(f"counting: {exc}")

        # Each kind warmed first, unmeasured: the server's caches, its pools' connections; the
        # single events' by an event of each (key, model) the counted ones name (the same
        # template: ``Bodies``), whose lookup the server then remembers, as a server that has
        # run a while remembers its pairs' (metering.usage.single).
        same_pair = len(singles.templates) * 1_000
        for kind, operation, count, warm in (
            (AUTH, authorize, config.counted, [10_000 + i for i in range(3)]),
            (
                EVENT,
                lambda i: ingest(singles, i),
                config.counted,
                [same_pair + i for i in range(config.counted)],
            ),
            (BATCH, lambda i: ingest(batches, 1_000 + i), 2, [10_000 + i for i in range(3)]),
        ):
            for index in warm:
                operation(index)
            for log in logs:
                log.mark()
            opened = [_sessions(node, database) for node in nodes]
            for index in range(count):
                operation(index)
            found = trips[kind]
            found.operations = count * (config.batch if kind == BATCH else 1)
            found.connections = [
                _sessions(node, database) - then for node, then in zip(nodes, opened, strict=True)
            ]
            for node, log in zip(nodes, logs, strict=True):
                # Each node's commands to another: the coordinator's, and a worker's when a
                # call reached it that it does not hold. Not the background workers' (Citus'
                # maintenance daemon: deadlock detection, ...).
                background = {
                    pid
                    for (pid,) in _rows(
                        node,
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s "
                        "AND backend_type <> 'client backend'",
                        database,
                    )
                }
                records = log.records(database, exclude=background)
                for (level, message), (_, detail) in zip(
                    records, [*records[1:], ("", "")][: len(records)], strict=True
                ):
                    if level == "ERROR":
                        found.errors.append(message)
                    # A node's notices are relayed to the node that sent it the command, and
                    # logged there "from" it.
                    if (
                        level == "NOTICE"
                        and message.startswith("issuing ")
                        and not detail.startswith("from ")
                    ):
                        found.sent += 1
                        for name in set(DELEGATED.findall(message)):  # a call names it twice
                            found.calls[name] = found.calls.get(name, 0) + 1
            for log in logs[1:]:
                found.local += sum(
                    1
                    for level, message in log.records(database)
                    if level == "NOTICE" and message.startswith(LOCALLY)
                )
        client.close()
    finally:
        server.stop()
        _set_logging(nodes, database, False)
    return trips, problems


# --- The run ---------------------------------------------------------------------------------


# What a commit costs and risks: the cluster's nodes run with the single server's values of these
# for the whole run (``same_durability``), and both sides' are printed with the figures.
DURABILITY = ("fsync", "full_page_writes", "synchronous_commit")
# The settings' key for how both API servers connect (``same_transport``).
TRANSPORT = "transport"


def _settings_of(url: str, names: Sequence[str]) -> dict[str, str]:
    rows = _rows(url, "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", list(names))
    return {str(name): str(value) for name, value in rows}


def durability(url: str) -> dict[str, str]:
    return _settings_of(url, DURABILITY)


def _settings(url: str) -> str:
    """What the table says of a server's settings: its durability, and its autovacuum (off
    during the run on both sides: ``without_autovacuum``)."""
    found = _settings_of(url, (*DURABILITY, "autovacuum"))
    return ", ".join(f"{name}={value}" for name, value in sorted(found.items()))


@contextmanager
def system_settings(wanted: Mapping[str, Mapping[str, str]]) -> Iterator[None]:
    """Each server (by its maintenance URL) with the settings given for it while the block runs
    (``ALTER SYSTEM`` of those that differ, reloaded and waited for; reset after)."""
    changed = []
    try:
        for server, settings in wanted.items():
            current = _settings_of(server, list(settings))
            differing = {n: v for n, v in settings.items() if current.get(n) != v}
            if not differing:
                continue
            with psycopg.connect(libpq_url(server), autocommit=True) as connection:
                for name, value in differing.items():
                    connection.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                connection.execute("SELECT pg_reload_conf()")
            changed.append((server, tuple(differing)))
            deadline = time.monotonic() + 10
            while _settings_of(server, list(settings)) != settings and time.monotonic() < deadline:
                time.sleep(0.1)
        yield
    finally:
        for server, names in changed:
            with psycopg.connect(libpq_url(server), autocommit=True) as connection:
                for name in names:
                    connection.execute(f"ALTER SYSTEM RESET {name}")
                connection.execute("SELECT pg_reload_conf()")


def same_durability(node_urls: Sequence[str], single_url: str) -> AbstractContextManager[None]:
    """Every node of the cluster with the single server's ``DURABILITY`` settings while the
    block runs: scripts/citus.sh starts its nodes with fsync off, for the tests' sake, which
    spares them every WAL flush the server pays."""
    wanted = durability(single_url)
    return system_settings({node: wanted for node in node_urls})


def without_autovacuum(server_urls: Sequence[str]) -> AbstractContextManager[None]:
    """``autovacuum`` off on every server of both sides while the block runs; the bench vacuums
    each side's database itself before each load (``_vacuum``). An autovacuum worker's CPU would
    land in whichever load it ends in: on the cluster's nodes, whose ended backends are counted
    through their postmaster, one ending in a 20 s load charged that load's operations up to
    0.3 ms each, in a load that changed from run to run; on the shared single server it was not
    counted at all. Vacuuming is left out of both sides' figures alike."""
    return system_settings({server: {"autovacuum": "off"} for server in server_urls})


def _vacuum(side: Side) -> None:
    """``VACUUM (ANALYZE)`` of the side's database on each of its nodes (on a Citus node, its
    shards' tables with the rest), unmeasured, before a load: what autovacuum, off during the
    bench (``without_autovacuum``), would have done in the meantime."""
    database = make_url(side.url).database or ""
    for _name, node, _parent in side.nodes:
        with psycopg.connect(libpq_url(_in(node, database)), autocommit=True) as connection:
            connection.execute("VACUUM (ANALYZE)")


def same_transport(server_url: str, single_url: str) -> tuple[str, str]:
    """The cluster's API server URL with its connections as the one server's: without TLS when
    the one server has ``ssl`` off (as this machine's has). ``CREATE EXTENSION citus`` turns
    ``ssl`` on in every node (with a certificate of its own), and libpq's default
    (``sslmode=prefer``) would then encrypt every round trip to the cluster alone: 10–17 µs
    more of a node's backend CPU per small statement here, and the API server's besides. And
    what the table says of both."""
    [(ssl,)] = _rows(single_url, "SHOW ssl")
    if ssl == "on":
        return server_url, "TLS on both sides' connections (libpq's sslmode=prefer)"
    url = make_url(server_url).update_query_dict({"sslmode": "disable"})
    said = "no TLS (the one server's ssl=off; the cluster's server connects with sslmode=disable)"
    return url.render_as_string(hide_password=False), said


@contextmanager
def _side(
    config: Config,
    name: str,
    url: str,
    nodes: list[tuple[str, str, int | None]],
    workdir: Path,
    server_url: str | None = None,
) -> Iterator[Side]:
    """One side, migrated and set up; its API server on ``server_url`` (``url`` if none: the
    database's URL, which the checks use)."""
    started = time.monotonic()
    config.code.migrate(url, workdir / "cli")
    server = config.code.server(server_url or url, workdir / "server", config.workers)
    try:
        server.start()
        fixture = _setup(config, url, server.base_url, workdir / "cli")
        print(f"   {name}: migrated and set up in {time.monotonic() - started:.0f} s", flush=True)
        yield Side(name, url, server, fixture, nodes, server_url or url)
    finally:
        server.stop()


def _ms(value: float) -> str:
    return f"{value:.3f} ms"


def run(config: Config | None = None) -> list[Result]:
    config = config or Config()
    # The scheduler's deliveries go to the harness's receiver on this machine.
    code = CodeUnderTest(config.code.root, (*config.code.server_env, *ALLOW_PRIVATE))
    config = dataclasses.replace(config, code=code)
    ensure_cluster(config.coordinator_url)
    node_urls = _node_urls(config.coordinator_url)
    workers = [f"worker :{make_url(node).port}" for node in node_urls[1:]]
    cluster_nodes = [
        (name, node, postmaster(node))
        for name, node in zip(["coordinator", *workers], node_urls, strict=True)
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_database() as single_url,
        citus_database(config.coordinator_url, config.shard_count) as cluster_url,
        same_durability(node_urls, single_url),
        without_autovacuum([*node_urls, common.PG_MAINTENANCE_URL]),
    ):
        workdir = Path(tmp)
        # A shared server: its backends in the bench's database only (others' sessions end
        # all the time there, so its postmaster's reaped children are not the bench's).
        single_node = [("PostgreSQL", common.PG_MAINTENANCE_URL, None)]
        cluster_server_url, transport = same_transport(
            every_node_url(cluster_url, node_urls) if config.every_node else cluster_url,
            single_url,
        )
        with (
            _side(config, SINGLE, single_url, single_node, workdir / "single") as single,
            _side(
                config,
                CLUSTER,
                cluster_url,
                cluster_nodes,
                workdir / "cluster",
                cluster_server_url,
            ) as cluster,
        ):
            bodies = {
                side.name: (
                    Bodies(side.fixture.key_ids, config.batch, config.senders),
                    Bodies(side.fixture.key_ids, 1, config.senders),
                )
                for side in (single, cluster)
            }
            for side in (single, cluster):
                _warm(config, side, bodies[side.name])
            for index in range(config.rounds):
                for side in (single, cluster):
                    summary = _round(config, side, bodies[side.name], workdir / "cli")
                    print(f"   round {index + 1}, {side.name}: {summary}", flush=True)
            receiver = Receiver()
            try:
                background = {
                    side.name: {
                        "tick": _ticks(config, side, workdir / "cli"),
                        "deliver": _deliveries(config, side, workdir / "cli", receiver),
                    }
                    for side in (single, cluster)
                }
            finally:
                receiver.close()
            settings = {
                SINGLE: _settings(single_url),
                # Every node's (one line when they agree, as they should).
                CLUSTER: " | ".join(sorted({_settings(node) for node in node_urls})),
                TRANSPORT: transport,
            }
            trips, counting_problems = count_round_trips(
                config, cluster_url, cluster.fixture, workdir, cluster.server_url
            )
    results = report(config, single, cluster, trips, counting_problems, settings, workers)
    results += report_background(config, background, workers)
    if config.refusals:
        from bench import bench_refusals  # it builds on this module's cluster helpers

        results += bench_refusals.run(bench_refusals.Config(("citus",), code=config.code))
    return results


def report(
    config: Config,
    single: Side,
    cluster: Side,
    trips: dict[str, Trips],
    counting_problems: list[str],
    settings: dict[str, str],
    workers: list[str],
) -> list[Result]:
    """The tables, printed; the figures, for the runner's table."""
    label = rounds_label(config.rounds)
    kinds = (
        (AUTH, "authorizations/s (each hold voided)", f"{config.clients} clients"),
        (BATCH, f"ingest events/s, batches of {config.batch}", f"{config.senders} senders"),
        (EVENT, "ingest single-event requests/s", f"{config.senders} senders"),
    )
    print()
    print(
        f"   Throughput, same run, alternated ({label}); {config.workers} API workers each; "
        f"{config.accounts} accounts, ingest over {config.ingest_accounts}. Both on this one "
        "machine: the cluster's three nodes share its cores with the API and the load generator."
    )
    print(
        f"   Settings: one server {settings[SINGLE]}; cluster nodes {settings[CLUSTER]};"
        f" the API servers' connections: {settings[TRANSPORT]}."
    )
    print(
        "   The cluster's API server connects to "
        + (
            "every node (its URL names them all, the coordinator first): each gateway call (an "
            "authorization, its void, a single event, an account's part of a batch) on the node "
            "holding its account, sessions (admin) on the coordinator."
            if config.every_node
            else "the coordinator only (BENCH_CITUS_NODES=coordinator)."
        )
    )
    unfair = [] if settings[SINGLE] == settings[CLUSTER] else ["durability settings differ"]
    lines = table(
        ("figure", SINGLE, CLUSTER, "cluster ÷ one server"),
        [
            (
                f"{what}, {who}",
                f"{median(single.loads[kind].rates):,.0f}/s",
                f"{median(cluster.loads[kind].rates):,.0f}/s",
                _ratio(median(cluster.loads[kind].rates), median(single.loads[kind].rates)),
            )
            for kind, what, who in kinds
        ],
    )
    print("\n".join("   " + line for line in lines))

    print()
    print(
        "   Cost per operation: CPU from /proc over every load of every round, warm-up included, "
        "each load after a brief unmeasured one of its kind, the rounds after each side's "
        "warming (below) (the API server's processes; on "
        "each node its backends in the bench's database, and on "
        "the cluster's nodes those that ended meanwhile); an authorization with its void, an "
        "event of a batch, a single-event request. Commands counted from the cluster's logs "
        "(each one round trip from a node to another):"
    )
    rows = []
    for kind, *_ in kinds:
        s, c = single.loads[kind], cluster.loads[kind]
        rows.append(
            (
                kind,
                _ms(s.ms_per_operation(["api"])),
                _ms(s.ms_per_operation(["PostgreSQL"])),
                _ms(c.ms_per_operation(["api"])),
                _with_churn(c, ["coordinator"]),
                _with_churn(c, workers),
                f"{trips[kind].per(trips[kind].sent):.2f}",
                f"{trips[kind].per(trips[kind].local):.2f}",
                f"{s.sessions_per_1000(['PostgreSQL']):.1f} / "
                f"{c.sessions_per_1000(['coordinator']):.1f} / {c.sessions_per_1000(workers):.1f}",
            )
        )
    header = (
        "per operation",
        "one server: API CPU",
        "one server: PostgreSQL CPU",
        "cluster: API CPU",
        "coordinator CPU (in connections made)",
        "worker CPU (in connections made)",
        "commands node→node",
        "statements run on a worker by Citus' local execution",
        "connections made per 1,000: one server / coordinator / workers",
    )
    print("\n".join("   " + line for line in table(header, rows)))
    calls = {kind: ", ".join(f"{n} × {name}_of_account" for name, n in t.calls.items()) or "none"
             for kind, t in trips.items()}  # fmt: skip
    print(
        f"   Round trips counted over {config.counted} authorizations, {config.counted} single "
        f"events and 2 batches, the remote commands logged; delegated calls among them: "
        f"{AUTH}s {calls[AUTH]}; single events {calls[EVENT]}; batches {calls[BATCH]}."
    )
    made = {
        kind: f"{t.connections[0]} to the coordinator, {sum(t.connections[1:])} to the workers"
        for kind, t in trips.items()
        if t.connections
    }
    print(
        "   Connections made meanwhile (one client, after 3 operations of warm-up, single "
        "events after one of each pair): "
        + "; ".join(f"{PLURAL[kind]}: {text}" for kind, text in made.items())
    )
    event_trips = trips[EVENT]
    if event_trips.errors:
        print(
            f"   {len(event_trips.errors)} errors in the coordinator's log while the single events "
            f"were counted, e.g. {event_trips.errors[0][:200]!r}"
        )
    # Its record: confirming the lookup the server remembers (after the warm-up's events, every
    # one), or not.
    records = event_trips.calls.get("record_usage_confirmed", 0)
    records += event_trips.calls.get("record_usage", 0)
    if records == event_trips.operations and not event_trips.errors:
        path = (
            "one delegated call of metering_record_usage_confirmed_of_account (the lookup the "
            "server remembers, confirmed in the call)"
        )
    elif records:
        path = (
            "a delegated call of its record that failed, then a "
            "per-account transaction of routed statements. Each failed call costs the worker a "
            "connection: the coordinator closes its connection after the error, and the next "
            "operation of that session opens another, whose backend's start is the CPU in "
            "brackets above (the load before each measured one, unmeasured, takes those the "
            "previous load left, so each kind is charged its own)"
        )
    elif not event_trips.sent and not event_trips.errors:
        path = (
            "one call of metering_record_usage_confirmed_of_account (the lookup the server "
            "remembers, confirmed in the call), sent by the API server to the node holding the "
            "account and run there (no command from one node to another)"
        )
    else:
        path = "a per-account transaction of routed statements (no delegated call)"
    print(f"   A single event on the cluster ran as {path}.")
    lost = [
        f"{count} of {side.name}'s {tier} in the {kind} loads"
        for side in (single, cluster)
        for kind, load in side.loads.items()
        for tier, count in load.lost.items()
    ]
    if lost:
        print(
            f"   NOTE: processes ended during a load (their CPU in it is not counted): "
            f"{'; '.join(lost)}."
        )

    print()
    print(
        "   PROJECTION (not a measurement): each operation runs on the one worker that holds its "
        "account, so a worker core takes 1 / (worker CPU per operation) operations a second. "
        "Assumes: load spread over many accounts (one hot account stays on one worker), shards "
        "spread evenly, workers CPU-bound (not disk; their WAL flushed as the server's), the API "
        "tier and the coordinator scaled apart (their own ceilings below), the same CPU per "
        "operation on a server's cores as here. See docs/citus.md."
    )
    projection = []
    results: list[Result] = []
    for kind, *_ in kinds:
        c = cluster.loads[kind]
        worker_ms = c.ms_per_operation(workers)
        coordinator_ms = c.ms_per_operation(["coordinator"])
        api_ms = c.ms_per_operation(["api"])
        steady_ms = worker_ms - c.churn_ms_per_operation(workers)
        projection.append(
            (
                kind,
                _ms(worker_ms),
                _per_core(worker_ms),
                _per_core(steady_ms),
                _per_core(coordinator_ms),
                _per_core(api_ms),
            )
        )
    header = (
        "per operation",
        "worker CPU",
        "PROJECTED per added worker core",
        "the same, backends started or ended in the load left out (an upper bound)",
        "coordinator ceiling per core",
        "API ceiling per core",
    )
    print("\n".join("   " + line for line in table(header, projection)))
    if config.warming > 0:
        warm = [
            f"{kind} {_ms(cluster.warming[kind].ms_per_operation(workers))} "
            f"({_ms(single.warming[kind].ms_per_operation(['PostgreSQL']))})"
            for kind, *_ in kinds
        ]
        print(
            f"   Before the rounds, each side ran each load {config.warming:.0f} s, left out of "
            "the figures above (a service that has run a while: its pools full, each backend "
            "past its first calls of the programs of each shard it meets). Worker CPU per "
            "operation then (one server's PostgreSQL in brackets): " + "; ".join(warm) + "."
        )

    verify = tuple(single.verify_problems + cluster.verify_problems + unfair)
    for kind, what, who in kinds:
        s, c = single.loads[kind], cluster.loads[kind]
        problems = tuple(s.problems + c.problems) + verify
        ours, base = median(c.rates), median(s.rates)
        slug = {AUTH: "authorizations", BATCH: "batches", EVENT: "singles"}[kind]
        results.append(
            Result(
                f"citus.{slug}",
                f"Citus: {what}, {who}",
                "-",
                ours,
                "/s",
                None,
                label,
                f"{_ratio(ours, base)} of one PostgreSQL server ({base:,.0f}/s)",
                base,
                problems=problems,
            )
        )
    for kind, *_ in kinds:
        c = cluster.loads[kind]
        worker_ms = c.ms_per_operation(workers)
        slug = {AUTH: "authorization", BATCH: "batch_event", EVENT: "single_event"}[kind]
        single_ms = single.loads[kind].ms_per_operation(["PostgreSQL"])
        problems = tuple(c.problems) + tuple(counting_problems) + tuple(unfair)
        results.append(
            Result(
                f"citus.worker_cpu.{slug}",
                f"Citus: worker CPU per {kind} ({c.churn_ms_per_operation(workers):.3f} ms of "
                f"it in connections made; {trips[kind].per(trips[kind].sent):.2f} commands "
                "node→node)",
                "-",
                worker_ms,
                "ms",
                None,
                f"CPU over {config.rounds} rounds' loads",
                f"one server's PostgreSQL: {_ms(single_ms)}",
                higher_is_better=False,
                problems=problems,
            )
        )
        results.append(
            Result(
                f"citus.projected.{slug}",
                f"  PROJECTED {PLURAL[kind]}/s per added worker core (1 / worker CPU)",
                "-",
                1000 / worker_ms if worker_ms else 0.0,
                "/s",
                None,
                "projection",
                f"coordinator ceiling {_per_core(c.ms_per_operation(['coordinator']))} per core",
                problems=problems,
            )
        )
    return results


def report_background(
    config: Config, background: dict[str, dict[str, Background]], workers: list[str]
) -> list[Result]:
    """The scheduler's work on both sides, printed; the cluster's worker figures, for the
    runner's table."""
    single, cluster = background[SINGLE], background[CLUSTER]
    accounts = f"{config.accounts} accounts"
    units = {
        "tick": f"tick, per account in the database ({config.ticks} ticks, {accounts})",
        "deliver": f"webhook message delivered ({config.messages} over "
        f"{config.message_accounts} accounts)",
    }
    print()
    print(
        "   The scheduler's work, after the rounds, on the data they left (a process of the code "
        "under test, its start-up and a first run unmeasured; CPU from its own clock and from "
        "/proc for the nodes' backends in the bench's database):"
    )
    rows = [
        (
            what,
            _ms(single[job].ms_per_unit([SCHEDULER])),
            _ms(single[job].ms_per_unit(["PostgreSQL"])),
            _ms(cluster[job].ms_per_unit([SCHEDULER])),
            _ms(cluster[job].ms_per_unit(["coordinator"])),
            _ms(cluster[job].ms_per_unit(workers)),
        )
        for job, what in units.items()
    ]
    header = (
        "per",
        "one server: scheduler CPU",
        "one server: PostgreSQL CPU",
        "cluster: scheduler CPU",
        "coordinator CPU",
        "worker CPU",
    )
    print("\n".join("   " + line for line in table(header, rows)))
    results = []
    for job, slug in (("tick", "tick_per_account"), ("deliver", "webhook_message")):
        problems = tuple(single[job].problems + cluster[job].problems)
        for problem in problems:
            print(f"   PROBLEM {problem}")
        results.append(
            Result(
                f"citus.worker_cpu.{slug}",
                f"Citus: worker CPU per {units[job]}",
                "-",
                cluster[job].ms_per_unit(workers),
                "ms",
                None,
                "CPU over the measured runs",
                f"one server's PostgreSQL: {_ms(single[job].ms_per_unit(['PostgreSQL']))}",
                higher_is_better=False,
                problems=problems,
            )
        )
    return results


def _with_churn(measured: Measured, tiers: Sequence[str]) -> str:
    """A tier's CPU per operation, and (in brackets) how much of it the processes that started
    or ended during the loads spent: their start, and whatever else they did in the load."""
    return f"{_ms(measured.ms_per_operation(tiers))} ({measured.churn_ms_per_operation(tiers):.3f})"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.0%}" if base else "-"


def _per_core(ms: float) -> str:
    return f"{1000 / ms:,.0f}/s" if ms else "-"
