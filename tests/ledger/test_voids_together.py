"""Voids that arrive together (one PostgreSQL server, ``_VOIDS`` in
metering.ledger.placement.postgres): the voids a process is asked for while one is being made go
to the database in one statement, each answered as if it had been made alone, at its own
request's instant; two such statements that meet in a deadlock are not an error."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg
import pytest

from metering.kit.errors import NotFound
from metering.ledger import authorizations
from metering.ledger.placement.postgres import PostgresHolds
from metering.ledger.schemas import AuthorizationCreate
from metering.ledger.service import held_counter_mismatches
from tests.conftest import NOW, Api, run_on_database
from tests.factories import GLM_RATES
from tests.ledger.helpers import HeldBack, Setup, expected_estimate, holds, pool, prepaid

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)
TTL = 3600


class Voids(HeldBack):
    """The first void call held back until the voids that can have queued behind it
    (``HeldBack``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(monkeypatch, PostgresHolds, "void_all")

    def void_at_once(self, api: Api, asked: list[tuple[str, Any]]) -> list[Any]:
        return self.at_once(
            api,
            [partial(authorizations.void, api.database, hold_id, now) for hold_id, now in asked],
        )


def place(api: Api, setup: Setup, count: int, prefix: str = "void") -> list[str]:
    async def placed() -> list[str]:
        ids = []
        for i in range(count):
            hold = await authorizations.authorize(
                api.database,
                AuthorizationCreate(
                    api_key=setup.key.secret,
                    request_id=f"{prefix}-{i}",
                    model=setup.model,
                    api="chat_completions",
                    prompt_tokens=1000,
                    max_tokens=100,
                ),
                NOW,
                TTL,
            )
            ids.append(hold["id"])
        return ids

    return run_on_database(api.database, placed())


def test_voids_arriving_together_are_made_together_each_as_if_alone(
    plain_pg_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = pool(plain_pg_api)
    assert count >= 5, "the group below needs four voids waiting behind a first"
    setup = prepaid(plain_pg_api, Decimal((count + 3) * ESTIMATE) / 10**6)
    ids = place(plain_pg_api, setup, count + 3)
    first, voided_before, past_expiry, twice, *rest = ids
    database = plain_pg_api.database
    run_on_database(database, authorizations.void(database, voided_before, NOW))
    late = NOW + timedelta(seconds=TTL)  # the hold's expiry: it reads as expired then
    stamps = {hold_id: NOW + timedelta(milliseconds=i) for i, hold_id in enumerate(ids)}
    voids = Voids(monkeypatch)

    # A first alone, then a group with a hold voided before, one past its expiry at its
    # request's instant, one asked for twice, and as many others as the pool lets wait.
    asked = [
        (first, stamps[first]),
        (voided_before, stamps[voided_before]),
        (past_expiry, late),
        (twice, stamps[twice]),
        (twice, stamps[twice]),
        *((hold_id, stamps[hold_id]) for hold_id in rest[: count - 5]),
    ]
    outcomes = voids.void_at_once(plain_pg_api, asked)
    assert voids.sizes == [1, count - 1], voids.sizes
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    bodies = {hold_id: o for (hold_id, _), o in zip(asked, outcomes, strict=True)}
    assert bodies[voided_before]["status"] == "voided"
    assert bodies[past_expiry]["status"] == "expired"
    assert outcomes[3] == outcomes[4]

    # A group with an id of no hold: its request alone is refused.
    last = rest[count - 5 :]
    asked = [
        (last[0], stamps[last[0]]),
        ("auth_nosuchhold", NOW),
        *((h, stamps[h]) for h in last[1:]),
    ]
    outcomes = voids.void_at_once(plain_pg_api, asked)
    assert voids.sizes == [1, len(asked) - 1], voids.sizes
    assert isinstance(outcomes[1], NotFound) and outcomes[1].param == "authorization_id"
    assert all(isinstance(o, dict) for i, o in enumerate(outcomes) if i != 1), outcomes
    bodies.update((h, o) for (h, _), o in zip(asked, outcomes, strict=True) if isinstance(o, dict))

    voided = [first, twice, *rest]
    stored = {hold.id: hold for hold in holds(plain_pg_api, setup.account)}
    assert stored[past_expiry].status == "active"  # it was past its expiry: not voided
    for hold_id in voided:
        # Each voided at its own request's instant, and answered so.
        assert bodies[hold_id]["status"] == "voided"
        assert stored[hold_id].status == "voided"
        assert stored[hold_id].closed_at == stamps[hold_id]
    with plain_pg_api.database.unit_of_work() as session:
        assert [m for m in held_counter_mismatches(session) if setup.account in m] == []


def test_voids_together_that_meet_in_a_deadlock_are_made_one_by_one(plain_pg_api: Api) -> None:
    """Another transaction holds the second hold's row while the statement voiding both locks
    the first and waits for the second; that transaction then asks for the first: a deadlock,
    found by the statement (the other waits far longer before it looks), which is refused. Its
    voids are then made one by one, once the other transaction ends."""
    setup = prepaid(plain_pg_api, Decimal(8 * ESTIMATE) / 10**6)
    # Two holds, the first made with the lower id: first in the statement's order whether it
    # visits them as asked, as stored or by id.
    made: list[str] = []
    while not (pairs := [(a, b) for i, a in enumerate(made) for b in made[i + 1 :] if a < b]):
        made += place(plain_pg_api, setup, 1, f"deadlock-{len(made)}")
    low, high = pairs[0]
    url = plain_pg_api.database.engine.url.set(drivername="postgresql")
    conninfo = url.render_as_string(hide_password=False)
    lock = "SELECT 1 FROM authorizations WHERE id = %s FOR UPDATE"

    async def scenario() -> list[Any]:
        other = await psycopg.AsyncConnection.connect(conninfo)
        mine = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        try:
            await other.execute("SET deadlock_timeout = '30s'")
            # Its own check two seconds into its wait: the 0.5 s below stays well inside it
            # on a busy machine (the default, one second, left 0.496 s once).
            await mine.execute("SET deadlock_timeout = '2s'")
            await other.execute(lock, (high,))
            together = asyncio.create_task(
                PostgresHolds(mine, cluster=False).void_all([(low, NOW), (high, NOW)])
            )
            await asyncio.sleep(0.5)  # it holds the first hold and waits for the second
            started = time.monotonic()
            await other.execute(lock, (low,))
            # It waited for the statement's lock on the first hold until the statement's own
            # deadlock check (after two seconds) refused the statement: far before its own.
            assert 0.5 < time.monotonic() - started < 20
            await asyncio.sleep(0.2)
            assert not together.done()  # now waiting, alone, for the second
            await other.commit()
            return await together
        finally:
            await other.close()
            await mine.close()

    answers = asyncio.run(scenario())
    assert [(row["id"], row["status"], voided) for row, voided in answers] == [
        (low, "voided", True),
        (high, "voided", True),
    ]
