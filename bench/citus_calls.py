"""What one gateway operation costs a Citus worker, statement by statement, from one sequential
client: the delegated call's CPU on the worker that holds the account, and what each statement
of it spends planning and executing there.

A fresh database on the cluster (``bench_citus.citus_database``: 32 shards), set up as
``bench.per_request`` sets up its own (an account with two keys, three grants and access rules);
one server process (one uvicorn worker) of the code under test, connected to every node of the
cluster (each call sent to its account's node: docs/citus.md#connections-to-every-node; or to the
coordinator alone, ``--nodes coordinator``); one client on one keep-alive
connection sends each operation ``--warmup`` times, then ``--requests`` times counted:

- ``authorize``: an authorization of a known key and its void (the ledger benchmark's loop);
- ``ingest``: one new, billable single event (one delegated call);
- ``ingest-batch``: batches of 1,000 new, billable events (``bench.per_request``'s: a tenth of
  ``--requests`` and a third of ``--warmup``) spread over the keys of ``--accounts`` accounts
  (1; ``make bench BENCH=citus`` spreads its batches over 20), each figure per event.

Counted on each node (the coordinator's CPU and statements too; instructions on the workers
only), over the counted requests only:

- **CPU per operation** of its client backends in the database (Citus' maintenance daemon of
  the database left out), from ``/proc/<pid>/schedstat`` (nanoseconds of CPU each process ran;
  a backend that started or ended meanwhile is named);
- with ``--database-callgrind USER``, **instructions per operation** of those backends, which a
  busy machine does not change: the workers run under valgrind's callgrind
  (``--trace-children=yes --instr-atstart=no``, as ``bench.per_request``'s database, docs/
  performance.md), each backend's counting switched on and zeroed before the counted requests
  and read after them (``callgrind_control``, as USER), then each backend's profile dumped
  beside valgrind's output file (``callgrind_annotate --inclusive=yes``: where they went);
  ``--shards`` fewer than 32 then keeps ``metering migrate`` on the slowed workers short;
- **each statement** the worker ran, when it has ``pg_stat_statements`` loaded
  (``shared_preload_libraries``, ``pg_stat_statements.track = all`` and ``track_planning = on``
  so that the statements a function runs, and the shard queries Citus' local execution plans
  again, are counted apart): calls, plans (a plan kept between calls is planned once), and the
  planning and execution time of each per operation. Execution time includes what nested
  statements spent; ``pg_stat_statements_reset()`` clears the whole node's, so use a cluster of
  your own.

Run: ``python -m bench.citus_calls [--code DIR] [--requests N] [--warmup N] [OPERATION …]``
(``--code``: another checkout's service, e.g. a ``git worktree`` of an older commit) with
``BENCH_CITUS_URL`` naming the coordinator's maintenance database (the nodes on this machine,
their CPU is read from ``/proc``). The harness never imports ``metering``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from bench import bench_ingest, bench_ledger
from bench.bench_citus import (
    CITUS_URL,
    Config,
    _node_urls,
    citus_database,
    ensure_cluster,
    every_node_url,
)
from bench.common import Admin, CodeUnderTest, libpq_url
from bench.per_request import _THREAD_TOTAL, Client, _count, _send, _setup

OPERATIONS = ("authorize", "ingest", "ingest-batch")


def _cpu_ns(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return None


@dataclass
class Statement:
    query: str
    toplevel: bool
    calls: int
    plans: int
    plan_ms: float
    exec_ms: float


@dataclass
class Worker:
    name: str
    requests: int = 1  # the counted requests
    per: int = 1  # what the figures are divided by: the requests, or the batches' events
    cpu_ms: float = 0.0
    instructions: float | None = None  # per operation, under callgrind
    churn: list[str] = field(default_factory=list)
    statements: list[Statement] = field(default_factory=list)


def _has_statements(node: str) -> bool:
    """Whether a node counts statements (the extension in its maintenance database: created
    on the coordinator's, which Citus copies to every node)."""
    with psycopg.connect(libpq_url(node), autocommit=True) as connection:
        row = connection.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
        ).fetchone()
    return row is not None


