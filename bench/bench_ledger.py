"""Pre-flight authorizations over loopback HTTP against PostgreSQL (issue 3's benchmark).

(a) throughput, 16 clients over 100 accounts; (b) p99 latency of an authorization, 4 clients;
(c) throughput, 16 clients on one hot account; (e) (a) again over 100 other accounts whose
keys each belong to a project and a member, with a spend limit on all three (each its own
window), so the project's, the member's and the key's checks all run on every authorization
(on a checkout from before projects, its keys have their own limit: the one check it has).
Every client releases each hold it gets before its
next request (DELETE, as a gateway does for a request rejected before generation; in (c) every
fourth is settled by a usage event instead, so the hot account's balance moves under the same
row lock), so each run measures a steady state. An operation is one authorization plus its
release; the rate counts operations, the latency is the authorization's.

Every answer is checked: an authorization must be 200 with ``status: active``, a void 200 with
``status: voided``, a settling event 200 with ``recorded: 1`` (and nothing quarantined);
anything else is an error, and a figure with any error is not met. After each of our rounds the
database must hold exactly what was answered (per status, the holds of the round's request ids;
one usage event per settlement), ``metering verify`` must pass (balances = ledger sums, held
counters = the holds they count, aggregates = their events), and every account's balance must
be its grants less the settlements the harness counted, each at the price oracle's charge
(``tests/oracle.py``), with nothing held: a lost update shows there whatever ``verify`` says.
Before (e), each of its keys has spent something (a usage event: the limits' windows are not
empty), and three authorizations per key, each estimated beyond one more of the key's, the
member's and the project's limit, must be refused by that limit: 402 with its ``limit_scope``.

The same loads are driven at ``bench.baseline_app`` (FastAPI endpoints of the same shape doing
no work) with the same number of workers, alternating with ours for ``ROUNDS`` rounds; each
figure is the median of its rounds, and our median is also printed as a share of the ceiling's.

The machine has two cores shared by the load generator, the server and PostgreSQL, so the
server runs ``WORKERS`` uvicorn workers (2: one per core; more only adds context switches).

Run: ``python -m bench ledger`` (or ``make bench``).
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    median,
    percentile,
    rounds_label,
)
from bench.loadgen import Connection, LoadResult, expect, run_load
from tests import oracle

MODEL = "Bench-GLM"
GLM_RATES = (22_000_000, 339_000_000, 17_750_000)  # microcents per million tokens
GRANT_CENTS = 10**9  # ten million dollars: (a) and (b) never run out
SETTLE_EVERY = 4  # in (c), every 4th hold is settled by a usage event, the rest voided
SETTLE_USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}  # a settling event's
SETTLE_CHARGE = oracle.event_charge(
    {"api": "chat_completions", "usage": SETTLE_USAGE}, GLM_RATES
).total_microcents
# (e)'s limits, in cents, each over its own window: far above what the load keeps held (an
# authorization's estimate is about 0.11 cents), below what one authorization can ask for.
LAYER_LIMITS = {"key": (10, "day"), "member": (20, "week"), "project": (30, "month")}
# max_tokens of an authorization (1 prompt token) that one scope's limit refuses and the
# earlier ones admit: 40,000 output tokens at 339 µ¢ each is 13.56 cents, beyond the key's
# 10; 70,000 is 23.73, beyond the member's 20; 100,000 is 33.9, beyond the project's 30.
LAYER_PROBES = (
    (40_000, "member_spend_limit", "key"),
    (70_000, "member_spend_limit", "member"),
    (100_000, "project_spend_limit", "project"),
)


@dataclass
class Config:
    """What a run does; the defaults are ``make bench``'s (a test runs it small)."""

    seconds: float = float(os.environ.get("BENCH_LEDGER_SECONDS", "5"))
    warmup: float = 1.0
    rounds: int = common.ROUNDS
    workers: int = int(os.environ.get("BENCH_LEDGER_WORKERS", "2"))
    accounts: int = 100
    spread_clients: int = 16
    latency_clients: int = 4
    hot_clients: int = 16
    code: CodeUnderTest = field(default_factory=CodeUnderTest)
    # Called with the database URL after each of our rounds, before it is checked (tests break
    # the books with it, to show the figure is then not met); and after the setup, before (e)'s
    # limits are probed (tests lift a limit with it).
    after_round: Callable[[str], None] | None = None
    after_setup: Callable[[str], None] | None = None


