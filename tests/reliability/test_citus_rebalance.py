"""A worker added to a Citus cluster and the shards rebalanced onto it while the gateway's traffic
runs (docs/citus.md#adding-a-worker-online): nothing lost, nothing counted twice.

A database of its own on the cluster (``make citus``) and on its spare node, migrated with
``metering migrate``; two real server processes, one connected to the coordinator alone and one to
every node (each call sent to the node its process last read holds the account:
docs/citus.md#connections-to-every-node; a shard moved meanwhile is reached through the node it
left); many prepaid accounts. Load threads, half on each server, send what a gateway sends
(authorizations, then a void, a settling usage event or nothing; single usage events; batches over
several accounts), each request retried up to three times with the same ``request_id`` (or the same
hold id) after a 5xx, a connection error or a timeout, as a gateway does. Meanwhile the spare node
is registered (``citus_add_node``) and the shards rebalanced (``metering.citus.REBALANCE``: logical
replication, the shards taking writes while they are copied; no node committing asynchronously,
``ASYNCHRONOUS_COMMITS``), and the test waits for the end (``citus_rebalance_wait``). Afterwards
some of the accounts' shards are on the new node, and every account's charges, balance and held sum
equal what the client saw accepted, summed here from the rates (not from the service's answers);
every accepted event stands once, no other; ``metering verify`` is clean."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from metering.citus import ASYNCHRONOUS_COMMITS, REBALANCE
from tests import oracle
from tests.conftest import (
    ADMIN_TOKEN,
    CITUS,
    CITUS_SPARE_URL,
    GATEWAY_TOKEN,
    SECRET_KEY,
    fresh_citus_database,
)
from tests.factories import chat_usage
from tests.servers import ServerProcess

GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "Rebalance-1"
# Microcents per token: input, output, cache reads (the catalog's rates per million tokens are
# these times a million), so every charge and estimate is exact.
IN, OUT, CACHED = 3, 7, 1
RATES = oracle.Rates(IN * 1_000_000, OUT * 1_000_000, CACHED * 1_000_000)
ACCOUNTS = 40
GRANT_CENTS = 10_000_000
THREADS = 6
SHARDS = 6  # three shard groups on each worker; the rebalance moves two onto the new one
RETRIES = 3


def execute(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            result = connection.execute(text(sql), params)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def cli(url: str, workdir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """A ``metering`` command, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": url,
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_DATA_DIR": str(workdir),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "metering.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


class GaveUp(Exception):
    """A request failed four times in a row (the first try and three retries)."""


@dataclass
class Gateway:
    """What a gateway does with a failed request: the same request again, up to three times."""

    base_url: str
    retried: Counter[str] = field(default_factory=Counter)  # why a try failed

    def send(self, client: httpx.Client, method: str, path: str, body: Any = None) -> Any:
        """The response (below 500) and how many tries it took."""
        for attempt in range(1 + RETRIES):
            try:
                response = client.request(method, path, json=body, headers=GATEWAY)
            except httpx.TransportError as exc:  # refused, reset, timed out
                self.retried[type(exc).__name__] += 1
                continue
            if response.status_code >= 500:
                self.retried[f"{response.status_code} {response.text[:200]}"] += 1
                continue
            return response, attempt + 1
        raise GaveUp(f"{method} {path}: {RETRIES} retries failed ({dict(self.retried)})")


@dataclass
class Seen:
    """What the client saw accepted, per account (the independent record)."""

    charges: Counter[str] = field(default_factory=Counter)  # account -> µ¢
    events: dict[str, str] = field(default_factory=dict)  # request id -> account
    holds: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> account, estimate
    closed: set[str] = field(default_factory=set)  # holds voided or settled
    requests: int = 0
    during_move: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # When (time.monotonic()) each request id or hold was acknowledged and how: for the report
    # of a failure.
    when: dict[str, str] = field(default_factory=dict)


def charge(usage: dict[str, Any]) -> int:
    """What a chat completion's ``usage`` costs at the model's rates, by the tests' oracle."""
    tokens = oracle.tokens_of("chat_completions", usage)
    return oracle.charge(tokens, RATES).total_microcents