def _reset_statements(node: str) -> None:
    with psycopg.connect(libpq_url(node), autocommit=True) as connection:
        connection.execute("SELECT pg_stat_statements_reset()")


def _read_statements(node: str, database: str) -> list[Statement]:
    with psycopg.connect(libpq_url(node), autocommit=True) as connection:
        rows = connection.execute(
            "SELECT query, toplevel, calls, plans, total_plan_time, total_exec_time"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s",
            (database,),
        ).fetchall()
    return [Statement(*row) for row in rows]


# A connection Citus opens to another node names the backend it works for (application_name
# ``citus_internal gpid=<node id × 10^10 + pid>``).
_GPID = re.compile(r"citus_internal gpid=(\d+)")


def _daemons(nodes: Sequence[str]) -> set[int]:
    """The pids of every node's Citus maintenance daemons (the nodes are on this machine: one
    space of pids)."""
    found: set[int] = set()
    for node in nodes:
        with psycopg.connect(libpq_url(node), autocommit=True) as connection:
            found.update(
                row[0]
                for row in connection.execute(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE backend_type LIKE 'Citus Maintenance Daemon%'"
                )
            )
    return found


def _clients(node: str, database: str, daemons: set[int]) -> list[int]:
    """The pids of a node's client backends in ``database`` working for the calls: not Citus'
    maintenance daemon of the database, nor the backends that a maintenance daemon's own
    connections made (the coordinator's distributed deadlock detection queries every worker,
    every few seconds), whose periodic work is no operation's."""
    with psycopg.connect(libpq_url(node), autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = %s AND backend_type = 'client backend'",
            (database,),
        ).fetchall()
    return [pid for pid, name in rows if not _for_daemon(name or "", daemons)]


def _for_daemon(application_name: str, daemons: set[int]) -> bool:
    match = _GPID.fullmatch(application_name)
    return match is not None and int(match.group(1)) % 10**10 in daemons


def _control(user: str, option: str, pid: int) -> str:
    """``callgrind_control`` of a backend, as ``bench.per_request`` runs it."""
    done = subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin",
         "callgrind_control", option, str(pid)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout


def _more_accounts(code: CodeUnderTest, url: str, workdir: Path, client: Client, more: int) -> None:
    """``more`` accounts set up as ``_setup``'s first (two keys, three grants, access rules),
    their keys added to the events' keys."""
    models = sorted({*bench_ingest.MODELS, bench_ledger.MODEL})
    server = code.server(url, workdir, 1).start()
    try:
        with Admin(server.base_url) as admin:
            for number in range(more):
                account = admin.account(f"per-request-{number}")
                client.key_ids += [admin.key(account)[0] for _ in range(2)]
                admin.three_grants(account, bench_ledger.GRANT_CENTS)
                admin.access_rules(account, models, bench_ledger.CONCURRENCY)
    finally:
        server.stop()


