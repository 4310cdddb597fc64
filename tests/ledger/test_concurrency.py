"""The check-and-hold under concurrency, as deployed: two real uvicorn processes on one PostgreSQL
database, loopback HTTP. Nothing may depend on process memory: whichever process answers, a
balance (or a key's monthly limit) that covers exactly N holds grants exactly N, and at no
instant does anyone see more credit held than exists. Idempotent retries sent at once to both
processes take effect once. (The in-process variant of the retries also runs on SQLite.)"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from bench.loadgen import Connection
from metering.accounts import service as accounts
from metering.catalog import service as catalog
from metering.catalog.schemas import ModelSpec, PriceSpec
from metering.db import Database
from metering.kit.timeutil import floor_day, format_timestamp
from metering.ledger import service as ledger
from metering.models import Account, Authorization, LedgerEntry, UsageRollup
from tests.clocked import FileClock
from tests.conftest import (
    ADMIN_TOKEN,
    GATEWAY_TOKEN,
    NOW,
    SERVER_BACKENDS,
    Api,
    server_database,
)
from tests.factories import GLM_RATES, authorization_request, create_key
from tests.ledger.helpers import expected_estimate, prepaid
from tests.servers import ServerProcess, running_servers

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)  # each request below: 1000 prompt, 100 out
GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

pg_only = pytest.mark.usefixtures("needs_postgresql")


@dataclass
class Cluster:
    url: str
    servers: list[ServerProcess]
    database: Database
    model: str
    # The servers' clock (tests/clocked.py): time moves only when a test moves it.
    clock: FileClock

    def seed(
        self, credit_microcents: int, limit_microcents: int | None = None
    ) -> tuple[str, str, str]:
        """An account with this much credit and one key; (account id, key id, secret)."""
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            account = accounts.create_account(session, "race", "prepaid", now)
            key, secret = accounts.create_api_key(session, account, "k", limit_microcents, now)
            if credit_microcents:
                ledger.add_entry(session, account.id, "grant", credit_microcents, "seed", None, now)
            result = account.id, key.id, secret
            session.commit()
            return result

    def books(self, account_id: str) -> dict[str, int]:
        """What the database says, for the after-the-race checks."""
        with self.database.unit_of_work() as session:
            balance = session.execute(
                select(Account.balance_microcents).where(Account.id == account_id)
            ).scalar_one()
            entries = session.execute(
                select(func.coalesce(func.sum(LedgerEntry.amount_microcents), 0)).where(
                    LedgerEntry.account_id == account_id
                )
            ).scalar_one()
            rows = session.execute(
                select(Authorization.status, Authorization.estimate_microcents).where(
                    Authorization.account_id == account_id
                )
            ).all()
        return {
            "balance": int(balance),
            "ledger": int(entries),
            "holds": len(rows),
            "active": sum(1 for row in rows if row.status == "active"),
            "voided": sum(1 for row in rows if row.status == "voided"),
            "active_sum": sum(
                int(row.estimate_microcents) for row in rows if row.status == "active"
            ),
        }


def _start(tmp: Path, backend: str, ttl: int | None = None) -> Iterator[Cluster]:
    with server_database(backend, tmp) as url:
        database = Database.from_url(url, pool_size=2)
        clock = FileClock(tmp / "clock", NOW)
        now = clock.now()
        model = f"Race-{secrets.token_hex(3)}"
        with database.unit_of_work() as session:
            catalog.put_model(
                session, model, ModelSpec(display_name=model, context_length=8192), now
            )
            catalog.add_price_version(
                session,
                model,
                PriceSpec(
                    effective_at=format_timestamp(now),
                    input_microcents_per_million=GLM_RATES[0],
                    output_microcents_per_million=GLM_RATES[1],
                    cache_read_microcents_per_million=GLM_RATES[2],
                ),
                now,
            )
            session.commit()
        # Small pools: four server processes of this module run at once, on a PostgreSQL whose
        # connection limit other test runs share. A race queues for its connections all the
        # same, so it still contends on the account as much as ever.
        env = {"METERING_DB_POOL_SIZE": "6"}
        if ttl:
            env["METERING_HOLD_TTL_SECONDS"] = str(ttl)
        try:
            with running_servers(url, tmp, 2, extra_env=env, clock=clock) as servers:
                yield Cluster(url, servers, database, model, clock)
        finally:
            database.dispose()


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _start(tmp_path_factory.mktemp("race"), request.param)


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def short_ttl_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Holds that live one second of the servers' clock, which a run moves: they expire in the
    middle of it."""
    yield from _start(tmp_path_factory.mktemp("race-ttl"), request.param, ttl=1)


