"""Webhook events with credit grants: every balance move of the grants' ledger (a charge that
also writes due expiries, a void, the scheduler's due expiries) writes its balance crossings
once, in its transaction, and each expiry entry its ``credit.grant_expired``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from metering.kit.timeutil import format_timestamp
from metering.scheduler import Scheduler
from tests.conftest import Api
from tests.factories import exact_json, unique
from tests.notifications.conftest import Hooks
from tests.notifications.test_events import _account, _spend, _threshold, events_of, types_of

HOUR = timedelta(hours=1)


def _promotional(api: Api, account: str, cents: int, expires: Any) -> dict[str, Any]:
    body = json.dumps(
        {
            "amount_cents": cents,
            "idempotency_key": unique("g"),
            "category": "promotional",
            "expires_at": format_timestamp(expires),
        }
    )
    response = api.client.post(
        f"/admin/v1/accounts/{account}/grants",
        content=body,
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    return dict(exact_json(response))


class TestGrantExpired:
    def test_a_charge_that_writes_a_due_expiry_crosses_once_with_it(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 3, 5)  # a paid grant of 3 cents
        promo = _promotional(api, account, 5, api.clock.now() + HOUR)  # balance 8 ≥ 5
        assert types_of(api, account) == []
        api.clock.advance(hours=2)
        _spend(api, key, model, 1)  # the expiry (8 → 3) and the charge (→ 2): one move
        assert types_of(api, account) == ["credit.grant_expired", "credit.balance_low"]
        (expired,) = events_of(api, account, "credit.grant_expired")
        assert expired["data"] == {
            "account_id": account,
            "grant_id": promo["id"],
            "forfeited_cents": "5",
            "forfeited_microcents": 5_000_000,
        }
        (low,) = events_of(api, account, "credit.balance_low")
        assert low["data"]["balance_microcents"] == 2_000_000
        _spend(api, key, model, 1)  # nothing more expires, still below
        assert len(events_of(api, account)) == 2

    def test_the_schedulers_due_expiries_cross_and_announce_once(self, hooks: Hooks) -> None:
        api = hooks.api
        account, _, _ = _account(api, 1, 5)  # a paid grant of 1 cent
        promo = _promotional(api, account, 9, api.clock.now() + HOUR)  # balance 10
        scheduler = Scheduler(api.database, api.settings, api.clock)
        try:
            scheduler.tick()
            assert types_of(api, account) == ["credit.grant_expiring"]  # within 7 days
            api.clock.advance(hours=2)
            scheduler.tick()  # writes the expiry: 10 → 1
            scheduler.tick()
        finally:
            scheduler.close()
        assert types_of(api, account) == [
            "credit.grant_expiring",
            "credit.grant_expired",
            "credit.balance_low",
        ]
        assert events_of(api, account, "credit.grant_expired")[0]["data"]["grant_id"] == promo["id"]

    def test_an_expiry_that_empties_the_balance_is_depleted(self, hooks: Hooks) -> None:
        api = hooks.api
        account, key, model = _account(api, 1, None)
        _spend(api, key, model, 1)  # 1 → 0: depleted
        assert types_of(api, account) == ["credit.balance_depleted"]
        _promotional(api, account, 4, api.clock.now() + HOUR)  # 0 → 4: re-armed
        api.clock.advance(hours=2)
        adjusted = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/adjustments",
            json={"amount_cents": 1, "idempotency_key": unique("adj"), "reason": "goodwill"},
        )
        assert adjusted.status_code == 201, adjusted.text  # writes the due expiry first: 4 → 0
        assert types_of(api, account) == [
            "credit.balance_depleted",
            "credit.grant_expired",
            "credit.balance_depleted",
        ]


class TestVoid:
    def test_a_void_crosses_the_thresholds(self, hooks: Hooks) -> None:
        api = hooks.api
        account, _, _ = _account(api, 2, None)
        voided = _promotional(api, account, 8, api.clock.now() + 24 * HOUR)
        _threshold(api, account, 5)
        response = api.admin(
            "POST", f"/admin/v1/grants/{voided['id']}/void", json={"reason": "chargeback"}
        )
        assert response.status_code == 200, response.text
        assert types_of(api, account) == ["credit.balance_low"]  # 10 → 2
        again = api.admin("POST", f"/admin/v1/grants/{voided['id']}/void", json={})
        assert again.status_code == 200, again.text
        assert types_of(api, account) == ["credit.balance_low"]  # nothing moved, nothing sent


class TestGrantExpiring:
    def test_once_per_grant_within_the_notice_days_from_the_scheduler(self, hooks: Hooks) -> None:
        api = hooks.api
        assert api.settings.grant_notice_days == 7
        account, _, _ = _account(api, 1, None)
        now = api.clock.now()
        soon = _promotional(api, account, 3, now + timedelta(days=6))
        later = _promotional(api, account, 4, now + timedelta(days=9))
        voided = _promotional(api, account, 1, now + timedelta(days=2))
        response = api.admin("POST", f"/admin/v1/grants/{voided['id']}/void", json={})
        assert response.status_code == 200, response.text
        scheduler = Scheduler(api.database, api.settings, api.clock)
        try:
            scheduler.tick()
            scheduler.tick()
            expiring = events_of(api, account, "credit.grant_expiring")
            assert [e["data"] for e in expiring] == [
                {
                    "account_id": account,
                    "grant_id": soon["id"],
                    "remaining_cents": "3",
                    "remaining_microcents": 3_000_000,
                    "expires_at": format_timestamp(now + timedelta(days=6)),
                }
            ]
            api.clock.advance(days=3)  # ``later`` is now 6 days from expiring
            scheduler.tick()
            scheduler.tick()
        finally:
            scheduler.close()
        grants = [e["data"]["grant_id"] for e in events_of(api, account, "credit.grant_expiring")]
        assert grants == [soon["id"], later["id"]]
        assert voided["id"] not in grants
