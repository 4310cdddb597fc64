"""Pre-flight authorizations over loopback HTTP against PostgreSQL (issue 3's benchmark).

(a) throughput, 16 clients over 100 accounts; (b) p99 latency of an authorization, 4 clients;
(c) throughput, 16 clients on one hot account, then a check that no update was lost (balance =
ledger sum, no hold left open, one charge per settled hold). Every client releases each hold it
gets before its next request (DELETE, as a gateway does for a request rejected before
generation; in (c) every fourth is settled by a usage event instead, so the hot account's
balance moves under the same row lock), so each run measures a steady state. An operation is
one authorization plus its release; the rate counts operations.

The same loads are driven at ``bench.baseline_app`` (FastAPI endpoints of the same shape doing
no work) with the same number of workers, alternating with ours for ``ROUNDS`` rounds (best of
each side is kept): our figure is also printed as a share of that ceiling.

The machine has two cores shared by the load generator, the server and PostgreSQL, so the
server runs ``WORKERS`` uvicorn workers (2: one per core; more only adds context switches).

Run: ``python -m bench ledger`` (or ``make bench``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
from sqlalchemy import func, select

from bench.common import Result, bench_database, percentile
from bench.loadgen import Connection, LoadResult, run_load
from metering.accounts import service as accounts
from metering.catalog import service as catalog
from metering.catalog.schemas import ModelSpec, PriceSpec
from metering.db import Database
from metering.kit.timeutil import format_timestamp
from metering.ledger import service as ledger
from metering.models import Account, Authorization, LedgerEntry
from tests.conftest import GATEWAY_TOKEN
from tests.servers import ServerProcess

WORKERS = int(os.environ.get("BENCH_LEDGER_WORKERS", "2"))
DURATION = float(os.environ.get("BENCH_LEDGER_SECONDS", "5"))
WARMUP = 1.0
ROUNDS = int(os.environ.get("BENCH_LEDGER_ROUNDS", "2"))
SETTLE_EVERY = 4  # in (c), every 4th hold is settled by a usage event, the rest voided
ACCOUNTS = 100
MODEL = "Bench-GLM"
GLM_RATES = (22_000_000, 339_000_000, 17_750_000)  # microcents per million tokens
GRANT_MICROCENTS = 10**15  # ten million dollars: (a) and (b) never run out
HEADERS = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}


@dataclass
class Fixture:
    url: str
    secrets: list[str]  # one key per account
    hot_account: str
    hot_secret: str


def _setup(url: str) -> Fixture:
    """Accounts, keys, a priced model and grants, through the service layer (not slow HTTP)."""
    database = Database.from_url(url, pool_size=1)
    now = datetime.now(UTC)
    try:
        with database.unit_of_work() as session:
            catalog.put_model(
                session, MODEL, ModelSpec(display_name=MODEL, context_length=131072), now
            )
            catalog.add_price_version(
                session,
                MODEL,
                PriceSpec(
                    effective_at=format_timestamp(now),
                    input_microcents_per_million=GLM_RATES[0],
                    output_microcents_per_million=GLM_RATES[1],
                    cache_read_microcents_per_million=GLM_RATES[2],
                ),
                now,
            )
            keys: list[str] = []
            for index in range(ACCOUNTS + 1):
                account = accounts.create_account(session, f"bench-{index}", "prepaid", now)
                _key, secret = accounts.create_api_key(session, account, "bench", None, now)
                ledger.add_entry(session, account.id, "grant", GRANT_MICROCENTS, "seed", None, now)
                keys.append(secret)
                hot = account.id
        return Fixture(url, keys[:ACCOUNTS], hot, keys[ACCOUNTS])
    finally:
        database.dispose()


class BaselineProcess(ServerProcess):
    """``bench.baseline_app`` under uvicorn with the same worker count as ours."""

    def start(self, timeout: float = 30.0) -> BaselineProcess:
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "bench.baseline_app:create",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            "--no-access-log",
            "--log-level",
            "warning",
        ]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            command,
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("the baseline app did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(15)


@dataclass
class Load:
    """One client loop: authorize, then release the hold; records the authorization's latency."""

    secret_of: Callable[[int, int], str]
    settle_every: int = 0  # settle every n-th hold by a usage event instead of voiding it
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    auth_latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    settled: int = 0

    async def __call__(self, connection: Connection, client: int, iteration: int) -> int:
        request_id = f"{self.run_id}-{client}-{iteration}"
        started = time.perf_counter()
        response = await connection.request(
            "POST",
            "/v1/authorizations",
            {
                "api_key": self.secret_of(client, iteration),
                "request_id": request_id,
                "model": MODEL,
                "api": "chat_completions",
                "prompt_tokens": 1000,
                "max_tokens": 256,
            },
        )
        self.auth_latencies.append(time.perf_counter() - started)
        self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
        if response.status == 200:
            hold = json.loads(response.body)
            if self.settle_every and iteration % self.settle_every == 0:
                await self._settle(connection, hold, request_id)
            else:
                await connection.request("DELETE", f"/v1/authorizations/{hold['id']}")
        return response.status

    async def _settle(self, connection: Connection, hold: dict[str, Any], request_id: str) -> None:
        event = {
            "request_id": request_id,
            "api_key_id": hold.get("api_key_id", "key_baseline"),
            "model": MODEL,
            "api": "chat_completions",
            "usage": {"prompt_tokens": 1000, "completion_tokens": 100},
            "occurred_at": format_timestamp(datetime.now(UTC)),
            "outcome": "completed",
            "authorization_id": hold["id"],
        }
        response = await connection.request("POST", "/v1/usage/events", {"events": [event]})
        if response.status != 200 or json.loads(response.body)["recorded"] != 1:
            raise RuntimeError(f"settlement failed: {response.status} {response.body[:300]!r}")
        self.settled += 1


