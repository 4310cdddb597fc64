"""``spend_limit.threshold_reached`` (docs/api.md#event-types): a key's charges in its window reach
80%, and 100%, of its limit; a jump past both fires 80 then 100; once per key, window and percent;
nothing for a key without a limit; a new window re-arms; a replay fires nothing; delivered and
signed like every event. (The race between two server processes: ``test_spend_limit_race``.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from metering.accounts.windows import window_bounds
from metering.kit.timeutil import format_timestamp
from tests.conftest import Api
from tests.factories import (
    Key,
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.notifications.conftest import Hooks
from tests.notifications.receiver import receiving, verified
from tests.notifications.test_events import CENT_RATES, events_of

REACHED = "spend_limit.threshold_reached"


def _limited(
    api: Api, limit_cents: Any, window: str = "day", billing: str = "prepaid"
) -> tuple[str, Key, str]:
    """An account with ample credit, one key limited to ``limit_cents`` per ``window``, and a
    model that charges one cent per event (``_spend``)."""
    account = create_account(api, billing)
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={
            "name": unique("key"),
            "spend_limit_cents": limit_cents,
            "spend_limit_window": window,
        },
    )
    assert response.status_code == 201, response.text
    key = Key(response.json()["id"], response.json()["key"], account)
    model = priced_model(api, api.clock.now() - timedelta(days=40), CENT_RATES)
    if billing == "prepaid":
        grant(api, account, 1000)
    return account, key, model


def _events(key: Key, model: str, cents: int, at: Any = None) -> list[dict[str, Any]]:
    return [usage_event(key, model, at, chat_usage(1000, 0)) for _ in range(cents)]


def _spend(api: Api, key: Key, model: str, cents: int, at: Any = None) -> dict[str, Any]:
    """``cents`` events of one cent each (at the clock's now unless ``at``), in one batch."""
    return ingest(api, *_events(key, model, cents, api.clock.now() if at is None else at))


def default_project(account: str) -> str:
    """The account's Default project's id: its own after ``proj_`` (docs/api.md#projects)."""
    return "proj_" + account.removeprefix("acct_")


def reached(api: Api, account: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events_of(api, account, REACHED)]


def _percents(api: Api, account: str) -> list[int]:
    return [data["percent"] for data in reached(api, account)]


class TestThresholds:
    def test_a_jump_past_both_fires_80_then_100_with_their_data(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _limited(api, 10, "week")
        _spend(api, key, model, 12)
        start, _ = window_bounds("week", api.clock.now())
        common = {
            "account_id": account,
            "limit_scope": "key",
            "api_key_id": key.id,
            "project_id": default_project(account),
            "member_id": None,
            "window": "week",
            "window_starts_at": format_timestamp(start),
            "spent_cents": "12",
            "spent_microcents": 12_000_000,
            "limit_cents": "10",
            "limit_microcents": 10_000_000,
        }
        assert reached(api, account) == [{**common, "percent": 80}, {**common, "percent": 100}]
        _spend(api, key, model, 5)
        assert _percents(api, account) == [80, 100]  # once per key, window and percent

    def test_80_alone_then_100_each_once_exactly_at_the_threshold(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _limited(api, 10)
        _spend(api, key, model, 7)  # 70%
        assert reached(api, account) == []
        _spend(api, key, model, 1)  # 80%: reached
        (first,) = reached(api, account)
        assert (first["percent"], first["spent_microcents"]) == (80, 8_000_000)
        _spend(api, key, model, 1)  # 90%
        assert _percents(api, account) == [80]
        _spend(api, key, model, 1)  # 100%: reached
        assert _percents(api, account) == [80, 100]
        assert reached(api, account)[1]["spent_microcents"] == 10_000_000
        _spend(api, key, model, 3)
        assert _percents(api, account) == [80, 100]

    def test_single_events_reach_them_one_by_one(self, hooks: Hooks) -> None:
        """One event per request: PostgreSQL's lean path (metering.usage.single)."""
        api = hooks.api
        account, key, model = _limited(api, 5)  # thresholds: 4 and 5 cents
        seen = []
        for _ in range(6):
            _spend(api, key, model, 1)
            seen.append(_percents(api, account))
        assert seen == [[], [], [], [80], [80, 100], [80, 100]]

    def test_a_fractional_limit_is_reached_exactly(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _limited(api, 2.5)  # 80% = exactly 2 cents
        _spend(api, key, model, 1)
        assert reached(api, account) == []
        _spend(api, key, model, 1)
        (event,) = reached(api, account)
        assert (event["percent"], event["limit_cents"], event["limit_microcents"]) == (
            80,
            "2.5",
            2_500_000,
        )
        _spend(api, key, model, 1)
        assert _percents(api, account) == [80, 100]

    def test_nothing_for_a_key_without_a_limit(self, hooks: Hooks) -> None:
        api = hooks.api
        account, limited, model = _limited(api, 10)
        free = create_key(api, account)  # the same account, no limit
        _spend(api, free, model, 20)
        assert reached(api, account) == []
        _spend(api, limited, model, 8)  # only its own charges count
        (event,) = reached(api, account)
        assert (event["api_key_id"], event["percent"]) == (limited.id, 80)

    def test_a_new_window_re_arms_and_late_usage_counts_in_its_own(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _limited(api, 10, "day")
        first_day = api.clock.now()
        _spend(api, key, model, 8)
        assert _percents(api, account) == [80]
        api.clock.advance(days=1)
        _spend(api, key, model, 7)  # a new day: 70% of it
        assert _percents(api, account) == [80]
        # Late usage of the day before counts in that day, not in today's window.
        _spend(api, key, model, 5, at=first_day)
        assert _percents(api, account) == [80]
        _spend(api, key, model, 1)  # today: 80%
        events = reached(api, account)
        assert [e["percent"] for e in events] == [80, 80]
        starts = [e["window_starts_at"] for e in events]
        assert starts == [
            format_timestamp(window_bounds("day", first_day)[0]),
            format_timestamp(window_bounds("day", api.clock.now())[0]),
        ]

    def test_a_replayed_batch_fires_nothing(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _limited(api, 10)
        batch = _events(key, model, 9, api.clock.now())
        body = ingest(api, *batch)
        assert [r["status"] for r in body["data"]] == ["recorded"] * 9
        assert _percents(api, account) == [80]
        replayed = ingest(api, *batch)
        assert [r["status"] for r in replayed["data"]] == ["duplicate"] * 9
        ingest(api, batch[-1])  # the crossing event alone, again
        assert _percents(api, account) == [80]
        assert reached(api, account)[0]["spent_microcents"] == 9_000_000


class TestDelivery:
    def test_delivered_to_the_accounts_endpoint_signed(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _limited(api, 4, "month")
        _other, other_key, other_model = _limited(api, 1, "month")
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), [REACHED], account)
            _spend(api, key, model, 5)
            _spend(api, other_key, other_model, 5)  # another account's: not sent here
            hooks.deliverer().run_once()
            messages = receiver.wait_for(2)
            hooks.deliverer().run_once()
        bodies = [verified(endpoint["secret"], m) for m in messages]
        assert len(bodies) == 2 and {b["type"] for b in bodies} == {REACHED}
        assert len({m.headers["webhook-id"] for m in messages}) == 2
        start, _ = window_bounds("month", api.clock.now())
        by_percent = {b["data"]["percent"]: b["data"] for b in bodies}
        assert by_percent[100] == {
            "account_id": account,
            "limit_scope": "key",
            "api_key_id": key.id,
            "project_id": default_project(account),
            "member_id": None,
            "window": "month",
            "window_starts_at": format_timestamp(start),
            "spent_cents": 5,
            "spent_microcents": 5_000_000,
            "limit_cents": 4,
            "limit_microcents": 4_000_000,
            "percent": 100,
        }
        assert by_percent[80]["spent_cents"] == 5