@dataclass
class Fixture:
    secrets: list[str]  # one key per account
    hot_secret: str
    full_secret: str | None  # an account at its concurrency limit: every request is a 429
    books: Books  # every account but the full one (its one hold stays)
    layered: list[str]  # one key per account of (e), limited by its project, member and itself
    # False on code without projects: (e)'s keys then have their own limit only, the one spend
    # limit such code has (so (e) is "every spend-limit check the checkout has" on both sides)
    layers: bool
    layer_problems: list[str]  # the limits' refusals that were not as set
    charged: Counter[str] = field(default_factory=Counter)  # by key id, over every round


# Every account's limit on requests in flight: far above what the clients keep in flight.
CONCURRENCY = 1000


def _setup(config: Config, url: str, base_url: str, workdir: Path) -> Fixture:
    """A priced model (``metering catalog import``), accounts with a key and three grants each
    (one promotional expiring, two paid; admin API): as an operator sets them up."""
    config.code.import_catalog(url, workdir, catalog_file(workdir, [MODEL], GLM_RATES))
    keys: list[str] = []
    books = Books()
    with Admin(base_url) as admin:
        limits = True
        for index in range(config.accounts + 1):
            account = admin.account(f"bench-{index}")
            key_id, secret = admin.key(account)
            admin.three_grants(account, GRANT_CENTS)
            books.open(account, GRANT_CENTS, [(key_id, secret)])
            limits = admin.access_rules(account, [MODEL], CONCURRENCY) and limits
            keys.append(secret)
        full = None
        if limits:
            account = admin.account("bench-full")
            _key_id, full = admin.key(account)
            admin.grant(account, GRANT_CENTS)
            admin.access_rules(account, [MODEL], 1)
        if full is not None:
            # Its one request in flight, for the whole run. Not checked here: a hold that did
            # not go through (a gateway token that no longer matches) leaves the account below
            # its limit, and the case reports the answers that are not 429 as problems.
            admin.client.post(
                "/v1/authorizations",
                headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
                json={
                    "api_key": full,
                    "model": MODEL,
                    "api": "chat_completions",
                    "prompt_tokens": 1,
                    "max_tokens": 1,
                    "hold_ttl_seconds": 604800,
                },
            )
        layered, layers, charged, problems = _setup_layers(config, admin, books)
        if config.after_setup:
            config.after_setup(url)
        problems += _probe_layers(admin, layered) if layers else []
    fixture = Fixture(
        keys[: config.accounts], keys[config.accounts], full, books, layered, layers, problems
    )
    fixture.charged.update(charged)
    return fixture


def layered_account(admin: Admin, name: str, layers: bool) -> tuple[str, str, str, bool]:
    """One of (e)'s accounts, set up as (a)'s (three grants, access rules), its key of a new
    project and a new member with the three limits of ``LAYER_LIMITS`` (with ``layers`` False,
    or on code without projects: the key's own limit alone): (the account, the key's id, its
    secret, whether the key has all three)."""
    account = admin.account(name)
    key = admin.layered_key(account, LAYER_LIMITS) if layers else None
    key_id, secret = key or admin.key(account, LAYER_LIMITS["key"])
    admin.three_grants(account, GRANT_CENTS)
    admin.access_rules(account, [MODEL], CONCURRENCY)
    return account, key_id, secret, key is not None


def spend_once(admin: Admin, key_id: str) -> str | None:
    """The key spends once, now (one usage event, at the oracle's ``SETTLE_CHARGE``), so its
    limits' windows are not empty; a spend the service refuses (a gateway token that no longer
    matches) is a problem, returned."""
    response = admin.client.post(
        "/v1/usage/events",
        headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
        json={
            "events": [
                {
                    "request_id": f"layered-spent-{key_id}",
                    "api_key_id": key_id,
                    "model": MODEL,
                    "api": "chat_completions",
                    "usage": SETTLE_USAGE,
                    "occurred_at": format_timestamp(datetime.now(UTC)),
                    "outcome": "completed",
                }
            ]
        },
    )
    if response.status_code == 200 and response.json().get("recorded") == 1:
        return None
    return f"setup: usage event {response.status_code} {response.text[:160]}"


