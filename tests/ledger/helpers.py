"""What the ledger tests share: expected figures computed independently of the service, and
direct reads and writes of the rows the service keeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from metering.kit.gathering import Gathering
from metering.models import Account, Authorization, LedgerEntry, UsageRollup
from tests.conftest import NOW, Api, run_on_database
from tests.factories import Key, counted_by, create_account, create_key, grant, priced_model

DAY_BEFORE = NOW - timedelta(days=1)


def half_up(numerator: int, denominator: int) -> int:
    """numerator / denominator to the nearest integer, halves up (written apart from the
    service's own rounding, so a mistake there cannot hide in both)."""
    exact = Fraction(numerator, denominator)
    floor = exact.numerator // exact.denominator
    return floor + 1 if exact - floor >= Fraction(1, 2) else floor


def expected_estimate(prompt: int, reserved: int, rates: tuple[int, int, int]) -> int:
    """The estimate: round_half_up(prompt × input rate) + round_half_up(reserved × output rate)."""
    return half_up(prompt * rates[0], 10**6) + half_up(reserved * rates[1], 10**6)


@dataclass(frozen=True)
class Setup:
    account: str
    key: Key
    model: str


def prepaid(
    api: Api,
    cents: Any = 0,
    *,
    limit_cents: Any = None,
    billing: str = "prepaid",
    rates: tuple[int, int, int] | None = None,
    **model: Any,
) -> Setup:
    """An account with a key and (optionally) credit, and a model priced since yesterday."""
    account = create_account(api, billing=billing)
    key = create_key(api, account)
    if limit_cents is not None:
        set_limit(api, key, limit_cents)
    if cents:
        grant(api, account, cents)
    model_id = (
        priced_model(api, DAY_BEFORE, **model)
        if rates is None
        else priced_model(api, DAY_BEFORE, rates, **model)
    )
    return Setup(account, key, model_id)


def set_limit(api: Api, key: Key, limit_cents: Any) -> None:
    """A key's monthly spend limit, sent as an exact JSON number (Decimal allowed)."""
    amount = format(limit_cents, "f") if isinstance(limit_cents, Decimal) else str(limit_cents)
    response = api.client.patch(
        f"/admin/v1/api-keys/{key.id}",
        content=f'{{"monthly_spend_limit_cents": {amount}}}',
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text


def add_key_spend(
    api: Api, key: Key, day: datetime, cost_microcents: int, *, grouping: str = "key"
) -> None:
    """A day's charges of a key in the report aggregates (what the ingest transaction writes)."""
    start = day.replace(hour=0, minute=0, second=0, microsecond=0)
    with api.database.unit_of_work() as session:
        session.execute(
            insert(UsageRollup).values(
                account_id=key.account_id,
                bucket_width="1d",
                grouping=grouping,
                bucket_start=start,
                api_key_id=key.id if grouping != "model" else "",
                model_id="" if grouping == "key" else "m",
                requests=1,
                input_tokens=0,
                cache_read_tokens=0,
                output_tokens=0,
                reasoning_tokens=0,
                cost_microcents=cost_microcents,
                last_event_id=0,
            )
        )
        session.commit()


def holds(api: Api, account_id: str) -> list[Any]:
    with api.database.unit_of_work() as session:
        return list(
            session.execute(
                select(Authorization).where(Authorization.account_id == account_id)
            ).scalars()
        )


def books(api: Api, account_id: str) -> tuple[int, int]:
    """(the stored balance, the sum of the account's ledger entries)."""
    with api.database.unit_of_work() as session:
        balance = session.execute(
            select(Account.balance_microcents).where(Account.id == account_id)
        ).scalar_one()
        total = session.execute(
            select(func.coalesce(func.sum(LedgerEntry.amount_microcents), 0)).where(
                LedgerEntry.account_id == account_id
            )
        ).scalar_one()
    return int(balance), int(total)


class HeldBack:
    """Holds the first group call of a gathering (``owner.name``, e.g. ``PostgresHolds.place_all``)
    back until every request that can has reached the gathering (polled, with a deadline), so
    they wait behind it whatever the machine's speed; records the size of every call, and fails
    call number ``fail_call``. Each request holds one of the process's connections while it
    waits, so the pool's size is how many can: the first two calls then go as [1, pool - 1],
    and the rest as they come."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        owner: type,
        name: str,
        fail_call: int | None = None,
    ) -> None:
        self.sizes: list[int] = []  # of the calls of the last ``at_once``
        self.calls = 0  # of every call
        self.arrived = 0
        self.expected = 0
        self.queued = 0  # arrivals when the first call went ahead
        gather, call = Gathering.record, getattr(owner, name)

        async def arriving(gathering: Gathering[Any, Any], item: Any, *args: Any) -> Any:
            self.arrived += 1
            return await gather(gathering, item, *args)

        async def recorded(recorder: Any, batch: list[Any]) -> Any:
            self.sizes.append(len(batch))
            self.calls += 1
            if len(self.sizes) == 1:
                deadline = time.monotonic() + 30
                while self.arrived < self.expected and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                self.queued = self.arrived
            if self.calls == fail_call:
                raise RuntimeError("the database went away")
            return await call(recorder, batch)

        monkeypatch.setattr(Gathering, "record", arriving)
        monkeypatch.setattr(owner, name, recorded)

    def at_once(self, api: Api, requests: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
        """Each request's outcome (its answer or its error), all sent at once."""
        self.sizes.clear()
        self.expected = self.arrived + min(len(requests), pool(api))

        async def all_at_once() -> list[Any]:
            return list(
                await asyncio.gather(*(request() for request in requests), return_exceptions=True)
            )

        outcomes = run_on_database(api.database, all_at_once())
        assert self.queued == self.expected, "the requests did not reach the gathering in 30 s"
        assert sum(self.sizes) == len(requests), self.sizes
        return outcomes


def pool(api: Api) -> int:
    """How many connections a process of ``api`` has: how many requests can wait at once."""
    return int(api.database.engine.pool.size())  # type: ignore[attr-defined]


def resolution_sources(api: Api) -> dict[str, int]:
    """How the app's authorizations resolved so far: read afresh, remembered, found stale."""
    sources = ("read", "remembered", "stale")
    return counted_by(api, "metering_authorization_resolutions_total", "source", sources)
