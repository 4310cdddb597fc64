"""Group commit (``metering.kit.gathering``, the holds' ``_QUEUE``, PostgreSQL): holds that arrive
while a check-and-hold of the process is in flight go to the database together, of one account or
of several, each decided as if alone, and a failure reaches every request of its call without
stranding the next ones."""

from __future__ import annotations

from decimal import Decimal
from functools import partial
from typing import Any

import pytest

from metering.kit.errors import InsufficientCredits
from metering.ledger import authorizations
from metering.ledger.placement.postgres import PostgresHolds
from metering.ledger.schemas import AuthorizationCreate
from metering.ledger.service import held_counter_mismatches
from tests.conftest import NOW, Api
from tests.factories import GLM_RATES
from tests.ledger.helpers import HeldBack, Setup, expected_estimate, holds, pool, prepaid

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)


class Arrivals(HeldBack):
    """The check-and-hold's first call held back until the holds that can have queued behind it
    (``HeldBack``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_call: int | None = None) -> None:
        super().__init__(monkeypatch, PostgresHolds, "place_all", fail_call)

    def authorize_at_once(self, api: Api, requests: list[AuthorizationCreate]) -> list[Any]:
        return self.at_once(
            api, [partial(authorizations.authorize, api.database, r, NOW, 3600) for r in requests]
        )

    pool = staticmethod(pool)


@pytest.fixture
def arrivals(monkeypatch: pytest.MonkeyPatch) -> Arrivals:
    return Arrivals(monkeypatch)


def request(setup: Setup, request_id: str) -> AuthorizationCreate:
    return AuthorizationCreate(
        api_key=setup.key.secret,
        request_id=request_id,
        model=setup.model,
        api="chat_completions",
        prompt_tokens=1000,
        max_tokens=100,
    )


def test_holds_arriving_together_are_placed_together_each_as_if_alone(
    pg_api: Api, arrivals: Arrivals
) -> None:
    setup = prepaid(pg_api, Decimal(3 * ESTIMATE) / 10**6)
    requests = [request(setup, f"together-{i}") for i in range(8)]
    requests.append(request(setup, "together-0"))  # a retry, in the same call as its original
    outcomes = arrivals.authorize_at_once(pg_api, requests)

    # The first alone, those waiting behind it together.
    assert arrivals.sizes[:2] == [1, arrivals.pool(pg_api) - 1], arrivals.sizes
    granted = [o for o in outcomes if isinstance(o, dict)]
    refused = [o for o in outcomes if isinstance(o, InsufficientCredits)]
    assert len(refused) + len(granted) == len(outcomes), outcomes
    assert len({hold["id"] for hold in granted}) == 3
    assert len(granted) in (3, 4)  # the retry gets its original, if that one was granted
    assert all(e.code == "insufficient_credits" for e in refused)
    placed = holds(pg_api, setup.account)
    assert sorted(h.request_id for h in placed) == sorted({h["request_id"] for h in granted})
    assert sum(h.estimate_microcents for h in placed) == 3 * ESTIMATE
    with pg_api.database.unit_of_work() as session:
        assert [m for m in held_counter_mismatches(session) if setup.account in m] == []


def test_a_failed_call_fails_its_requests_and_the_next_ones_proceed(
    pg_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = prepaid(pg_api, 1)
    arrivals = Arrivals(monkeypatch, fail_call=2)
    count = arrivals.pool(pg_api)
    outcomes = arrivals.authorize_at_once(
        pg_api, [request(setup, f"fail-{i}") for i in range(count)]
    )
    assert arrivals.sizes == [1, count - 1], arrivals.sizes
    assert sum(isinstance(o, RuntimeError) for o in outcomes) == count - 1
    assert sum(isinstance(o, dict) for o in outcomes) == 1
    # Nothing is left waiting: the account's next holds go through.
    again = arrivals.authorize_at_once(
        pg_api, [request(setup, "after-0"), request(setup, "after-1")]
    )
    assert all(isinstance(o, dict) for o in again), again


def test_holds_of_several_accounts_go_together_each_account_decided_alone(
    plain_pg_api: Api, arrivals: Arrivals
) -> None:
    # One server's group commit; on a cluster holds go together per account only (no
    # call spans shards), as tests/test_citus.py proves.
    # Each account has credit for two holds and is asked for three; one retry rides along.
    setups = [prepaid(plain_pg_api, Decimal(2 * ESTIMATE) / 10**6) for _ in range(4)]
    requests = [request(setup, f"spread-{i}") for i in range(3) for setup in setups]
    requests.append(request(setups[0], "spread-0"))
    outcomes = arrivals.authorize_at_once(plain_pg_api, requests)

    assert arrivals.sizes[:2] == [1, arrivals.pool(plain_pg_api) - 1], arrivals.sizes
    refused = [o for o in outcomes if isinstance(o, InsufficientCredits)]
    assert all(e.code == "insufficient_credits" for e in refused)
    assert len(refused) + sum(isinstance(o, dict) for o in outcomes) == len(outcomes), outcomes
    for setup in setups:
        placed = holds(plain_pg_api, setup.account)
        assert len(placed) == 2, (setup.account, placed)
        assert sum(h.estimate_microcents for h in placed) == 2 * ESTIMATE
    with plain_pg_api.database.unit_of_work() as session:
        accounts = {setup.account for setup in setups}
        assert [m for m in held_counter_mismatches(session) if any(a in m for a in accounts)] == []