def _connection(server: ServerProcess, headers: dict[str, str]) -> Connection:
    return Connection("127.0.0.1", server.port, headers)


async def answered(connection: Connection, method: str, path: str, body: Any) -> Any:
    """The answer to a request resent, as a gateway does, while the server says 503
    ``database_unavailable`` (Retry-After: 1, nothing changed): a race of 200 requests on a busy
    machine can outwait a process's wait for one of its pool's connections. Any other answer, or
    a 503 of another kind, is returned as it came; ten such 503s in a row are returned too."""
    for _ in range(10):
        response = await connection.request(method, path, body)
        if response.status != 503 or response.json()["error"]["code"] != "database_unavailable":
            return response
        assert response.headers["retry-after"] == "1", response.headers
        await asyncio.sleep(1)
    return response


@dataclass
class Sampler:
    """Polls GET /v1/credits on every process at once (a loop each) while a race runs, and after
    it until it has ``SAMPLES`` (a race the servers answer in a few group commits can be over
    in 4 samples: each process's loop then answers one while the race's requests queue)."""

    SAMPLES = 5

    secret: str
    samples: list[dict[str, int]] = field(default_factory=list)
    during: int = 0  # samples answered before the race ended

    async def run(self, cluster: Cluster, done: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.secret}"}
        connections = [_connection(server, headers) for server in cluster.servers]

        async def poll(connection: Connection) -> None:
            while not done.is_set() or len(self.samples) < self.SAMPLES:
                response = await connection.request("GET", "/v1/credits")
                assert response.status == 200, response.body
                self.samples.append(response.json())
                self.during += not done.is_set()

        try:
            await asyncio.gather(*(poll(connection) for connection in connections))
        finally:
            for connection in connections:
                await connection.close()

    def check(self, balance: int, cap: int | None = None) -> None:
        assert self.during >= 2, "the sampler did not run during the race"
        assert len(self.samples) >= self.SAMPLES
        for sample in self.samples:
            assert sample["available_microcents"] >= 0, sample
            assert sample["balance_microcents"] == balance, sample
            assert sample["held_microcents"] <= (balance if cap is None else cap), sample


async def _race(cluster: Cluster, secret: str, count: int, sampler: Sampler) -> list[int]:
    """``count`` authorizations at once, spread over both processes; their statuses."""
    connections = [_connection(cluster.servers[i % 2], GATEWAY) for i in range(count)]
    for connection in connections:
        await connection.request("GET", "/healthz")  # connected before the start line
    done = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(cluster, done))
    await asyncio.sleep(0.05)
    body = {
        "api_key": secret,
        "model": cluster.model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "max_tokens": 100,
    }
    try:
        responses = await asyncio.gather(
            *(
                answered(c, "POST", "/v1/authorizations", {**body, "request_id": f"race-{i}"})
                for i, c in enumerate(connections)
            )
        )
    finally:
        await asyncio.sleep(0.05)
        done.set()
        await sampling
        for connection in connections:
            await connection.close()
    for response in responses:
        assert response.status in (200, 402), response.body
    return [r.status if r.status == 200 else _code(r.json()) for r in responses]


def _code(body: dict[str, Any]) -> Any:
    return body["error"]["code"]


@pg_only
def test_a_balance_covering_exactly_100_grants_exactly_100(cluster: Cluster) -> None:
    account, _key, secret = cluster.seed(100 * ESTIMATE)
    sampler = Sampler(secret)
    outcomes = asyncio.run(_race(cluster, secret, 200, sampler))
    assert outcomes.count(200) == 100
    assert outcomes.count("insufficient_credits") == 100
    sampler.check(balance=100 * ESTIMATE)
    books = cluster.books(account)
    assert books["balance"] == books["ledger"] == 100 * ESTIMATE
    assert (books["holds"], books["active"], books["active_sum"]) == (100, 100, 100 * ESTIMATE)


