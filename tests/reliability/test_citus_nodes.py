"""No node that every request must pass (docs/citus.md#connections-to-every-node): a server
process whose ``METERING_DATABASE_URL`` names every node of the cluster (the coordinator first,
``load_balance_hosts=random``) authorizes, voids and records usage exactly, its connections on
more than one node; ``metering migrate`` with that URL still runs its DDL on the coordinator.
Each gateway call goes to the node that holds its account (metering.nodes): the map a process
reads names the node Citus does for every account, before and after a shard moves, and under
load no node sends another a command for the gateway's calls (a server on the coordinator
alone, the control, sends one per call). Needs ``citus`` in METERING_TEST_BACKENDS
(``make citus``)."""

from __future__ import annotations

import asyncio
import random
import re
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from metering.db import coordinator_url
from metering.nodes import Routes
from tests.conftest import CITUS, fresh_citus_database
from tests.factories import chat_usage
from tests.reliability.test_citus_rebalance import (
    GATEWAY,
    IN,
    MODEL,
    OUT,
    charge,
    cli,
    every_node_url,
    execute,
    import_catalog,
    node_ports,
    nodes_of,
    seed_accounts,
)
from tests.servers import ServerProcess

APPLICATION = "metering-nodes-test"
ACCOUNTS = 6
GRANT_CENTS = 1_000_000
THREADS = 8
ROUNDS = 6  # per thread: an authorization (voided every other time), a single event, a batch


def test_the_first_host_is_the_coordinator() -> None:
    url = (
        "postgresql+psycopg://u:p@/db?host=c:9700&host=w1:9701&load_balance_hosts=random"
        "&sslmode=disable"
    )
    assert make_url(coordinator_url(url)).query == {"host": "c:9700", "sslmode": "disable"}
    assert make_url(coordinator_url(url)).password == "p"
    comma = "postgresql+psycopg://u@/db?host=c,w1&port=9700,9701&load_balance_hosts=random"
    assert make_url(coordinator_url(comma)).query == {"host": "c:9700"}
    failover = "postgresql+psycopg://u@/db?host=a:5432&host=b:5432&target_session_attrs=primary"
    assert coordinator_url(failover) == failover, "libpq's failover list is kept whole"
    single = "postgresql+psycopg://u@127.0.0.1:9700/db"
    assert coordinator_url(single) == single
    assert coordinator_url("sqlite:///x.db") == "sqlite:///x.db"


def test_a_server_on_every_node_answers_exactly_and_spreads_its_connections(
    tmp_path: Path,
) -> None:
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with fresh_citus_database() as url:
        spread = every_node_url(url, APPLICATION)
        migrated = cli(spread, tmp_path, "migrate")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert "account tables distributed by account" in migrated.stdout, migrated.stdout
        # The DDL ran on the coordinator: Alembic's version table is there, on no worker, and
        # the account tables are distributed from its metadata.
        ports = node_ports(url)
        nodes = [make_url(url).set(port=port).render_as_string(False) for port in ports]
        versions = [
            execute(node, "SELECT to_regclass('alembic_version')::text")[0][0] for node in nodes
        ]
        assert versions == ["alembic_version", None, None], versions
        assert execute(
            url, "SELECT citus_table_type FROM citus_tables WHERE table_name = 'accounts'::regclass"
        ) == [("distributed",)]
        import_catalog(spread, tmp_path)
        server = ServerProcess(spread, tmp_path / "server", workers=2).start()
        try:
            serve(url, server, nodes)
        finally:
            server.stop()