def test_rebalancing_onto_a_new_worker_under_load_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with fresh_citus_database(shard_count=SHARDS, spare=True) as url:
        migrated = cli(url, tmp_path, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        import_catalog(url, tmp_path)
        servers = [ServerProcess(url, tmp_path / "server").start()]
        try:
            # The URL naming the three nodes registered at the start, as an operator's does.
            servers.append(ServerProcess(every_node_url(url), tmp_path / "every-node").start())
            run_under_load(url, servers, tmp_path)
        finally:
            for server in servers:
                server.stop()


def node_ports(url: str) -> list[int]:
    """The ports of the cluster's nodes, the coordinator's first (the lowest, locally)."""
    return [port for (port,) in execute(url, "SELECT nodeport FROM pg_dist_node ORDER BY 1")]


def every_node_url(url: str, application_name: str | None = None) -> str:
    """The URL an operator configures: ``url``'s database on every node the cluster has as a
    ``host`` (the coordinator first), spread at random; ``application_name``, if given, names
    its connections in the nodes' ``pg_stat_activity``."""
    coordinator = make_url(url)
    ports = node_ports(url)
    assert coordinator.port == ports[0], ports
    hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
    named = f"&application_name={application_name}" if application_name else ""
    return (
        f"postgresql+psycopg://{coordinator.username}@/{coordinator.database}?{hosts}"
        f"&load_balance_hosts=random{named}"
    )


def import_catalog(url: str, workdir: Path) -> None:
    """The test's model and its exact rates, imported as an operator does (``catalog import``)."""
    catalog = workdir / "catalog.json"
    catalog.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "id": MODEL,
                        "display_name": MODEL,
                        "context_length": 131072,
                        "prices": [
                            {
                                "effective_at": "2026-01-01T00:00:00Z",
                                "input_microcents_per_million": IN * 1_000_000,
                                "output_microcents_per_million": OUT * 1_000_000,
                                "cache_read_microcents_per_million": CACHED * 1_000_000,
                            }
                        ],
                    }
                ]
            }
        )
    )
    imported = cli(url, workdir, "catalog", "import", str(catalog))
    assert imported.returncode == 0, imported.stderr


def seed_accounts(
    base_url: str, count: int, grant_cents: int
) -> tuple[dict[str, str], dict[str, str]]:
    """``count`` prepaid accounts, each granted ``grant_cents`` and given an API key, made over
    HTTP as an operator does: each account's key id and key secret, by account id."""
    keys: dict[str, str] = {}
    secrets_: dict[str, str] = {}
    with httpx.Client(base_url=base_url, headers=ADMIN, timeout=30) as admin:
        for number in range(count):
            made = admin.post(
                "/admin/v1/accounts", json={"name": f"acct-{number}", "billing": "prepaid"}
            )
            assert made.status_code == 201, made.text
            account = made.json()["id"]
            granted = admin.post(
                f"/admin/v1/accounts/{account}/grants",
                json={"amount_cents": grant_cents, "idempotency_key": f"seed-{number}"},
            )
            assert granted.status_code == 201, granted.text
            key = admin.post(f"/admin/v1/accounts/{account}/api-keys", json={"name": "gw"})
            assert key.status_code == 201, key.text
            keys[account], secrets_[account] = key.json()["id"], key.json()["key"]
    return keys, secrets_