def measure(
    code: CodeUnderTest,
    operation: str,
    requests: int,
    warmup: int,
    coordinator_url: str,
    shards: int = 32,
    callgrind_user: str | None = None,
    every_node: bool = True,
    accounts: int = 1,
) -> list[Worker]:
    """Each node's figures per operation (per event of ``ingest-batch``), the coordinator
    first."""
    workdir = Path(tempfile.mkdtemp(prefix="metering-citus-calls-"))
    try:
        with citus_database(coordinator_url, shards) as url:
            database = make_url(url).database or ""
            client = _setup(code, url, workdir)
            if accounts > 1:
                _more_accounts(code, url, workdir, client, accounts - 1)
            nodes = _node_urls(coordinator_url)
            workers = nodes[1:]
            counted = [node for node in nodes if _has_statements(node)]
            requests, warmup, per = _count(operation, requests, warmup, client.batch)
            server_url = every_node_url(url, nodes) if every_node else url
            server = code.server(server_url, workdir, 1).start()
            try:
                asyncio.run(_send(server.port, client, operation, warmup))
                daemons = _daemons(_node_urls(coordinator_url))
                before = {
                    node: {pid: _cpu_ns(pid) for pid in _clients(node, database, daemons)}
                    for node in nodes
                }
                for node in counted:
                    _reset_statements(node)
                if callgrind_user:
                    for node in workers:
                        for pid in _clients(node, database, daemons):
                            _control(callgrind_user, "--instr=on", pid)
                            _control(callgrind_user, "--zero", pid)
                asyncio.run(_send(server.port, client, operation, requests))
                found = []
                for node in nodes:
                    port = str(make_url(node).port)
                    worker = Worker(
                        port if node in workers else f"{port} (coordinator)", requests, per
                    )
                    if callgrind_user and node in workers:
                        totals = [
                            int(n.replace(",", ""))
                            for pid in _clients(node, database, daemons)
                            for n in _THREAD_TOTAL.findall(_control(callgrind_user, "-e", pid))
                        ]
                        worker.instructions = sum(totals) / per
                        # each backend's profile of the operation, for callgrind_annotate
                        for pid in _clients(node, database, daemons):
                            _control(callgrind_user, f"--dump={operation}", pid)
                    now = {pid: _cpu_ns(pid) for pid in _clients(node, database, daemons)}
                    then = before[node]
                    for pid, value in now.items():
                        if value is None:
                            continue
                        if pid not in then or then[pid] is None:
                            worker.churn.append(f"backend {pid} started")
                        worker.cpu_ms += (value - (then.get(pid) or 0)) / 1e6 / per
                    worker.churn += [f"backend {pid} ended" for pid in set(then) - set(now)]
                    if node in counted:
                        worker.statements = _read_statements(node, database)
                    found.append(worker)
                return found
            finally:
                server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def report(operation: str, workers: Sequence[Worker], width: int) -> None:
    requests, per = workers[0].requests, workers[0].per
    counted = f"{requests} requests" + (f", {per} events" if per != requests else "")
    print(f"\n== {operation}: {counted} counted, one sequential client; per operation:")
    for worker in workers:
        instructions = (
            ""
            if worker.instructions is None
            else f", {worker.instructions / 1000:,.0f}k instructions"
        )
        print(f"node :{worker.name}: backends' CPU {worker.cpu_ms:.3f} ms{instructions}")
        for note in worker.churn:
            print(f"   ({note})")
        statements = sorted(
            (s for s in worker.statements if s.calls >= requests / 2),
            key=lambda s: -(s.plan_ms + (0 if s.toplevel else s.exec_ms)),
        )
        if not statements:
            continue
        print("   per operation: calls  plans  plan ms  exec ms (incl. nested)  statement")
        for s in statements:
            text = " ".join(s.query.split())
            text = text if len(text) <= width else text[: width - 1] + "…"
            print(
                f"   {'top ' if s.toplevel else '    '}"
                f"{s.calls / per:6.2f} {s.plans / per:6.2f} "
                f"{s.plan_ms / per:8.3f} {s.exec_ms / per:8.3f}   {text}"
            )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.citus_calls", description=__doc__)
    parser.add_argument("operations", nargs="*", help=f"of {', '.join(OPERATIONS)} (default: all)")
    parser.add_argument("--code", type=Path, help="the checkout to measure (default: this one)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--width", type=int, default=160, help="characters of each statement")
    parser.add_argument("--shards", type=int, default=32, help="the database's shard count")
    parser.add_argument(
        "--accounts", type=int, default=1, help="the accounts a batch's events spread over"
    )
    parser.add_argument(
        "--database-callgrind",
        metavar="USER",
        help="the workers run under callgrind as USER: count their backends' instructions",
    )
    parser.add_argument(
        "--nodes",
        choices=("every", "coordinator"),
        default="every" if Config().every_node else "coordinator",
        help="the server connects to every node (each call on its account's) or to the "
        "coordinator only (default: BENCH_CITUS_NODES, every)",
    )
    args = parser.parse_args(argv)
    ensure_cluster(CITUS_URL)
    code = CodeUnderTest(args.code.resolve()) if args.code else CodeUnderTest()
    for operation in args.operations or OPERATIONS:
        if operation not in OPERATIONS:
            parser.error(f"unknown operation {operation!r}")
        workers = measure(
            code,
            operation,
            args.requests,
            args.warmup,
            CITUS_URL,
            args.shards,
            args.database_callgrind,
            args.nodes == "every",
            args.accounts,
        )
        report(operation, workers, args.width)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
