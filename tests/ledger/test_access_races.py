"""The limit on requests in flight as deployed: two uvicorn processes on one PostgreSQL. 200
authorizations at once against max_concurrent_requests = 10 with ample credit grant exactly 10
(190 × 429 with Retry-After); voiding 3 frees exactly 3; holds expiring (hold_ttl_seconds=1,
then the servers' test clock moved a second on) and holds settled by usage events free their
slots exactly; an unbilled account is limited the same way; a key's weekly limit is exact under
the race too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import insert, update

from metering.accounts.windows import window_bounds
from metering.models import Account, ApiKey, UsageRollup
from tests.conftest import SERVER_BACKENDS
from tests.ledger.test_concurrency import ESTIMATE, GATEWAY, Cluster, _connection, _start, answered

pg_only = pytest.mark.usefixtures("needs_postgresql")


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _start(tmp_path_factory.mktemp("race-limit"), request.param)


def _limited(cluster: Cluster, limit: int, billing: str = "prepaid") -> tuple[str, str, str]:
    account, key_id, secret = cluster.seed(10**12)
    with cluster.database.unit_of_work() as session:
        session.execute(
            update(Account)
            .where(Account.id == account)
            .values(max_concurrent_requests=limit, billing=billing)
        )
        session.commit()
    return account, key_id, secret


async def _burst(
    cluster: Cluster, secret: str, count: int, prefix: str, **extra: object
) -> list[tuple[int, dict[str, object], dict[str, str]]]:
    connections = [_connection(cluster.servers[i % 2], GATEWAY) for i in range(count)]
    for connection in connections:
        await connection.request("GET", "/healthz")
    body = {
        "api_key": secret,
        "model": cluster.model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "max_tokens": 100,
        **extra,
    }
    try:
        responses = await asyncio.gather(
            *(
                answered(c, "POST", "/v1/authorizations", {**body, "request_id": f"{prefix}-{i}"})
                for i, c in enumerate(connections)
            )
        )
    finally:
        for connection in connections:
            await connection.close()
    return [(r.status, r.json(), r.headers) for r in responses]


def _granted(results: list[tuple[int, dict[str, object], dict[str, str]]]) -> list[str]:
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    for status, body, headers in results:
        if status == 429:
            error = body["error"]
            assert isinstance(error, dict) and error["code"] == "concurrency_limit_exceeded"
            lowered = {name.lower(): value for name, value in headers.items()}
            assert lowered["retry-after"] == "1" and lowered["ratelimit-reset"] == "1"
    return [str(body["id"]) for status, body, _ in results if status == 200]


async def _void(cluster: Cluster, hold_ids: list[str]) -> None:
    connection = _connection(cluster.servers[0], GATEWAY)
    try:
        for hold_id in hold_ids:
            response = await connection.request("DELETE", f"/v1/authorizations/{hold_id}")
            assert response.status == 200, response.body
    finally:
        await connection.close()


@pg_only
@pytest.mark.parametrize("billing", ["prepaid", "unbilled"])
def test_200_at_once_against_10_grant_exactly_10_then_3_voids_free_3(
    cluster: Cluster, billing: str
) -> None:
    account, _key, secret = _limited(cluster, 10, billing)
    granted = _granted(asyncio.run(_burst(cluster, secret, 200, "a")))
    assert len(granted) == 10
    asyncio.run(_void(cluster, granted[:3]))
    again = _granted(asyncio.run(_burst(cluster, secret, 200, "b")))
    assert len(again) == 3
    books = cluster.books(account)
    assert (books["active"], books["voided"]) == (10, 3)


@pg_only
def test_expiring_holds_free_their_slots_exactly(cluster: Cluster) -> None:
    _account, _key, secret = _limited(cluster, 10)
    granted = _granted(asyncio.run(_burst(cluster, secret, 200, "c", hold_ttl_seconds=1)))
    assert len(granted) == 10
    cluster.clock.advance(seconds=1)  # the servers' clock: every hold above expires now
    again = _granted(asyncio.run(_burst(cluster, secret, 200, "d")))
    assert len(again) == 10


@pg_only
def test_settled_holds_free_their_slots_exactly(cluster: Cluster) -> None:
    account, key_id, secret = _limited(cluster, 10)
    results = asyncio.run(_burst(cluster, secret, 200, "e"))
    granted = [body for status, body, _ in results if status == 200]
    assert len(granted) == 10
    events = [
        {
            "request_id": str(hold["request_id"]),
            "api_key_id": key_id,
            "model": cluster.model,
            "api": "chat_completions",
            "usage": {"prompt_tokens": 10, "completion_tokens": 1},
            "occurred_at": cluster.clock.now().isoformat(),
            "outcome": "completed",
        }
        for hold in granted[:4]
    ]

    async def settle() -> None:
        connection = _connection(cluster.servers[1], GATEWAY)
        try:
            response = await connection.request("POST", "/v1/usage/events", {"events": events})
            assert response.status == 200 and response.json()["recorded"] == 4, response.body
        finally:
            await connection.close()

    asyncio.run(settle())
    again = _granted(asyncio.run(_burst(cluster, secret, 200, "f")))
    assert len(again) == 4
    assert cluster.books(account)["active"] == 10


@pg_only
def test_a_weekly_limit_covering_exactly_100_grants_exactly_100(cluster: Cluster) -> None:
    """The week's spend (the rollups of earlier days this week, from Monday) plus the holds in
    flight, under the account's lock: exactly as many holds as the weekly limit leaves room
    for, whatever process answers."""
    now = cluster.clock.now()
    week_start, _ = window_bounds("week", now)
    # The week's Monday counts; the same amount long before it does not.
    spent = 654_321
    account, key_id, secret = cluster.seed(10**12)
    with cluster.database.unit_of_work() as session:
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id)
            .values(
                monthly_spend_limit_microcents=spent + 100 * ESTIMATE, spend_limit_window="week"
            )
        )
        for day, cost in ((week_start, spent), (week_start.replace(year=2000), 10**9)):
            session.execute(
                insert(UsageRollup).values(
                    account_id=account,
                    bucket_width="1d",
                    grouping="key",
                    bucket_start=day,
                    api_key_id=key_id,
                    model_id="",
                    requests=1,
                    input_tokens=0,
                    cache_read_tokens=0,
                    output_tokens=0,
                    reasoning_tokens=0,
                    cost_microcents=cost,
                    last_event_id=0,
                )
            )
        session.commit()
    results = asyncio.run(_burst_any(cluster, secret, 200, "w"))
    assert results.count(200) == 100
    assert results.count("member_spend_limit") == 100
    assert cluster.books(account)["active"] == 100


async def _burst_any(cluster: Cluster, secret: str, count: int, prefix: str) -> list[object]:
    """Statuses of ``count`` authorizations at once (the error code for a refusal)."""
    connections = [_connection(cluster.servers[i % 2], GATEWAY) for i in range(count)]
    for connection in connections:
        await connection.request("GET", "/healthz")
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
                answered(c, "POST", "/v1/authorizations", {**body, "request_id": f"{prefix}-{i}"})
                for i, c in enumerate(connections)
            )
        )
    finally:
        for connection in connections:
            await connection.close()
    return [r.status if r.status == 200 else r.json()["error"]["code"] for r in responses]
