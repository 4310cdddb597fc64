"""Webhook event types (docs/api.md#event-types): each fires once per crossing, in the transaction
that crosses, with the right ``data``; re-armed after recovery; exact under concurrency; nothing
from a rollback."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import select

from metering.ledger.service import add_entry
from metering.models import WebhookEvent
from metering.notifications import outbox
from metering.notifications.messages import render_data
from metering.scheduler import Scheduler
from metering.usage.service import record_events
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
from tests.threads import workers

# One cent per event: 1000 prompt tokens at 1000 cents per million, output free.
CENT_RATES = (1_000_000_000, 0, 0)


def events_of(api: Api, account_id: str | None, type_: str | None = None) -> list[dict[str, Any]]:
    with api.database.reading() as session:
        # In the order they were made: by time, then id. On a Citus cluster an event written in
        # a call delegated to a worker (a single event's) takes its id from that worker's range
        # of the sequence, so ids alone do not follow time across nodes.
        query = select(WebhookEvent).order_by(WebhookEvent.created_at, WebhookEvent.id)
        query = query.where(WebhookEvent.account_id == outbox.stored_account(account_id))
        if type_ is not None:
            query = query.where(WebhookEvent.type == type_)
        rows = session.execute(query).scalars().all()
        return [
            {
                "type": e.type,
                "data": render_data(outbox.shown_account(e.account_id), e.data),
                "id": e.public_id,
            }
            for e in rows
        ]


def types_of(api: Api, account_id: str) -> list[str]:
    return [e["type"] for e in events_of(api, account_id)]


def _threshold(api: Api, account_id: str, cents: Any) -> None:
    response = api.admin(
        "PATCH", f"/admin/v1/accounts/{account_id}", json={"low_balance_threshold_cents": cents}
    )
    assert response.status_code == 200, response.text
    assert response.json()["low_balance_threshold_cents"] == cents


def _spend(api: Api, key: Key, model: str, cents: int) -> None:
    """``cents`` events of one cent each, in one batch."""
    now = api.clock.now()
    ingest(
        api,
        *(
            usage_event(key, model, now - timedelta(minutes=1), chat_usage(1000, 0))
            for _ in range(cents)
        ),
    )


def _account(api: Api, balance_cents: int, threshold_cents: Any) -> tuple[str, Key, str]:
    account = create_account(api)
    key = create_key(api, account)
    model = priced_model(api, api.clock.now() - timedelta(days=1), CENT_RATES)
    grant(api, account, balance_cents)
    if threshold_cents is not None:
        _threshold(api, account, threshold_cents)
    return account, key, model


class TestBalanceLow:
    def test_once_per_crossing_with_its_data_then_re_armed(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 10, 5)
        _spend(api, key, model, 4)  # 10 → 6: above
        assert types_of(api, account) == []
        _spend(api, key, model, 2)  # 6 → 4: crosses
        _spend(api, key, model, 1)  # 4 → 3: still below, nothing more
        low = events_of(api, account, "credit.balance_low")
        assert [e["data"] for e in low] == [
            {
                "account_id": account,
                "balance_cents": "4",
                "balance_microcents": 4_000_000,
                "threshold_cents": "5",
                "threshold_microcents": 5_000_000,
            }
        ]
        grant(api, account, 2)  # 3 → 5: at the threshold again: re-armed
        _spend(api, key, model, 1)  # 5 → 4: crosses again
        assert types_of(api, account) == ["credit.balance_low", "credit.balance_low"]

    def test_a_threshold_set_above_the_balance_fires_nothing_until_recovery(
        self, hooks: Hooks
    ) -> None:
        api = hooks.api
        account, key, model = _account(api, 3, None)
        _threshold(api, account, 5.5)
        _spend(api, key, model, 1)
        assert types_of(api, account) == []
        grant(api, account, 3)  # 2 → 5: still below 5.5
        _spend(api, key, model, 1)
        assert types_of(api, account) == []
        grant(api, account, 2)  # 4 → 6: recovered
        _spend(api, key, model, 1)  # 6 → 5: crosses
        (event,) = events_of(api, account)
        assert event["data"]["threshold_cents"] == "5.5"

    def test_a_negative_adjustment_crosses_too(self, hooks: Hooks) -> None:
        api = hooks.api
        account, _, _ = _account(api, 10, 5)
        response = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/adjustments",
            json={"amount_cents": -12, "idempotency_key": unique("adj"), "reason": "correction"},
        )
        assert response.status_code == 201, response.text
        assert types_of(api, account) == ["credit.balance_low", "credit.balance_depleted"]
        depleted = events_of(api, account, "credit.balance_depleted")[0]
        assert depleted["data"]["balance_cents"] == "-2"

    def test_crossings_are_delivered_in_the_order_they_happened_whichever_node_wrote_them(
        self, hooks: Hooks
    ) -> None:
        """Crossings by a negative adjustment (on Citus written by the coordinator) and by a
        single event (written by the worker the gateway's call was delegated to, which numbers
        its rows in a range of its own), fanned out together: the endpoint's deliveries are
        made, and listed, in the order the crossings happened."""
        api = hooks.api
        account, key, model = _account(api, 10, 5)
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["credit.balance_low"], account)
        for step in range(3):
            api.clock.advance(seconds=1)
            if step == 1:  # one event of 6 cents: 10 → 4
                ingest(api, usage_event(key, model, api.clock.now(), chat_usage(6000, 0)))
            else:
                response = api.admin(
                    "POST",
                    f"/admin/v1/accounts/{account}/adjustments",
                    json={"amount_cents": -6, "idempotency_key": unique("adj"), "reason": "r"},
                )
                assert response.status_code == 201, response.text
            grant(api, account, 6)  # 4 → 10: re-armed
        assert hooks.deliverer().fan_out() >= 3  # with other tests' events left undispatched
        made = [event["id"] for event in events_of(api, account)]  # by time, then id
        assert len(made) == 3
        listed = hooks.deliveries(endpoint["id"])  # newest first
        assert [delivery["event_id"] for delivery in listed] == made[::-1]

    def test_two_batches_that_together_cross_fire_one_event(self, hooks: Hooks) -> None:
        api = hooks.api
        accounts = [_account(api, 10, 5) for _ in range(4)]

        def spend(key: Key, model: str) -> None:
            _spend(api, key, model, 3)  # each alone: 10 → 7; together: 10 → 4

        with workers() as pool:
            for _, key, model in accounts:
                for _ in range(2):
                    pool.start(spend, key, model)
        for account, _, _ in accounts:
            assert types_of(api, account) == ["credit.balance_low"]
            (event,) = events_of(api, account)
            assert event["data"]["balance_cents"] == "4"


class TestDepleted:
    def test_from_above_zero_to_zero_or_below_once_then_re_armed(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 2, None)
        _spend(api, key, model, 2)  # 2 → 0
        _spend(api, key, model, 1)  # 0 → -1: not again
        assert [e["data"]["balance_cents"] for e in events_of(api, account)] == ["0"]
        grant(api, account, 2)  # -1 → 1: re-armed
        _spend(api, key, model, 3)  # 1 → -2
        assert types_of(api, account) == ["credit.balance_depleted"] * 2


class TestRollback:
    def test_a_rolled_back_settlement_writes_no_event(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 1, None)
        now = api.clock.now()
        with api.database.unit_of_work() as session:
            outcome = record_events(
                session,
                [usage_event(key, model, now - timedelta(minutes=1), chat_usage(1000, 0))],
                now,
            )
            assert len(outcome.results) == 1
            # The event is there inside the transaction…
            inside = (
                session.execute(select(WebhookEvent.type).where(WebhookEvent.account_id == account))
                .scalars()
                .all()
            )
            assert inside == ["credit.balance_depleted"]
            # …and the block ends without a commit: rolled back.
        assert types_of(api, account) == []
        with api.database.unit_of_work() as session:
            add_entry(session, account, "adjustment", -2_000_000, unique("adj"), "r", now)
        assert types_of(api, account) == []
        # The same change committed announces itself.
        _spend(api, key, model, 1)
        assert types_of(api, account) == ["credit.balance_depleted"]


class TestOperatorEvents:
    def test_quarantined_usage_is_counted_by_code_per_account(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 10, None)
        now = api.clock.now()
        ingest(
            api,
            usage_event(key, unique("NoSuchModel"), now - timedelta(minutes=1)),
            usage_event(key, unique("NoSuchModel"), now - timedelta(minutes=1)),
            usage_event(key, model, now + timedelta(days=2)),
            usage_event(key, model, now - timedelta(minutes=1), chat_usage(1000, 0)),
        )
        (event,) = events_of(api, account, "usage.quarantined")
        data = event["data"]
        assert data["account_id"] == account and data["count"] == 3
        assert sum(data["by_code"].values()) == 3 and len(data["by_code"]) == 2

    def test_a_hold_that_expires_unused_is_announced_once(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 100, None)
        response = api.gateway(
            "POST",
            "/v1/authorizations",
            json={
                "api_key": key.secret,
                "model": model,
                "api": "chat_completions",
                "prompt_tokens": 1000,
                "max_tokens": 10,
                "request_id": unique("req"),
            },
        )
        assert response.status_code in (200, 201), response.text
        hold = response.json()
        scheduler = Scheduler(api.database, api.settings, api.clock)
        try:
            scheduler.tick()
            assert events_of(api, account, "authorization.expired_unused") == []
            api.clock.advance(seconds=api.settings.hold_ttl_seconds + 1)
            scheduler.tick()
            scheduler.tick()
        finally:
            scheduler.close()
        (event,) = events_of(api, account, "authorization.expired_unused")
        assert event["data"] == {
            "account_id": account,
            "authorization_id": hold["id"],
            "api_key_id": key.id,
            "estimate_cents": "1",
            "estimate_microcents": 1_000_000,
        }

    def test_balance_events_reach_the_account_endpoint_signed(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 2, 1)
        _other, other_key, other_model = _account(api, 2, 1)
        with receiving() as receiver:
            endpoint = hooks.endpoint(
                receiver.url(), ["credit.balance_low", "credit.balance_depleted"], account
            )
            _spend(api, key, model, 2)
            _spend(api, other_key, other_model, 2)  # another account's: not sent here
            hooks.deliverer().run_once()
            messages = receiver.wait_for(2)
            hooks.deliverer().run_once()
        bodies = [verified(endpoint["secret"], m) for m in messages]
        assert len(bodies) == 2
        assert sorted(b["type"] for b in bodies) == [
            "credit.balance_depleted",
            "credit.balance_low",
        ]
        low = next(b for b in bodies if b["type"] == "credit.balance_low")
        assert low["data"] == {
            "account_id": account,
            "balance_cents": 0,
            "balance_microcents": 0,
            "threshold_cents": 1,
            "threshold_microcents": 1_000_000,
        }
        assert json.loads(messages[0].body)["id"] == messages[0].headers["webhook-id"]


class TestExportCompleted:
    def test_a_days_export_announces_its_manifest(self, hooks: Hooks) -> None:
        api = hooks.api
        _, key, model = _account(api, 100, None)
        day = (api.clock.now() - timedelta(days=1)).date()
        # After the price's start (a day before now) and before midnight.
        occurred = datetime.combine(day, time(23, 59), tzinfo=UTC)
        ingest(api, usage_event(key, model, occurred, chat_usage(1000, 0)))
        # Operator-wide events outlive a test, and another test's clock may have stood later
        # than this one's: the new event is the one whose id was not there before.
        before = {e["id"] for e in events_of(api, None, "export.completed")}
        scheduler = Scheduler(api.database, api.settings, api.clock)
        try:
            result = scheduler.exporter.export_day(day)
        finally:
            scheduler.close()
        assert result.outcome == "exported", result.describe()
        announced = [e for e in events_of(api, None, "export.completed") if e["id"] not in before]
        (event,) = announced
        data = event["data"]
        assert data["account_id"] is None and data["date"] == day.isoformat()
        manifest = json.loads(
            (api.settings.export_dir / day.isoformat() / "manifest.json").read_text()
        )
        assert data["manifest"] == manifest
