"""Grants under concurrency, as deployed (two uvicorn processes, one PostgreSQL): credit made of a
promotional grant that expires mid-run and a paid grant. Before the expiry the two together
cover exactly 80 holds: 100 simultaneous authorizations get exactly 80. At the expiry instant
the promotional credit stops counting with no sweeper and no write: the next 100 get none (the
80 holds placed before it leave ``available`` below zero, as they may), every sample of
``GET /v1/credits`` shows the balance the one clock decides, and ``metering verify`` is clean,
the unwritten expiry counted as pending."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select

from metering.accounts import service as accounts
from metering.ledger import service as ledger
from metering.models import Authorization
from metering.usage.verify import verify
from tests.conftest import SERVER_BACKENDS
from tests.ledger.test_concurrency import (
    ESTIMATE,
    GATEWAY,
    Cluster,
    _connection,
    _start,
    answered,
)

PAID, PROMOTIONAL = 50 * ESTIMATE, 30 * ESTIMATE


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def grant_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _start(tmp_path_factory.mktemp("grant-race"), request.param)


async def _burst(
    cluster: Cluster, secret: str, prefix: str, count: int, samples: list[tuple[float, dict]]
) -> list[int]:
    connections = [_connection(cluster.servers[i % 2], GATEWAY) for i in range(count)]
    for connection in connections:
        await connection.request("GET", "/healthz")
    done = asyncio.Event()

    async def sample() -> None:
        headers = {"Authorization": f"Bearer {secret}"}
        readers = [_connection(server, headers) for server in cluster.servers]
        try:
            index = 0
            while not done.is_set():
                before = cluster.clock.now().timestamp()
                response = await readers[index % 2].request("GET", "/v1/credits")
                assert response.status == 200, response.body
                samples.append((before, cluster.clock.now().timestamp(), response.json()))
                index += 1
        finally:
            for reader in readers:
                await reader.close()

    sampling = asyncio.create_task(sample())
    await asyncio.sleep(0.05)
    body = {"api_key": secret, "model": cluster.model, "api": "chat_completions"}
    try:
        responses = await asyncio.gather(
            *(
                answered(
                    c,
                    "POST",
                    "/v1/authorizations",
                    {
                        **body,
                        "prompt_tokens": 1000,
                        "max_tokens": 100,
                        "request_id": f"{prefix}-{i}",
                    },
                )
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
    return [response.status for response in responses]


def test_a_promotional_grant_expiring_mid_run(grant_cluster: Cluster) -> None:
    cluster = grant_cluster
    now = cluster.clock.now()
    expires = now + timedelta(seconds=6)
    with cluster.database.unit_of_work() as session:
        account = accounts.create_account(session, "grant-race", "prepaid", now)
        _key, secret = accounts.create_api_key(session, account, "k", None, now)
        ledger.add_entry(session, account.id, "grant", PAID, "paid", None, now)
        ledger.add_entry(
            session,
            account.id,
            "grant",
            PROMOTIONAL,
            "promo",
            None,
            now,
            ledger.GrantTerms("promotional", 10, expires),
        )
        account_id = account.id
        session.commit()
    samples: list[tuple[float, float, dict]] = []
    before = asyncio.run(_burst(cluster, secret, "before", 100, samples))
    with cluster.database.reading() as session:
        latest = session.execute(
            select(Authorization.created_at)
            .where(Authorization.account_id == account_id)
            .order_by(Authorization.created_at.desc())
            .limit(1)
        ).scalar_one()
    assert latest < expires, "the first burst ran past the expiry: the machine is too slow"
    assert before.count(200) == 80 and before.count(402) == 20
    cluster.clock.set(expires)  # the servers' test clock: the expiry instant, exactly
    after = asyncio.run(_burst(cluster, secret, "after", 100, samples))
    assert after.count(402) == 100
    held = 80 * ESTIMATE
    cut = expires.timestamp()
    for sent, received, sample in samples:
        if received < cut:
            assert sample["balance_microcents"] == PAID + PROMOTIONAL, sample
            assert sample["available_microcents"] >= 0, sample
        elif sent >= cut:
            assert sample["balance_microcents"] == PAID, sample
            assert sample["available_microcents"] == PAID - held, sample
            assert [g["id"] for g in sample["grants"]] and len(sample["grants"]) == 1
    assert any(sent >= cut for sent, _, _ in samples)
    with cluster.database.reading() as session:
        report = verify(session, cluster.clock.now())
    assert report.ok, report.mismatches
    assert (report.pending_expiries, report.pending_microcents) == (1, PROMOTIONAL)