def serve(url: str, server: ServerProcess, nodes: list[str]) -> None:
    keys, secrets_ = seed_accounts(server.base_url, ACCOUNTS, GRANT_CENTS)
    accounts = sorted(keys)
    occurred = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    charged: Counter[str] = Counter()
    active: dict[str, tuple[str, int]] = {}  # hold id -> account, estimate
    lock = threading.Lock()
    failures: list[BaseException] = []

    def event(account: str, request_id: str, rng: random.Random) -> dict[str, Any]:
        prompt = rng.randrange(50, 2000)
        return {
            "request_id": request_id,
            "api_key_id": keys[account],
            "model": MODEL,
            "api": "chat_completions",
            "usage": chat_usage(prompt, rng.randrange(1, 300), cached=rng.randrange(0, prompt)),
            "occurred_at": occurred,
            "outcome": "completed",
        }

    def load(thread: int) -> None:
        rng = random.Random(thread)
        with httpx.Client(base_url=server.base_url, headers=GATEWAY, timeout=30) as client:
            for number in range(ROUNDS):
                account = rng.choice(accounts)
                prompt, max_tokens = rng.randrange(10, 3000), rng.randrange(1, 500)
                held = client.post(
                    "/v1/authorizations",
                    json={
                        "api_key": secrets_[account],
                        "request_id": f"auth-{thread}-{number}",
                        "model": MODEL,
                        "api": "chat_completions",
                        "prompt_tokens": prompt,
                        "max_tokens": max_tokens,
                    },
                )
                assert held.status_code == 200, held.text
                hold = held.json()
                estimate = prompt * IN + max_tokens * OUT
                assert (hold["status"], hold["estimate_microcents"]) == ("active", estimate), hold
                if number % 2:
                    voided = client.delete(f"/v1/authorizations/{hold['id']}")
                    assert voided.status_code == 200, voided.text
                    assert voided.json()["status"] == "voided", voided.text
                else:
                    with lock:
                        active[hold["id"]] = (account, estimate)
                single = event(account, f"one-{thread}-{number}", rng)
                batch = [
                    event(rng.choice(accounts), f"b-{thread}-{number}-{i}", rng) for i in range(3)
                ]
                for events in ([single], batch):
                    recorded = client.post("/v1/usage/events", json={"events": events})
                    assert recorded.status_code == 200, recorded.text
                    results = recorded.json()["data"]
                    assert [(r["request_id"], r["status"]) for r in results] == [
                        (e["request_id"], "recorded") for e in events
                    ], results
                    with lock:
                        for sent in events:
                            charged[
                                next(a for a, k in keys.items() if k == sent["api_key_id"])
                            ] += charge(sent["usage"])

    def guarded(thread: int) -> None:
        try:
            load(thread)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures

    # Where the server's connections are: on the coordinator and on the workers.
    connections = [
        execute(
            node,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = :name",
            name=APPLICATION,
        )[0][0]
        for node in nodes
    ]
    assert sum(1 for count in connections if count) > 1, connections
    assert connections[0] > 0, "the sessions' connections are on the coordinator"

    # Every charge and hold as the oracle computes them from what was sent, as the account's
    # key reads them (through the server, on any node) and as the coordinator stores them.
    balances = dict(execute(url, "SELECT id, balance_microcents FROM accounts"))
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for account in accounts:
            expected = (
                GRANT_CENTS * 1_000_000 - charged[account],
                sum(estimate for a, estimate in active.values() if a == account),
            )
            credits = client.get(
                "/v1/credits", headers={"Authorization": f"Bearer {secrets_[account]}"}
            )
            assert credits.status_code == 200, credits.text
            body = credits.json()
            assert (body["balance_microcents"], body["held_microcents"]) == expected, account
            assert int(balances[account]) == expected[0], account
    holds = execute(url, "SELECT id FROM authorizations WHERE status = 'active'")
    assert {hold for (hold,) in holds} == set(active)


def routed(url: str, accounts: list[str], nodes: list[tuple[str, int]]) -> dict[str, int | None]:
    """What a process's map says: the port of the node each account's calls are sent to."""

    async def read() -> dict[str, int | None]:
        routes = Routes(nodes)
        libpq = make_url(url).set(drivername="postgresql").render_as_string(False)
        async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as connection:
            await routes.refresh(connection)
        return {a: None if (n := routes.node_of(a)) is None else n[1] for a in accounts}

    return asyncio.run(read())


def test_a_process_routes_each_account_to_the_node_citus_places_it_on() -> None:
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with fresh_citus_database() as url:
        execute(url, "CREATE TABLE accounts (id VARCHAR(64) PRIMARY KEY)")
        execute(url, "SELECT create_distributed_table('accounts', 'id')")
        rng = random.Random(7)
        accounts = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(300)]
        accounts += [f"acct_{rng.getrandbits(64):x}" for _ in range(100)] + ["", "é€"]
        ports = node_ports(url)
        # Named as the URL names them (127.0.0.1), where the cluster says localhost.
        nodes = [("127.0.0.1", port) for port in ports]
        expected = nodes_of(url, accounts)
        assert set(expected.values()) == set(ports[1:]), "the accounts are on both workers"
        assert routed(url, accounts, nodes) == expected

        # A shard moved: the map read after it follows it.
        account = accounts[0]
        source = expected[account]
        target = next(port for port in ports[1:] if port != source)
        execute(
            url,
            "SELECT citus_move_shard_placement("
            "get_shard_id_for_distribution_column('accounts', CAST(:a AS text)), "
            "'localhost', :source, 'localhost', :target, shard_transfer_mode => 'block_writes')",
            a=account,
            source=source,
            target=target,
        )
        moved = nodes_of(url, accounts)
        assert moved[account] == target
        assert routed(url, accounts, nodes) == moved

        # A node the URL does not name: its accounts are sent to no node in particular.
        unnamed = routed(url, accounts, [node for node in nodes if node[1] != target])
        assert unnamed == {a: None if p == target else p for a, p in moved.items()}


# A command one node sent another (``citus.log_remote_commands``), with the sender's pid and
# database (scripts/citus.sh's log_line_prefix '%m [%p] db=%d ').
ISSUED = re.compile(r"^\S+ \S+ \S+ \[(?P<pid>\d+)\] db=(?P<db>\S*) NOTICE:\s+issuing ", re.M)