def run_under_load(url: str, servers: list[ServerProcess], tmp_path: Path) -> None:
    server = servers[0]
    keys, secrets_ = seed_accounts(server.base_url, ACCOUNTS, GRANT_CENTS)
    ids = sorted(keys)
    spare = make_url(CITUS_SPARE_URL)
    before = nodes_of(url, ids)
    assert spare.port not in before.values()

    gateway = Gateway(server.base_url)
    seen = Seen()
    stop = threading.Event()
    moving = threading.Event()
    failures: list[BaseException] = []
    occurred = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def event(account: str, request_id: str, rng: random.Random, **extra: Any) -> dict[str, Any]:
        prompt = rng.randrange(50, 2000)
        return {
            "request_id": request_id,
            "api_key_id": keys[account],
            "model": MODEL,
            "api": "chat_completions",
            "usage": chat_usage(prompt, rng.randrange(1, 300), cached=rng.randrange(0, prompt)),
            "occurred_at": occurred,
            "outcome": "completed",
            **extra,
        }

    def record(client: httpx.Client, events: list[dict[str, Any]], by_id: dict[str, str]) -> None:
        response, tries = gateway.send(client, "POST", "/v1/usage/events", {"events": events})
        assert response.status_code == 200, response.text
        body = response.json()
        for sent, result in zip(events, body["data"], strict=True):
            assert result["request_id"] == sent["request_id"]
            # A duplicate only when a try that failed for the client had been recorded.
            assert result["status"] == "recorded" or (
                result["status"] == "duplicate" and tries > 1
            ), (result, tries)
            with seen.lock:
                assert sent["request_id"] not in seen.events
                seen.events[sent["request_id"]] = by_id[sent["request_id"]]
                seen.charges[by_id[sent["request_id"]]] += charge(sent["usage"])
                seen.when[sent["request_id"]] = f"{tries} tries, at {time.monotonic():.2f}"

    def load(worker: int) -> None:
        rng = random.Random(worker)
        number = 0
        try:
            mine = servers[worker % len(servers)]
            with httpx.Client(base_url=mine.base_url, timeout=20) as client:
                while not stop.is_set():
                    number += 1
                    tag = f"w{worker}-{number}"
                    account = ids[rng.randrange(len(ids))]
                    kind = rng.random()
                    if kind < 0.5:
                        authorize_and_close(client, rng, account, tag)
                    elif kind < 0.75:
                        record(client, [event(account, tag, rng)], {tag: account})
                    else:
                        chosen = [ids[rng.randrange(len(ids))] for _ in range(rng.randrange(2, 12))]
                        events = [event(a, f"{tag}-{i}", rng) for i, a in enumerate(chosen)]
                        record(
                            client,
                            events,
                            {f"{tag}-{i}": a for i, a in enumerate(chosen)},
                        )
                    with seen.lock:
                        seen.requests += 1
                        seen.during_move += moving.is_set()
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            stop.set()

    def authorize_and_close(
        client: httpx.Client, rng: random.Random, account: str, tag: str
    ) -> None:
        prompt, max_tokens = rng.randrange(10, 3000), rng.randrange(1, 500)
        body = {
            "api_key": secrets_[account],
            "request_id": tag,
            "model": MODEL,
            "api": "chat_completions",
            "prompt_tokens": prompt,
            "max_tokens": max_tokens,
        }
        response, _ = gateway.send(client, "POST", "/v1/authorizations", body)
        assert response.status_code == 200, response.text
        hold = response.json()
        estimate = prompt * IN + max_tokens * OUT
        assert (hold["status"], hold["estimate_microcents"]) == ("active", estimate), hold
        with seen.lock:
            assert hold["id"] not in seen.holds, "a retried authorization made a second hold"
            seen.holds[hold["id"]] = (account, estimate)
            seen.when[hold["id"]] = f"placed at {time.monotonic():.2f}"
        then = rng.random()
        if then < 0.4:
            voided, _ = gateway.send(client, "DELETE", f"/v1/authorizations/{hold['id']}")
            assert voided.status_code == 200 and voided.json()["status"] == "voided", voided.text
            with seen.lock:
                seen.closed.add(hold["id"])
                seen.when[hold["id"]] += f", voided at {time.monotonic():.2f}"
        elif then < 0.8:
            settling = event(account, tag, rng, authorization_id=hold["id"])
            record(client, [settling], {tag: account})
            with seen.lock:
                seen.closed.add(hold["id"])
                seen.when[hold["id"]] += f", settled at {time.monotonic():.2f}"

    threads = [threading.Thread(target=load, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)  # the load is running
        moving.set()
        started = time.monotonic()
        execute(url, "SELECT citus_add_node(:h, :p)", h="localhost", p=spare.port)  # as the others
        # A write committed asynchronously can stay behind on the old placement (metering.citus).
        assert execute(url, ASYNCHRONOUS_COMMITS) == []
        execute(url, REBALANCE)
        execute(url, "SELECT citus_rebalance_wait()")
        moved_in = time.monotonic() - started
        print(f"\nmoved from {started:.2f} to {time.monotonic():.2f}")
        moving.clear()
        time.sleep(1)  # and still runs on the new placements
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures
    assert not [t.name for t in threads if t.is_alive()], "a load thread did not end"
    [(state,)] = execute(
        url, "SELECT state FROM pg_dist_background_job ORDER BY job_id DESC LIMIT 1"
    )
    assert state == "finished", state

    after = nodes_of(url, ids)
    moved = [account for account in ids if after[account] != before[account]]
    assert moved and all(after[account] == spare.port for account in moved), (before, after)
    assert seen.during_move >= 20, f"only {seen.during_move} requests ran during the move"
    print(
        f"\n{seen.requests} requests ({seen.during_move} while the spare was added and the shards"
        f" moved, {moved_in:.1f} s); {len(moved)} of {len(ids)} accounts moved; "
        f"{len(seen.events)} events, {len(seen.holds)} holds; retried: {dict(gateway.retried)}"
    )

    check_totals(url, server, ids, secrets_, seen)
    verified = cli(url, tmp_path, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def nodes_of(url: str, accounts: list[str]) -> dict[str, int]:
    """The port of the node holding each account's shard."""
    return {
        account: int(port)
        for account, port in execute(
            url,
            "SELECT a, n.nodeport FROM unnest(CAST(:accounts AS text[])) AS a "
            "JOIN pg_dist_placement p "
            "  ON p.shardid = get_shard_id_for_distribution_column('accounts', a) "
            "JOIN pg_dist_node n ON n.groupid = p.groupid",
            accounts=accounts,
        )
    }


def check_totals(
    url: str, server: ServerProcess, ids: list[str], secrets_: dict[str, str], seen: Seen
) -> None:
    """Each account as the client saw it: its events (each once), its charges and balance, its
    holds in force; and its held counter, which also counts the holds released since its last
    check-and-hold (the next one stops counting them: metering.ledger.placement)."""
    stored = {
        account: (int(balance), int(held), int(count))
        for account, balance, held, count in execute(
            url, "SELECT id, balance_microcents, held_microcents, held_count FROM accounts"
        )
    }
    events = execute(url, "SELECT request_id, account_id, total_microcents FROM usage_events")
    by_request = Counter(request_id for request_id, _, _ in events)
    assert [r for r, n in by_request.items() if n > 1] == [], "an event stored twice"
    stored_events = {r: a for r, a, _ in events}
    assert stored_events == seen.events, (
        "events lost, or stored unseen",
        {r: (a, seen.when[r]) for r, a in seen.events.items() if stored_events.get(r) != a},
        {r: a for r, a in stored_events.items() if seen.events.get(r) != a},
    )
    charged: Counter[str] = Counter()
    for _, account, total in events:
        charged[account] += int(total)
    holds = {
        hold_id: (account, status, counted)
        for hold_id, account, status, counted in execute(
            url, "SELECT id, account_id, status, counted FROM authorizations"
        )
    }
    assert set(holds) == set(seen.holds), (
        "holds lost, or placed unseen",
        {h: (seen.holds[h], seen.when[h]) for h in set(seen.holds) - set(holds)},
        set(holds) - set(seen.holds),
    )
    assert {h for h, (_, status, _) in holds.items() if status == "active"} == (
        set(seen.holds) - seen.closed
    )
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for account in ids:
            mine = {h: e for h, (a, e) in seen.holds.items() if a == account}
            open_holds = [e for h, e in mine.items() if h not in seen.closed]
            still_counted = [e for h, e in mine.items() if h in seen.closed and holds[h][2]]
            assert charged[account] == seen.charges[account], account
            expected = (
                GRANT_CENTS * 1_000_000 - seen.charges[account],
                sum(open_holds) + sum(still_counted),
                len(open_holds) + len(still_counted),
            )
            assert stored[account] == expected, (account, stored[account], expected)
            credits = client.get(
                "/v1/credits", headers={"Authorization": f"Bearer {secrets_[account]}"}
            ).json()
            assert (credits["balance_microcents"], credits["held_microcents"]) == (
                expected[0],
                sum(open_holds),
            )
