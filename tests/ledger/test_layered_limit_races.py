"""Project and member spend limits as deployed: two uvicorn processes on one database, 200
authorizations at once. A project's limit that leaves room for exactly N holds grants exactly N
to two members of the project together; a member's limit does the same over three of the
member's keys in two projects. What was spent before the race is recorded through
``POST /v1/usage/events`` and priced by tests/oracle.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests import oracle
from tests.conftest import SERVER_BACKENDS
from tests.factories import GLM_RATES, chat_usage, unique
from tests.ledger.test_concurrency import (
    ADMIN,
    ESTIMATE,
    GATEWAY,
    Cluster,
    _connection,
    _start,
    answered,
)

pytestmark = pytest.mark.usefixtures("needs_postgresql")
ROOM = 37  # holds the limit leaves room for


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _start(tmp_path_factory.mktemp("race-layers"), request.param)


async def _admin(cluster: Cluster, method: str, path: str, body: Any = None) -> dict[str, Any]:
    connection = _connection(cluster.servers[0], ADMIN)
    try:
        response = await connection.request(method, path, body)
        assert response.status in (200, 201), response.body
        return dict(response.json())
    finally:
        await connection.close()


async def _spend(cluster: Cluster, key_ids: list[str]) -> int:
    """One event per key through the gateway's ingest; what they cost, by the oracle."""
    events = [
        {
            "request_id": unique("spent"),
            "api_key_id": key_id,
            "model": cluster.model,
            "api": "chat_completions",
            "usage": chat_usage(1234 + i, 56),
            "occurred_at": cluster.clock.now().isoformat(),
            "outcome": "completed",
        }
        for i, key_id in enumerate(key_ids)
    ]
    connection = _connection(cluster.servers[1], GATEWAY)
    try:
        response = await connection.request("POST", "/v1/usage/events", {"events": events})
        assert response.status == 200 and response.json()["recorded"] == len(events), response.body
    finally:
        await connection.close()
    return oracle.total(events, GLM_RATES)


async def _burst(cluster: Cluster, secrets: list[str], count: int) -> list[object]:
    """``count`` authorizations at once, the keys taken in turn, the two processes too: each
    answer's status, or its error's code and limit_scope."""
    connections = [_connection(cluster.servers[i % 2], GATEWAY) for i in range(count)]
    for connection in connections:
        await connection.request("GET", "/healthz")
    # Each key once on each process first (its hold voided), as a gateway's keys are in use:
    # the race is then between check-and-holds, not between first reads of a key.
    for i, secret in enumerate(secrets * 2):
        warm = await connections[i].request(
            "POST",
            "/v1/authorizations",
            {
                "model": cluster.model,
                "api": "chat_completions",
                "prompt_tokens": 1,
                "max_tokens": 1,
                "api_key": secret,
            },
        )
        assert warm.status == 200, warm.body
        voided = await connections[i].request("DELETE", f"/v1/authorizations/{warm.json()['id']}")
        assert voided.status == 200, voided.body
    body = {"model": cluster.model, "api": "chat_completions", "prompt_tokens": 1000}
    try:
        responses = await asyncio.gather(
            *(
                answered(
                    c,
                    "POST",
                    "/v1/authorizations",
                    {**body, "max_tokens": 100, "api_key": secrets[i % len(secrets)]},
                )
                for i, c in enumerate(connections)
            )
        )
    finally:
        for connection in connections:
            await connection.close()
    return [
        200
        if r.status == 200
        else (r.status, r.json()["error"]["code"], r.json()["error"].get("limit_scope"))
        if r.status != 500
        else (r.status, r.json()["error"]["message"])
        for r in responses
    ]


SEEDED = 10**12  # each account's credit, in microcents


async def _people(cluster: Cluster) -> tuple[str, str, str, str]:
    """An account with ample credit, a project, and two members: (account, project, ada, bob)."""
    account, _key, _secret = cluster.seed(SEEDED)
    project = await _admin(cluster, "POST", f"/admin/v1/accounts/{account}/projects", {"name": "p"})
    members = f"/admin/v1/accounts/{account}/members"
    ada = await _admin(cluster, "POST", members, {"email": f"{unique('ada')}@x.io"})
    bob = await _admin(cluster, "POST", members, {"email": f"{unique('bob')}@x.io"})
    return account, project["id"], ada["id"], bob["id"]


def _assert_held_exactly_the_room(cluster: Cluster, account: str, spent: int) -> None:
    """After the race: the granted holds stand, each at the oracle's estimate, and the balance
    is the credit less what the events cost; nothing else was held."""
    books = cluster.books(account)
    assert (books["active"], books["active_sum"]) == (ROOM, ROOM * ESTIMATE), books
    assert books["balance"] == books["ledger"] == SEEDED - spent, books


async def _key(cluster: Cluster, account: str, **owners: str) -> tuple[str, str]:
    body = await _admin(
        cluster, "POST", f"/admin/v1/accounts/{account}/api-keys", {"name": "k", **owners}
    )
    return body["id"], body["key"]


def test_two_members_against_their_projects_limit_get_exactly_the_room_it_leaves(
    cluster: Cluster,
) -> None:
    async def race() -> tuple[str, int, list[object]]:
        account, project, ada, bob = await _people(cluster)
        ada_key = await _key(cluster, account, project_id=project, member_id=ada)
        bob_key = await _key(cluster, account, project_id=project, member_id=bob)
        spent = await _spend(cluster, [ada_key[0], bob_key[0]])
        limit = spent + ROOM * ESTIMATE
        await _patch_exact(cluster, f"/admin/v1/projects/{project}", _cents(limit))
        return account, spent, await _burst(cluster, [ada_key[1], bob_key[1]], 200)

    account, spent, results = asyncio.run(race())
    assert results.count(200) == ROOM
    assert results.count((402, "project_spend_limit", "project")) == 200 - ROOM, {
        str(r) for r in results
    }
    _assert_held_exactly_the_room(cluster, account, spent)


def test_a_members_limit_over_three_keys_in_two_projects_grants_exactly_its_room(
    cluster: Cluster,
) -> None:
    async def race() -> tuple[str, int, list[object]]:
        account, project, ada, _bob = await _people(cluster)
        keys = [
            await _key(cluster, account, project_id=project, member_id=ada),
            await _key(cluster, account, project_id=project, member_id=ada),
            await _key(cluster, account, member_id=ada),
        ]
        spent = await _spend(cluster, [key_id for key_id, _ in keys])
        limit = spent + ROOM * ESTIMATE
        await _patch_exact(cluster, f"/admin/v1/members/{ada}", _cents(limit))
        return account, spent, await _burst(cluster, [secret for _, secret in keys], 200)

    account, spent, results = asyncio.run(race())
    assert results.count(200) == ROOM
    assert results.count((402, "member_spend_limit", "member")) == 200 - ROOM, {
        str(r) for r in results
    }
    _assert_held_exactly_the_room(cluster, account, spent)


async def _patch_exact(cluster: Cluster, path: str, cents: str) -> None:
    """A spend limit sent as an exact JSON number of cents (microcents as decimals)."""
    connection = _connection(cluster.servers[0], ADMIN)
    try:
        response = await connection.request(
            "PATCH", path, f'{{"spend_limit_cents": {cents}}}'.encode()
        )
        assert response.status == 200, response.body
    finally:
        await connection.close()


def _cents(microcents: int) -> str:
    return f"{microcents // 10**6}.{microcents % 10**6:06d}"
