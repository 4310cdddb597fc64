"""Several API processes on one PostgreSQL, as deployed (real uvicorn processes, loopback HTTP).

What the other suites already run with two processes: the check-and-hold races
(``tests/ledger/test_concurrency.py``: two servers, 200 simultaneous authorizations, voids and
expiries, identical retries) and the same request ids sent at once to two processes
(``tests/usage/test_crash_and_concurrency.py``). Its crash test kills the only process. Added
here: one of two processes is killed mid-stream while the other keeps taking the same traffic
(ingest and authorizations), and the resend converges to exactly once; and a 500 leaves the
client's keep-alive connection usable (it used to be closed under the client).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from metering.db import Database
from metering.models import Account, Authorization, UsageEvent
from metering.usage.verify import verify
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN
from tests.security.helpers import contract_problems
from tests.servers import ServerProcess, running_servers
from tests.threads import Workers
from tests.usage.test_crash_and_concurrency import expected_totals, make_batches, seed

pytestmark = pytest.mark.usefixtures("needs_postgresql")

GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GRANT_CENTS = 1_000_000


@contextmanager
def client(server: ServerProcess, headers: dict[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as c:
        yield c


def test_killing_one_of_two_processes_mid_stream_loses_and_doubles_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    with running_servers(pg_url, tmp_path, 2) as (doomed, survivor):
        keys, accounts = seed(pg_url, survivor.base_url, "Crash-2")
        with client(survivor, ADMIN) as admin:
            response = admin.post(
                f"/admin/v1/accounts/{accounts['prepaid']}/grants",
                json={"amount_cents": GRANT_CENTS, "idempotency_key": "seed"},
            )
            assert response.status_code == 201, response.text
            secret = admin.post(
                f"/admin/v1/accounts/{accounts['prepaid']}/api-keys", json={"name": "gw"}
            ).json()["key"]
        batches = make_batches(keys, "Crash-2", count=40, size=150)
        acknowledged: dict[str, set[int]] = {"doomed": set(), "survivor": set()}
        holds: list[str] = []
        stop = threading.Event()

        def ingest(name: str, server: ServerProcess, order: list[int]) -> None:
            with client(server, GATEWAY) as gateway:
                for index in order:
                    try:
                        response = gateway.post("/v1/usage/events", json={"events": batches[index]})
                    except httpx.HTTPError:
                        if server is survivor:
                            raise  # only the killed process may drop a request
                        return  # the process died under this request
                    assert response.status_code == 200, response.text
                    acknowledged[name].add(index)

        def authorize() -> None:
            """Holds placed on both processes meanwhile, each with a request id: when a process
            dies under a request, the gateway retries it on the other one and gets the hold
            that was placed (if it was) instead of a second one. Each is voided at the end."""
            servers = [doomed, survivor]
            rng = random.Random(7)
            number = 0
            while not stop.is_set():
                number += 1
                body = {
                    "api_key": secret,
                    "request_id": f"hold-{number}",
                    "model": "crash-2",
                    "api": "chat_completions",
                    "prompt_tokens": 100,
                    "max_tokens": 10,
                }
                for server in (servers[rng.randrange(2)], survivor):
                    try:
                        response = httpx.post(
                            f"{server.base_url}/v1/authorizations", json=body, headers=GATEWAY
                        )
                    except httpx.HTTPError:
                        if server is survivor:
                            raise
                        continue  # the process died under this request: retry on the other
                    assert response.status_code == 200, response.text
                    holds.append(response.json()["id"])
                    break

        # Both processes take the same batches (a gateway retrying through its pool), in
        # different orders, while holds are placed on both.
        order = list(range(len(batches)))
        # A worker's failure (a status other than 200 before its process died) fails the test
        # at the join, never ends the worker silently.
        senders, holder = Workers(), Workers()
        senders.start(ingest, "doomed", doomed, order)
        senders.start(ingest, "survivor", survivor, order[::-1])
        holder.start(authorize)
        try:
            deadline = time.monotonic() + 60
            while (
                len(acknowledged["doomed"]) < 5
                and time.monotonic() < deadline
                and not (senders.failed() or holder.failed())
            ):
                time.sleep(0.01)
            doomed.kill()  # SIGKILL with batches in flight
            senders.join(180)
        finally:
            stop.set()
            holder.join(30)
        assert 5 <= len(acknowledged["doomed"]) < len(batches), "the kill did not land mid-stream"

        # The gateway resends everything through the process that is left.
        with client(survivor, GATEWAY) as gateway:
            for index, batch in enumerate(batches):
                resent = gateway.post("/v1/usage/events", json={"events": batch})
                assert resent.status_code == 200, resent.text
                body = resent.json()
                assert body["quarantined"] == body["rejected"] == 0, body
                if index in acknowledged["doomed"] | acknowledged["survivor"]:
                    assert body["recorded"] == 0, (index, body)
            for hold in set(holds):
                voided = gateway.delete(f"/v1/authorizations/{hold}")
                assert voided.status_code == 200 and voided.json()["status"] == "voided"
        with client(survivor, {"x-api-key": secret}) as account:
            answer = account.get("/v1/credits")
            assert answer.status_code == 200, answer.text
            credits = answer.json()

    count, cost, prompt = expected_totals(batches, keys)
    database = Database.from_url(pg_url)
    try:
        with database.unit_of_work() as session:
            report = verify(session)
            assert report.ok, report.mismatches
            stored = session.execute(
                select(func.count(), func.count(func.distinct(UsageEvent.request_id)))
            ).one()
            assert tuple(stored) == (count, count)
            assert session.execute(select(func.sum(UsageEvent.prompt_tokens))).scalar() == prompt
            balance = session.get(Account, accounts["prepaid"]).balance_microcents  # type: ignore[union-attr]
            assert balance == GRANT_CENTS * 1_000_000 - cost
            # Every hold placed, before or after the crash, on either process, was learnt by
            # the gateway (retrying by request id) and voided: none is left counting.
            active = session.execute(
                select(func.count()).where(
                    Authorization.account_id == accounts["prepaid"],
                    Authorization.status == "active",
                )
            ).scalar_one()
            assert active == 0
    finally:
        database.dispose()
    assert (credits["balance_microcents"], credits["held_microcents"]) == (balance, 0)


def cut_connections(url: str) -> None:
    """Terminate every connection to the database, as a failover would (of the coordinator,
    on a Citus cluster)."""
    maintenance = make_url(url).set(database="postgres")
    engine = create_engine(maintenance, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": make_url(url).database},
            )
    finally:
        engine.dispose()


def test_a_500_leaves_the_keep_alive_connection_usable(pg_url: str, tmp_path: Path) -> None:
    """Regression: an unexpected error was answered 500 and then re-raised to uvicorn, which
    logged it a second time and closed the connection under the client, so the client's next
    request on that connection failed with a reset (a gateway cannot tell whether such a request
    was processed). Now the error is answered, logged once, and the connection stays open. (The
    error provoked is a connection the database dropped, now answered 503 database_unavailable,
    which takes the same path as any unexpected error.)"""
    server = ServerProcess(pg_url, tmp_path / "server").start()
    statuses: list[int] = []
    try:
        with client(server, ADMIN) as admin:
            assert admin.get("/admin/v1/accounts").status_code == 200  # a pooled connection
            cut_connections(pg_url)
            for _ in range(4):
                response: Any = admin.get("/admin/v1/accounts")  # never a transport error
                if response.status_code == 503:  # the error body: the database dropped it
                    assert contract_problems(response) == ["server error 503"], response.text
                    assert response.json()["error"]["code"] == "database_unavailable"
                else:
                    assert response.status_code == 200, response.text
                statuses.append(response.status_code)
    finally:
        server.stop()
    assert 503 in statuses and statuses[-1] == 200, statuses
    log = next(server.workdir.glob("server-*.log")).read_text()
    assert log.count("database unavailable") == statuses.count(503), log[-2000:]
    assert "Exception in ASGI application" not in log