def _setup_layers(
    config: Config, admin: Admin, books: Books
) -> tuple[list[str], bool, Counter[str], list[str]]:
    """(e)'s accounts (``layered_account``), each key then spending once (``spend_once``)."""
    secrets_: list[str] = []
    charged: Counter[str] = Counter()
    problems: list[str] = []
    layers = True
    for index in range(config.accounts):
        account, key_id, secret, layers = layered_account(admin, f"bench-layered-{index}", layers)
        books.open(account, GRANT_CENTS, [(key_id, secret)])
        problem = spend_once(admin, key_id)
        if problem is None:
            charged[key_id] += SETTLE_CHARGE
        else:
            problems.append(problem)
        secrets_.append(secret)
    return secrets_, layers, charged, problems[:3]


def _probe_layers(admin: Admin, secrets_: list[str]) -> list[str]:
    """Each key's three limits refuse what they must, the key's own first: an authorization
    beyond one more limit is refused by it (402, its code and limit_scope)."""
    problems = []
    for secret in secrets_:
        for max_tokens, code, scope in LAYER_PROBES:
            response = admin.client.post(
                "/v1/authorizations",
                headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
                json={
                    "api_key": secret,
                    "model": MODEL,
                    "api": "chat_completions",
                    "prompt_tokens": 1,
                    "max_tokens": max_tokens,
                },
            )
            error = response.json().get("error", {}) if response.status_code == 402 else {}
            if (error.get("code"), error.get("limit_scope")) != (code, scope):
                problems.append(
                    f"limit probe of {max_tokens} tokens: {response.status_code} "
                    f"{response.text[:160]}, expected 402 {code} ({scope})"
                )
    return problems[:3] + ([f"... {len(problems) - 3} more"] if len(problems) > 3 else [])


@dataclass
class Load:
    """One client loop: authorize, then release the hold (void it, or settle every
    ``settle_every``-th by a usage event); counts what each step answered."""

    secret_of: Callable[[int, int], str]
    settle_every: int = 0
    # Requests whose key is this one are expected to be refused with 429 (nothing to release).
    refused_secret: str | None = None
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    granted: int = 0
    voided: int = 0
    settled: int = 0
    refused: int = 0
    charged: Counter[str] = field(default_factory=Counter)  # by key id: the oracle's charges

    async def __call__(self, connection: Connection, client: int, iteration: int) -> float:
        request_id = f"{self.run_id}-{client}-{iteration}"
        secret = self.secret_of(client, iteration)
        started = time.perf_counter()
        response = await connection.request(
            "POST",
            "/v1/authorizations",
            {
                "api_key": secret,
                "request_id": request_id,
                "model": MODEL,
                "api": "chat_completions",
                "prompt_tokens": 1000,
                "max_tokens": 256,
            },
        )
        latency = time.perf_counter() - started
        if secret == self.refused_secret:
            expect(response, 429, "refused authorization")
            self.refused += 1
            return latency
        hold = expect(response, 200, "authorization", status="active", request_id=request_id)
        self.granted += 1
        if self.settle_every and iteration % self.settle_every == 0:
            await self._settle(connection, hold, request_id)
            self.settled += 1
            self.charged[hold["api_key_id"]] += SETTLE_CHARGE
        else:
            response = await connection.request("DELETE", f"/v1/authorizations/{hold['id']}")
            expect(response, 200, "void", id=hold["id"], status="voided")
            self.voided += 1
        return latency

    async def _settle(self, connection: Connection, hold: dict[str, Any], request_id: str) -> None:
        event = {
            "request_id": request_id,
            "api_key_id": hold["api_key_id"],
            "model": MODEL,
            "api": "chat_completions",
            "usage": SETTLE_USAGE,
            "occurred_at": format_timestamp(datetime.now(UTC)),
            "outcome": "completed",
            "authorization_id": hold["id"],
        }
        response = await connection.request("POST", "/v1/usage/events", {"events": [event]})
        expect(response, 200, "settling event", recorded=1, quarantined=0, duplicates=0)


@dataclass
class Round:
    result: LoadResult
    load: Load
    problems: list[str]