@pg_only
def test_a_monthly_limit_covering_exactly_100_grants_exactly_100(cluster: Cluster) -> None:
    spent = 123_457
    account, key_id, secret = cluster.seed(10**12, limit_microcents=spent + 100 * ESTIMATE)
    with cluster.database.unit_of_work() as session:
        session.execute(
            insert(UsageRollup).values(
                account_id=account,
                bucket_width="1d",
                grouping="key",
                bucket_start=floor_day(cluster.clock.now()),
                api_key_id=key_id,
                model_id="",
                requests=1,
                input_tokens=0,
                cache_read_tokens=0,
                output_tokens=0,
                reasoning_tokens=0,
                cost_microcents=spent,
                last_event_id=0,
            )
        )
        session.commit()
    sampler = Sampler(secret)
    outcomes = asyncio.run(_race(cluster, secret, 200, sampler))
    assert outcomes.count(200) == 100
    assert outcomes.count("member_spend_limit") == 100
    sampler.check(balance=10**12, cap=100 * ESTIMATE)
    books = cluster.books(account)
    assert (books["active"], books["active_sum"]) == (100, 100 * ESTIMATE)


async def _churn(
    cluster: Cluster,
    secret: str,
    clients: int,
    enough: Callable[[dict[str, int]], bool],
    sampler: Sampler,
    deadline: float = 60.0,
) -> dict[str, int]:
    """Clients authorize until ``enough(counts)`` (or ``deadline`` seconds, whichever comes
    first: the caller asserts what it needed); each hold is voided at once, or left to expire:
    every fifth hold granted moves the servers' clock on a quarter of a second."""
    counts = {"granted": 0, "refused": 0, "voided": 0}
    stop_at = time.monotonic() + deadline
    rng = random.Random(7)

    async def client(index: int) -> None:
        connection = _connection(cluster.servers[index % 2], GATEWAY)
        try:
            while time.monotonic() < stop_at and not enough(counts):
                body = {
                    "api_key": secret,
                    "request_id": secrets.token_hex(8),
                    "model": cluster.model,
                    "api": "chat_completions",
                    "prompt_tokens": 1000,
                    "max_tokens": 100,
                }
                response = await connection.request("POST", "/v1/authorizations", body)
                if response.status == 402:
                    counts["refused"] += 1
                    await asyncio.sleep(0.01)
                    continue
                assert response.status == 200, response.body
                counts["granted"] += 1
                if counts["granted"] % 5 == 0:
                    cluster.clock.advance(seconds=0.25)
                if rng.random() < 0.5:
                    hold = response.json()
                    voided = await connection.request("DELETE", f"/v1/authorizations/{hold['id']}")
                    assert voided.status == 200, voided.body
                    # Another client may have moved the clock past the hold's expiry meanwhile:
                    # then the hold is answered as it stands, expired, not voided.
                    status = voided.json()["status"]
                    assert status in ("voided", "expired"), voided.body
                    counts["voided"] += status == "voided"
        finally:
            await connection.close()

    done = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(cluster, done))
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        done.set()
        await sampling
    return counts


@pg_only
@pytest.mark.parametrize("constraint", ["credits", "monthly_limit"])
def test_voids_and_expiries_interleaved(short_ttl_cluster: Cluster, constraint: str) -> None:
    cluster = short_ttl_cluster
    capacity = 10 * ESTIMATE
    if constraint == "credits":
        account, _key, secret = cluster.seed(capacity)
        balance = capacity
    else:
        account, _key, secret = cluster.seed(10**12, limit_microcents=capacity)
        balance = 10**12
    sampler = Sampler(secret)

    def enough(counts: dict[str, int]) -> bool:
        # Voids and expiries freed capacity that was granted again, many times over: more
        # holds left to expire than the capacity holds twice means at least 10 expired mid-run.
        left_to_expire = counts["granted"] - counts["voided"]
        return counts["granted"] > 3 * 10 and left_to_expire > 2 * 10 and counts["refused"] > 0

    counts = asyncio.run(_churn(cluster, secret, 24, enough, sampler))
    assert enough(counts), counts
    sampler.check(balance=balance, cap=capacity)
    books = cluster.books(account)
    assert books["balance"] == books["ledger"] == balance
    assert books["holds"] == counts["granted"]
    assert books["voided"] == counts["voided"]
    # Every hold left expires one second after it was placed: a second later, none is held.
    secret_header = {"Authorization": f"Bearer {secret}"}
    credits = json.loads(_get(cluster, "/v1/credits", secret_header))
    assert credits["held_microcents"] <= capacity, credits
    cluster.clock.advance(seconds=1)
    credits = json.loads(_get(cluster, "/v1/credits", secret_header))
    assert (credits["held_microcents"], credits["available_microcents"]) == (0, balance)
    expired = json.loads(
        _get(
            cluster,
            f"/admin/v1/authorizations?status=expired&account_id={account}&limit=1000",
            ADMIN,
        )
    )
    assert len(expired["data"]) == counts["granted"] - counts["voided"]