def _drive(base_url: str, clients: int, load: Load) -> LoadResult:
    return run_load(base_url, clients, DURATION, load, headers=HEADERS, warmup=WARMUP)


@dataclass
class Pair:
    """Our figure and the baseline's for one load, best of ``ROUNDS`` alternating runs: the
    machine is shared, and alternating keeps a burst of someone else's work from landing on
    one side of the comparison only."""

    ours: list[tuple[LoadResult, Load]] = field(default_factory=list)
    base: list[tuple[LoadResult, Load]] = field(default_factory=list)

    def best_rate(self, side: str) -> tuple[LoadResult, Load]:
        return max(getattr(self, side), key=lambda pair: pair[0].rate)

    def best_p99(self, side: str) -> float:
        return min(percentile(load.auth_latencies, 99) for _, load in getattr(self, side)) * 1000


def _compare(ours_url: str, base_url: str, clients: int, make_load: Callable[[bool], Load]) -> Pair:
    pair = Pair()
    for _ in range(ROUNDS):
        load = make_load(True)
        pair.ours.append((_drive(ours_url, clients, load), load))
        load = make_load(False)
        pair.base.append((_drive(base_url, clients, load), load))
    return pair


def _check_hot_account(url: str, account_id: str) -> list[str]:
    """Lost updates show as a balance that is not its ledger's sum, a held counter that is not
    the sum of the holds it counts, or holds left open."""
    database = Database.from_url(url, pool_size=1)
    problems: list[str] = []
    try:
        with database.unit_of_work() as session:
            balance = session.execute(
                select(Account.balance_microcents).where(Account.id == account_id)
            ).scalar_one()
            total = session.execute(
                select(func.coalesce(func.sum(LedgerEntry.amount_microcents), 0)).where(
                    LedgerEntry.account_id == account_id
                )
            ).scalar_one()
            open_holds = session.execute(
                select(func.count())
                .select_from(Authorization)
                .where(Authorization.account_id == account_id, Authorization.status == "active")
            ).scalar_one()
            charges = session.execute(
                select(func.count())
                .select_from(LedgerEntry)
                .where(LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge")
            ).scalar_one()
            settled = session.execute(
                select(func.count())
                .select_from(Authorization)
                .where(Authorization.account_id == account_id, Authorization.status == "settled")
            ).scalar_one()
            problems += [m for m in ledger.held_counter_mismatches(session) if account_id in m]
    finally:
        database.dispose()
    if balance != total:
        problems.append(f"balance {balance} != ledger sum {total}")
    if open_holds:
        problems.append(f"{open_holds} holds left active")
    if charges != settled:
        problems.append(f"{charges} charges but {settled} settled holds")
    return problems


def _ratio(ours: float, ceiling: float) -> str:
    return f"{ours / ceiling:.0%} of bare FastAPI ({ceiling:,.1f})" if ceiling else ""


def run() -> list[Result]:
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        fixture = _setup(url)
        workdir = Path(tmp)
        server = ServerProcess(url, workdir / "server", workers=WORKERS)
        baseline = BaselineProcess(url, workdir / "baseline", workers=WORKERS)
        try:
            server.start()
            baseline.start()

            def spread(ours: bool) -> Load:
                if not ours:
                    return Load(lambda c, i: "k")
                return Load(lambda c, i: fixture.secrets[(c * 7 + i) % ACCOUNTS])

            def hot(ours: bool) -> Load:
                secret = fixture.hot_secret if ours else "k"
                return Load(lambda c, i: secret, settle_every=SETTLE_EVERY)

            def hot_voids(ours: bool) -> Load:
                secret = fixture.hot_secret if ours else "k"
                return Load(lambda c, i: secret)

            a = _compare(server.base_url, baseline.base_url, 16, spread)
            b = _compare(server.base_url, baseline.base_url, 4, spread)
            c = _compare(server.base_url, baseline.base_url, 16, hot)
            c_voids = _compare(server.base_url, baseline.base_url, 16, hot_voids)
        finally:
            server.stop()
            baseline.stop()
        lost = _check_hot_account(url, fixture.hot_account)

    results: list[Result] = []
    a_ours, a_load = a.best_rate("ours")
    a_base, _ = a.best_rate("base")
    b_p99, b_base = b.best_p99("ours"), b.best_p99("base")
    c_ours, c_load = c.best_rate("ours")
    c_base, _ = c.best_rate("base")
    c_voids_ours, _ = c_voids.best_rate("ours")
    c_voids_base, _ = c_voids.best_rate("base")
    errors = sum(result.errors for result, _ in a.ours + b.ours + c.ours + c_voids.ours)
    b_p50 = min(percentile(load.auth_latencies, 50) for _, load in b.ours) * 1000
    print(
        f"   (a) statuses {a_load.statuses}; (b) p50 {b_p50:.1f} ms; (c) statuses "
        f"{c_load.statuses}, settled by usage events {sum(load.settled for _, load in c.ours)}; "
        f"hot account books: {lost or 'ok'}"
    )
    results.append(
        Result(
            f"authorizations/s, 16 clients, {ACCOUNTS} accounts, {WORKERS} workers",
            ">= 1000/s",
            a_ours.rate,
            "/s",
            a_ours.rate >= 1000 and errors == 0,
            _ratio(a_ours.rate, a_base.rate),
        )
    )
    results.append(
        Result(
            "authorization p99 latency, 4 clients",
            "<= 10 ms",
            b_p99,
            "ms",
            b_p99 <= 10 and errors == 0,
            f"bare FastAPI p99 {b_base:.1f} ms",
        )
    )
    results.append(
        Result(
            "authorizations/s, 16 clients, one hot account, 0 lost updates",
            ">= 300/s",
            c_ours.rate,
            "/s",
            c_ours.rate >= 300 and errors == 0 and not lost,
            _ratio(c_ours.rate, c_base.rate),
        )
    )
    results.append(
        Result(
            "  the same, every hold voided (no usage events)",
            "-",
            c_voids_ours.rate,
            "/s",
            None,
            _ratio(c_voids_ours.rate, c_voids_base.rate),
        )
    )
    return results