def _log_commands(node: str, database: str) -> None:
    """Each node logs the commands it sends another, for ``database`` (its own setting)."""
    libpq = make_url(node).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as connection:
        connection.execute("SET citus.enable_ddl_propagation = off")
        connection.execute(f'ALTER DATABASE "{database}" SET citus.log_remote_commands = on')
        connection.execute(f'ALTER DATABASE "{database}" SET log_min_messages = notice')


def _log_size(node: str) -> int:
    return int(execute(node, "SELECT size FROM pg_stat_file(pg_current_logfile())")[0][0])


def _issued(node: str, database: str, since: int, pids: set[int]) -> int:
    """Commands the node sent another since the log's offset ``since``, by backends ``pids``."""
    [(chunk,)] = execute(
        node,
        "SELECT pg_read_file(pg_current_logfile(), :since, :size)",
        since=since,
        size=_log_size(node) - since,
    )
    return sum(
        1
        for found in ISSUED.finditer(chunk)
        if found["db"] == database and int(found["pid"]) in pids
    )


def test_each_gateway_call_runs_on_the_node_holding_its_account(tmp_path: Path) -> None:
    """Authorizations, their voids, single events and batches over several accounts through a
    server on every node: no node sends another a command for them. The same through a server on
    the coordinator alone sends at least one per call (the check can fail)."""
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with fresh_citus_database() as url:
        database = make_url(url).database or ""
        nodes = [make_url(url).set(port=port).render_as_string(False) for port in node_ports(url)]
        migrated = cli(url, tmp_path, "migrate")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        import_catalog(url, tmp_path)
        for node in nodes:
            _log_commands(node, database)
        coordinator_only = f"{url}?application_name={APPLICATION}"
        spread = every_node_url(url, APPLICATION)
        servers = (("every-node", spread), ("coordinator", coordinator_only))
        issued = {}
        for name, server_url in servers:
            server = ServerProcess(server_url, tmp_path / name, workers=1).start()
            try:
                keys, secrets_ = seed_accounts(server.base_url, 4, GRANT_CENTS)
                calls = gateway_calls(server.base_url, keys, secrets_, name, warm=True)
                marks = [_log_size(node) for node in nodes]
                calls = gateway_calls(server.base_url, keys, secrets_, name, warm=False)
                pids = [
                    {
                        pid
                        for (pid,) in execute(
                            node,
                            "SELECT pid FROM pg_stat_activity WHERE datname = :d "
                            "AND application_name = :name",
                            d=database,
                            name=APPLICATION,
                        )
                    }
                    for node in nodes
                ]
                issued[name] = sum(
                    _issued(node, database, mark, mine)
                    for node, mark, mine in zip(nodes, marks, pids, strict=True)
                )
            finally:
                server.stop()
        assert issued["every-node"] == 0, issued
        assert issued["coordinator"] >= calls, issued


def gateway_calls(
    base_url: str, keys: dict[str, str], secrets_: dict[str, str], run: str, warm: bool
) -> int:
    """An authorization, its void and a single event for each account, then a batch of two
    events of each (twice, unless ``warm``: once, for the server's pools and remembered reads);
    the calls made."""
    made = 0
    occurred = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with httpx.Client(base_url=base_url, headers=GATEWAY, timeout=30) as client:
        for round_ in range(1 if warm else 2):
            for number, account in enumerate(sorted(keys)):
                request = f"{run}-{warm}-{round_}-{number}"
                held = client.post(
                    "/v1/authorizations",
                    json={
                        "api_key": secrets_[account],
                        "request_id": f"auth-{request}",
                        "model": MODEL,
                        "api": "chat_completions",
                        "prompt_tokens": 100,
                        "max_tokens": 10,
                    },
                )
                assert held.status_code == 200, held.text
                voided = client.delete(f"/v1/authorizations/{held.json()['id']}")
                assert voided.status_code == 200, voided.text
                event = {
                    "request_id": f"one-{request}",
                    "api_key_id": keys[account],
                    "model": MODEL,
                    "api": "chat_completions",
                    "usage": chat_usage(100, 10),
                    "occurred_at": occurred,
                    "outcome": "completed",
                }
                recorded = client.post("/v1/usage/events", json={"events": [event]})
                assert recorded.status_code == 200, recorded.text
                assert recorded.json()["data"][0]["status"] == "recorded", recorded.text
                made += 3
            # A batch over every account: each account's part two calls (its lookup, its
            # record) on its account's node.
            batch = [
                {**event, "request_id": f"batch-{run}-{warm}-{round_}-{account}-{n}",
                 "api_key_id": keys[account]}
                for account in sorted(keys)
                for n in range(2)
            ]  # fmt: skip
            recorded = client.post("/v1/usage/events", json={"events": batch})
            assert recorded.status_code == 200, recorded.text
            assert recorded.json()["recorded"] == len(batch), recorded.text
            made += 2 * len(keys)
    return made