def _get(cluster: Cluster, path: str, headers: dict[str, str]) -> bytes:
    async def fetch() -> bytes:
        connection = _connection(cluster.servers[1], headers)
        try:
            response = await connection.request("GET", path)
            assert response.status == 200, response.body
            return response.body
        finally:
            await connection.close()

    return asyncio.run(fetch())


@pg_only
def test_ten_identical_authorizations_at_once_hold_once(cluster: Cluster) -> None:
    account, _key, secret = cluster.seed(10**9)
    body = {
        "api_key": secret,
        "request_id": "retried",
        "model": cluster.model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "max_tokens": 100,
    }

    async def burst() -> list[Any]:
        connections = [_connection(cluster.servers[i % 2], GATEWAY) for i in range(10)]
        for connection in connections:
            await connection.request("GET", "/healthz")
        try:
            return list(
                await asyncio.gather(
                    *(c.request("POST", "/v1/authorizations", body) for c in connections)
                )
            )
        finally:
            for connection in connections:
                await connection.close()

    responses = asyncio.run(burst())
    assert [r.status for r in responses] == [200] * 10
    assert len({r.json()["id"] for r in responses}) == 1
    books = cluster.books(account)
    assert (books["holds"], books["active_sum"]) == (1, ESTIMATE)


@pg_only
@pytest.mark.parametrize("kind", ["grants", "adjustments"])
def test_ten_identical_ledger_entries_at_once_count_once(cluster: Cluster, kind: str) -> None:
    account, _key, _secret = cluster.seed(0)
    body: dict[str, Any] = {"amount_cents": 12.5, "idempotency_key": "retried"}
    body["note" if kind == "grants" else "reason"] = "once"

    async def burst() -> list[Any]:
        connections = [_connection(cluster.servers[i % 2], ADMIN) for i in range(10)]
        for connection in connections:
            await connection.request("GET", "/healthz")
        try:
            return list(
                await asyncio.gather(
                    *(
                        c.request("POST", f"/admin/v1/accounts/{account}/{kind}", body)
                        for c in connections
                    )
                )
            )
        finally:
            for connection in connections:
                await connection.close()

    responses = asyncio.run(burst())
    assert sorted(r.status for r in responses) == [200] * 9 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    books = cluster.books(account)
    assert books["balance"] == books["ledger"] == 12_500_000


def test_concurrent_retries_in_process(api: Api) -> None:
    """The same retries through threads against the app in this process, on each backend."""
    setup = prepaid(api, 1)
    body = authorization_request(setup.key, setup.model, request_id="threads")
    grant_body = {"amount_cents": 3, "idempotency_key": "threads"}
    barrier = threading.Barrier(10)

    def authorize_once(_: int) -> Any:
        barrier.wait()
        return api.gateway("POST", "/v1/authorizations", json=body)

    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(authorize_once, range(10)))
    assert [r.status_code for r in responses] == [200] * 10
    assert len({r.json()["id"] for r in responses}) == 1

    def grant_once(_: int) -> Any:
        barrier.wait()
        return api.admin("POST", f"/admin/v1/accounts/{setup.account}/grants", json=grant_body)

    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(grant_once, range(10)))
    assert sorted(r.status_code for r in responses) == [200] * 9 + [201]
    other = create_key(api, setup.account)
    credits = api.as_key(other.secret, "GET", "/v1/credits").json()
    assert credits["balance_microcents"] == 4_000_000
    assert credits["held_microcents"] == ESTIMATE