@dataclass
class Pair:
    """Our rounds and the ceiling's for one load, alternated."""

    ours: list[Round] = field(default_factory=list)
    base: list[Round] = field(default_factory=list)

    def problems(self) -> tuple[str, ...]:
        return tuple(p for r in self.ours + self.base for p in r.problems)

    def rates(self, side: str) -> list[float]:
        return [r.result.rate for r in getattr(self, side)]

    def p(self, side: str, pct: float) -> list[float]:
        return [
            percentile(r.result.latencies, pct) * 1000
            for r in getattr(self, side)
            if r.result.latencies
        ]


def _check_round(
    config: Config, url: str, workdir: Path, round_: Round, fixture: Fixture, base_url: str
) -> list[str]:
    """What the database holds for the round equals what the server answered, the books
    reconcile, and every balance is what the harness counted."""
    load = round_.load
    problems = round_.result.problems("ours")
    if config.after_round:
        config.after_round(url)
    with psycopg.connect(common.libpq_url(url)) as connection:
        rows = connection.execute(
            "SELECT status, count(*) FROM authorizations WHERE request_id LIKE %s GROUP BY 1",
            (f"{load.run_id}-%",),
        ).fetchall()
        events = connection.execute(
            "SELECT count(*) FROM usage_events WHERE request_id LIKE %s", (f"{load.run_id}-%",)
        ).fetchone()
    stored = {status: int(count) for status, count in rows}
    answered = {"voided": load.voided, "settled": load.settled}
    if stored != {k: v for k, v in answered.items() if v}:
        problems.append(f"holds stored {stored}, but the answers were {answered}")
    if events is None or int(events[0]) != load.settled:
        problems.append(f"{events and events[0]} usage events stored for {load.settled} settled")
    problems += config.code.verify(url, workdir)
    fixture.charged.update(load.charged)
    return problems + fixture.books.problems(base_url, fixture.charged)


def _compare(
    config: Config,
    url: str,
    workdir: Path,
    urls: tuple[str, str],
    clients: int,
    make_load: Callable[[bool], Load],
    fixture: Fixture,
) -> Pair:
    pair = Pair()
    for _ in range(config.rounds):
        for ours in (True, False):
            load = make_load(ours)
            result = run_load(
                urls[0] if ours else urls[1],
                clients,
                config.seconds,
                load,
                headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
                warmup=config.warmup,
            )
            round_ = Round(result, load, [])
            if ours:
                round_.problems = _check_round(config, url, workdir, round_, fixture, urls[0])
                pair.ours.append(round_)
            else:
                round_.problems = result.problems("bare FastAPI")
                pair.base.append(round_)
    return pair


def _ratio(ours: float, ceiling: float) -> str:
    return f"{ours / ceiling:.0%} of bare FastAPI ({ceiling:,.1f})" if ceiling else ""


def run(config: Config | None = None) -> list[Result]:
    config = config or Config()
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        config.code.migrate(url, workdir / "cli")
        server = config.code.server(url, workdir / "server", config.workers)
        baseline = common.baseline_server(workdir / "baseline", config.workers)
        try:
            server.start()
            baseline.start()
            fixture = _setup(config, url, server.base_url, workdir / "cli")
            accounts = config.accounts

            def spread(ours: bool) -> Load:
                if not ours:
                    return Load(lambda c, i: "k")
                return Load(lambda c, i: fixture.secrets[(c * 7 + i) % accounts])

            def hot(ours: bool) -> Load:
                secret = fixture.hot_secret if ours else "k"
                return Load(lambda c, i: secret, settle_every=SETTLE_EVERY)

            def hot_voids(ours: bool) -> Load:
                secret = fixture.hot_secret if ours else "k"
                return Load(lambda c, i: secret)

            def half_refused(ours: bool) -> Load:
                """Every other request to the account at its limit (429), the rest spread."""
                full = fixture.full_secret if ours else None
                if full is None:
                    return spread(ours)
                return Load(
                    lambda c, i: full if i % 2 else fixture.secrets[(c * 7 + i) % accounts],
                    refused_secret=full,
                )

            urls = (server.base_url, baseline.base_url)
            cli = workdir / "cli"
            a = _compare(config, url, cli, urls, config.spread_clients, spread, fixture)
            b = _compare(config, url, cli, urls, config.latency_clients, spread, fixture)
            c = _compare(config, url, cli, urls, config.hot_clients, hot, fixture)
            c_voids = _compare(config, url, cli, urls, config.hot_clients, hot_voids, fixture)
            refused = _compare(config, url, cli, urls, config.spread_clients, half_refused, fixture)

            def layered(ours: bool) -> Load:
                if not ours:
                    return Load(lambda c, i: "k")
                return Load(lambda c, i: fixture.layered[(c * 7 + i) % accounts])

            e = _compare(config, url, cli, urls, config.spread_clients, layered, fixture)
        finally:
            server.stop()
            baseline.stop()

    settled = sum(r.load.settled for r in c.ours)
    b_p50 = median(b.p("ours", 50))
    print(
        f"   (a) rates {[round(x) for x in a.rates('ours')]}/s; (b) p50 {b_p50:.1f} ms, "
        f"p99 {[round(x, 1) for x in b.p('ours', 99)]} ms; (c) rates "
        f"{[round(x) for x in c.rates('ours')]}/s, settled by usage events {settled}"
    )
    a_ours, a_base = median(a.rates("ours")), median(a.rates("base"))
    r_ours, r_base = median(refused.rates("ours")), median(refused.rates("base"))
    refusals = sum(r.load.refused for r in refused.ours)
    print(
        f"   (d) half refused with 429: rates {[round(x) for x in refused.rates('ours')]}/s, "
        f"refused {refusals}"
    )
    e_ours, e_base = median(e.rates("ours")), median(e.rates("base"))
    print(
        f"   (e) project, member and key limits: rates {[round(x) for x in e.rates('ours')]}/s, "
        + (
            f"{e_ours / a_ours:.0%} of (a)'s"
            if fixture.layers and a_ours
            else "no projects in this checkout: keys with their own limit only"
        )
    )
    for pair in (a, b, c, c_voids, refused, e):
        for problem in pair.problems():
            print(f"   PROBLEM {problem}")
    for problem in fixture.layer_problems:
        print(f"   PROBLEM {problem}")
    label = rounds_label(config.rounds)
    b_p99, b_base = median(b.p("ours", 99)), median(b.p("base", 99))
    c_ours, c_base = median(c.rates("ours")), median(c.rates("base"))
    v_ours, v_base = median(c_voids.rates("ours")), median(c_voids.rates("base"))
    return [
        Result(
            "ledger.spread",
            f"authorizations/s, {config.spread_clients} clients, {accounts} accounts "
            f"(three grants each: one promotional expiring, two paid), {config.workers} workers",
            ">= 1000/s",
            a_ours,
            "/s",
            a_ours >= 1000,
            label,
            _ratio(a_ours, a_base),
            a_base,
            problems=a.problems(),
        ),
        Result(
            "ledger.p99",
            f"authorization p99 latency, {config.latency_clients} clients (p50 {b_p50:.1f} ms)",
            "<= 10 ms",
            b_p99,
            "ms",
            b_p99 <= 10,
            label,
            f"bare FastAPI p99 {b_base:.1f} ms",
            b_base,
            higher_is_better=False,
            problems=b.problems(),
        ),
        Result(
            "ledger.hot",
            f"authorizations/s, {config.hot_clients} clients, one hot account, 0 lost updates "
            "(its balance = grants - settlements x the oracle's charge)",
            ">= 300/s",
            c_ours,
            "/s",
            c_ours >= 300,
            label,
            _ratio(c_ours, c_base),
            c_base,
            problems=c.problems(),
        ),
        Result(
            "ledger.hot_voids",
            "  the same, every hold voided (no usage events)",
            "-",
            v_ours,
            "/s",
            None,
            label,
            _ratio(v_ours, v_base),
            v_base,
            problems=c_voids.problems(),
        ),
        Result(
            "ledger.half_refused",
            f"authorizations/s, {config.spread_clients} clients, every other one refused "
            "with 429 (an account at its concurrency limit)",
            "-",
            r_ours,
            "/s",
            None,
            label,
            _ratio(r_ours, r_base),
            r_base,
            problems=refused.problems(),
        ),
        Result(
            "ledger.layered",
            f"authorizations/s, {config.spread_clients} clients, {accounts} other accounts, "
            "each key limited by its project, its member and itself (three checks each)",
            "-",
            e_ours,
            "/s",
            None,
            label,
            _ratio(e_ours, e_base),
            e_base,
            problems=e.problems() + tuple(fixture.layer_problems),
        ),
    ]
