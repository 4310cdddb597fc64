"""Holds (docs/api.md#post-v1authorizations): 402s, spend limits, idempotency, voids, expiry, the
admin list and /metrics, on both backends. Expected figures are computed here from the rules."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from metering.ledger.authorizations import expire_holds
from metering.ledger.settlement import ChargeToSettle
from metering.usage.recording import settle_usage
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    assert_error,
    authorization_request,
    authorize,
    create_key,
    credits_of,
    exact_json,
    expect,
    grant,
)
from tests.ledger.helpers import add_key_spend, books, expected_estimate, holds, prepaid

# A chat request of 1000 prompt tokens and max_tokens 100 at GLM rates: 22,000 + 33,900.
ESTIMATE = expected_estimate(1000, 100, GLM_RATES)
TTL = timedelta(hours=1)


def cents(microcents: int) -> Decimal:
    return Decimal(microcents) / 10**6


class TestInsufficientCredits:
    def test_no_credit_at_all(self, api: Api) -> None:
        setup = prepaid(api)
        response = authorize(api, setup.key, setup.model)
        assert_error(response, 402, "insufficient_credits", param=None)
        error = exact_json(response)["error"]
        assert error["credits_available_cents"] == 0
        assert error["credits_required_cents_estimate"] == cents(ESTIMATE)
        assert holds(api, setup.account) == []

    def test_exactly_enough_is_granted_and_one_microcent_less_is_not(self, api: Api) -> None:
        setup = prepaid(api, cents(2 * ESTIMATE - 1))
        assert authorize(api, setup.key, setup.model).status_code == 200
        response = authorize(api, setup.key, setup.model)
        assert_error(response, 402, "insufficient_credits")
        error = exact_json(response)["error"]
        assert error["credits_available_cents"] == cents(ESTIMATE - 1)
        grant(api, setup.account, Decimal("0.000001"))
        assert authorize(api, setup.key, setup.model).status_code == 200
        assert credits_of(api, setup.key)["available_microcents"] == 0

    def test_holds_of_every_key_of_the_account_count(self, api: Api) -> None:
        setup = prepaid(api, cents(ESTIMATE))
        other_key = create_key(api, setup.account)
        assert authorize(api, other_key, setup.model).status_code == 200
        assert_error(authorize(api, setup.key, setup.model), 402, "insufficient_credits")

    def test_a_negative_balance_is_reported_as_it_is(self, api: Api) -> None:
        setup = prepaid(api)
        response = api.admin(
            "POST",
            f"/admin/v1/accounts/{setup.account}/adjustments",
            json={"amount_cents": -5.25, "idempotency_key": "neg", "reason": "correction"},
        )
        assert response.status_code == 201
        response = authorize(api, setup.key, setup.model)
        assert exact_json(response)["error"]["credits_available_cents"] == Decimal("-5.25")

    def test_unbilled_accounts_always_pass_and_the_hold_is_recorded(self, api: Api) -> None:
        setup = prepaid(api, billing="unbilled", limit_cents=0)
        for _ in range(3):
            response = authorize(api, setup.key, setup.model, max_tokens=None)
            assert response.status_code == 200, response.text
        assert len(holds(api, setup.account)) == 3
        assert all(hold.status == "active" for hold in holds(api, setup.account))


class TestMemberSpendLimit:
    def test_month_to_date_charges_plus_holds_plus_estimate(self, api: Api) -> None:
        spent = 1_000_000
        limit = spent + 2 * ESTIMATE
        setup = prepaid(api, 100, limit_cents=cents(limit))
        add_key_spend(api, setup.key, NOW.replace(day=1), spent // 2)
        add_key_spend(api, setup.key, NOW, spent - spent // 2)
        assert authorize(api, setup.key, setup.model).status_code == 200
        assert authorize(api, setup.key, setup.model).status_code == 200
        response = authorize(api, setup.key, setup.model)
        assert_error(response, 402, "member_spend_limit", param=None)
        error = exact_json(response)["error"]
        assert error["credits_required_cents_estimate"] == cents(ESTIMATE)
        assert error["monthly_spend_limit_cents"] == cents(limit)
        # Another key of the account is not limited by this one's spending.
        other = create_key(api, setup.account)
        assert authorize(api, other, setup.model).status_code == 200

    def test_only_this_months_daily_key_totals_count(self, api: Api) -> None:
        setup = prepaid(api, 100, limit_cents=cents(ESTIMATE))
        last_month = NOW.replace(day=1) - timedelta(days=1)
        add_key_spend(api, setup.key, last_month, 10**9)
        next_month = (NOW.replace(day=28) + timedelta(days=4)).replace(day=1)
        add_key_spend(api, setup.key, next_month, 10**9)
        add_key_spend(api, setup.key, NOW, 10**9, grouping="key_model")
        other = create_key(api, setup.account)
        add_key_spend(api, other, NOW, 10**9)
        assert authorize(api, setup.key, setup.model).status_code == 200
        assert_error(authorize(api, setup.key, setup.model), 402, "member_spend_limit")

    def test_the_month_is_utc_and_turns_over(self, api: Api) -> None:
        setup = prepaid(api, 100, limit_cents=cents(ESTIMATE))
        add_key_spend(api, setup.key, NOW, 1)
        assert_error(authorize(api, setup.key, setup.model), 402, "member_spend_limit")
        api.clock.set((NOW.replace(day=28) + timedelta(days=4)).replace(day=1))
        assert authorize(api, setup.key, setup.model).status_code == 200

    def test_released_holds_stop_counting(self, api: Api) -> None:
        setup = prepaid(api, 100, limit_cents=cents(ESTIMATE))
        hold = authorize(api, setup.key, setup.model).json()
        assert_error(authorize(api, setup.key, setup.model), 402, "member_spend_limit")
        assert api.gateway("DELETE", f"/v1/authorizations/{hold['id']}").status_code == 200
        hold = authorize(api, setup.key, setup.model).json()
        api.clock.set(NOW + TTL)
        assert authorize(api, setup.key, setup.model).status_code == 200

    def test_credit_is_checked_first(self, api: Api) -> None:
        setup = prepaid(api, 0, limit_cents=0)
        assert_error(authorize(api, setup.key, setup.model), 402, "insufficient_credits")

    def test_raising_the_limit_takes_effect_at_once(self, api: Api) -> None:
        setup = prepaid(api, 100, limit_cents=0)
        assert_error(authorize(api, setup.key, setup.model), 402, "member_spend_limit")
        response = api.admin(
            "PATCH", f"/admin/v1/api-keys/{setup.key.id}", json={"monthly_spend_limit_cents": None}
        )
        assert response.status_code == 200
        assert authorize(api, setup.key, setup.model).status_code == 200


class TestIdempotency:
    def test_the_same_request_returns_the_same_authorization_without_a_second_hold(
        self, api: Api
    ) -> None:
        setup = prepaid(api, 1)
        body = authorization_request(setup.key, setup.model, request_id="req-1")
        first = api.gateway("POST", "/v1/authorizations", json=body)
        assert first.status_code == 200
        api.clock.advance(seconds=5)
        for variant in (body, {**body, "model": setup.model.lower()}, {**body, "n": 1}):
            again = api.gateway("POST", "/v1/authorizations", json=variant)
            assert again.status_code == 200, again.text
            assert again.json() == first.json()
        assert len(holds(api, setup.account)) == 1
        assert credits_of(api, setup.key)["held_microcents"] == ESTIMATE

    def test_a_retry_is_not_refused_for_the_credit_its_own_hold_takes(self, api: Api) -> None:
        setup = prepaid(api, cents(ESTIMATE))
        body = authorization_request(setup.key, setup.model, request_id="req-2")
        first = api.gateway("POST", "/v1/authorizations", json=body)
        again = api.gateway("POST", "/v1/authorizations", json=body)
        assert (first.status_code, again.status_code) == (200, 200)
        assert first.json()["id"] == again.json()["id"]

    @pytest.mark.parametrize(
        "change",
        [
            {"prompt_tokens": 1001},
            {"max_tokens": 101},
            {"max_tokens": None},
            {"n": 2},
            {"reasoning": True},
            {"api": "responses"},
        ],
        ids=str,
    )
    def test_a_different_request_with_the_same_id_is_409(
        self, api: Api, change: dict[str, Any]
    ) -> None:
        setup = prepaid(api, 1)
        body = authorization_request(setup.key, setup.model, request_id="req-3")
        assert api.gateway("POST", "/v1/authorizations", json=body).status_code == 200
        changed = {**body, **change}
        changed = {k: v for k, v in changed.items() if v is not None}
        response = api.gateway("POST", "/v1/authorizations", json=changed)
        assert_error(response, 409, "idempotency_conflict", param="request_id")
        assert len(holds(api, setup.account)) == 1

    def test_another_key_of_the_account_with_the_same_id_is_409(self, api: Api) -> None:
        setup = prepaid(api, 1)
        other = create_key(api, setup.account)
        assert authorize(api, setup.key, setup.model, request_id="shared").status_code == 200
        response = authorize(api, other, setup.model, request_id="shared")
        assert_error(response, 409, "idempotency_conflict", param="request_id")

    def test_request_ids_are_scoped_to_the_account(self, api: Api) -> None:
        first, second = prepaid(api, 1), prepaid(api, 1)
        a = authorize(api, first.key, first.model, request_id="same")
        b = authorize(api, second.key, second.model, request_id="same")
        assert (a.status_code, b.status_code) == (200, 200)
        assert a.json()["id"] != b.json()["id"]

    def test_without_a_request_id_each_call_is_a_new_hold(self, api: Api) -> None:
        setup = prepaid(api, 1)
        body = authorization_request(setup.key, setup.model, request_id=None)
        ids = {api.gateway("POST", "/v1/authorizations", json=body).json()["id"] for _ in range(2)}
        assert len(ids) == 2
        assert all(hold.request_id is None for hold in holds(api, setup.account))

    def test_the_retry_sees_the_authorization_as_it_now_stands(self, api: Api) -> None:
        setup = prepaid(api, cents(ESTIMATE))
        body = authorization_request(setup.key, setup.model, request_id="req-4")
        hold = api.gateway("POST", "/v1/authorizations", json=body).json()
        expect(api.gateway("DELETE", f"/v1/authorizations/{hold['id']}"), 200)
        again = api.gateway("POST", "/v1/authorizations", json=body)
        assert again.status_code == 200
        assert again.json() == {**hold, "status": "voided"}
        assert credits_of(api, setup.key)["held_microcents"] == 0

        expiring = authorization_request(setup.key, setup.model, request_id="req-5")
        hold = api.gateway("POST", "/v1/authorizations", json=expiring).json()
        api.clock.set(NOW + TTL)
        again = api.gateway("POST", "/v1/authorizations", json=expiring)
        assert again.json() == {**hold, "status": "expired"}

    def test_the_retry_wins_over_later_catalog_changes(self, api: Api) -> None:
        tomorrow = (NOW + timedelta(days=1)).date().isoformat()
        setup = prepaid(api, 1, deprecation_date=tomorrow)
        body = authorization_request(setup.key, setup.model, request_id="req-6")
        hold = api.gateway("POST", "/v1/authorizations", json=body).json()
        api.clock.set(NOW + timedelta(days=1))
        again = api.gateway("POST", "/v1/authorizations", json=body)
        assert again.status_code == 200, again.text
        assert again.json() == {**hold, "status": "expired"}
        fresh = {**body, "request_id": "req-7"}
        response = api.gateway("POST", "/v1/authorizations", json=fresh)
        assert_error(response, 404, "model_not_found", param="model")


class TestVoidAndExpiry:
    def test_void_releases_the_hold(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = authorize(api, setup.key, setup.model).json()
        assert credits_of(api, setup.key)["held_microcents"] == ESTIMATE
        response = api.gateway("DELETE", f"/v1/authorizations/{hold['id']}")
        assert response.status_code == 200
        assert response.json() == {**hold, "status": "voided"}
        assert credits_of(api, setup.key)["held_microcents"] == 0
        again = api.gateway("DELETE", f"/v1/authorizations/{hold['id']}")
        assert again.status_code == 200
        assert again.json() == {**hold, "status": "voided"}
        [row] = holds(api, setup.account)
        assert (row.status, row.closed_at) == ("voided", NOW)

    def test_unknown_id_is_404(self, api: Api) -> None:
        response = api.gateway("DELETE", "/v1/authorizations/auth_nope")
        assert_error(response, 404, "not_found", param="authorization_id")

    def test_a_hold_counts_until_its_expires_at_exactly(self, api: Api) -> None:
        setup = prepaid(api, cents(ESTIMATE))
        hold = authorize(api, setup.key, setup.model).json()
        assert hold["expires_at"] == "2026-11-29T13:00:00Z"
        api.clock.set(NOW + TTL - timedelta(microseconds=1))
        body = credits_of(api, setup.key)
        assert (body["held_microcents"], body["available_microcents"]) == (ESTIMATE, 0)
        assert_error(authorize(api, setup.key, setup.model), 402, "insufficient_credits")
        api.clock.set(NOW + TTL)
        body = credits_of(api, setup.key)
        assert (body["held_microcents"], body["available_microcents"]) == (0, ESTIMATE)
        assert authorize(api, setup.key, setup.model).status_code == 200

    def test_voiding_an_expired_hold_is_harmless(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = authorize(api, setup.key, setup.model).json()
        api.clock.set(NOW + TTL)
        response = api.gateway("DELETE", f"/v1/authorizations/{hold['id']}")
        assert response.status_code == 200
        assert response.json()["status"] == "expired"
        [row] = holds(api, setup.account)
        assert row.status == "active"  # unchanged: it reads as expired from its expires_at

    def test_voiding_a_settled_hold_leaves_it_settled(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = authorize(api, setup.key, setup.model).json()
        settle(api, setup, hold, 10)
        response = api.gateway("DELETE", f"/v1/authorizations/{hold['id']}")
        assert response.json()["status"] == "settled"

    def test_the_ttl_is_the_configured_one(self, api: Api) -> None:
        setup = prepaid(api, 1)
        saved = api.settings.hold_ttl_seconds
        api.settings.hold_ttl_seconds = 90
        try:
            hold = authorize(api, setup.key, setup.model).json()
        finally:
            api.settings.hold_ttl_seconds = saved
        assert hold["expires_at"] == "2026-11-29T12:01:30Z"


def settle(api: Api, setup: Any, hold: dict[str, Any], charge: int, event_id: int = 1) -> None:
    with api.database.unit_of_work() as session:
        settle_usage(
            session,
            [
                ChargeToSettle(
                    account_id=setup.account,
                    api_key_id=setup.key.id,
                    request_id=hold["request_id"],
                    usage_event_id=event_id,
                    charge_microcents=charge,
                    authorization_id=hold["id"],
                    prepaid=True,
                )
            ],
            (),
            api.clock.now(),
        )
        session.commit()


class TestAdminList:
    def listing(self, api: Api, **params: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        params = {"limit": 2, **params}
        while True:
            response = api.admin("GET", "/admin/v1/authorizations", params=params)
            assert response.status_code == 200, response.text
            body = response.json()
            found += body["data"]
            if not body["has_more"]:
                return found
            params["after"] = body["next_cursor"]

    def test_filters_by_status_as_holds_now_read(self, api: Api) -> None:
        setup = prepaid(api, 1)
        made = []
        for _ in range(5):
            made.append(authorize(api, setup.key, setup.model).json())
            api.clock.advance(minutes=1)
        settle(api, setup, made[0], 5)
        expect(api.gateway("DELETE", f"/v1/authorizations/{made[1]['id']}"), 200)
        api.clock.set(NOW + TTL + timedelta(minutes=2, seconds=30))  # made[2] expired, [3:] not
        with api.database.unit_of_work() as session:
            assert expire_holds(session, NOW + TTL + timedelta(seconds=30)) >= 0
            session.commit()
        statuses = {
            status: [h["id"] for h in self.listing(api, status=status, account_id=setup.account)]
            for status in ("active", "settled", "voided", "expired")
        }
        assert statuses == {
            "active": [made[4]["id"], made[3]["id"]],
            "settled": [made[0]["id"]],
            "voided": [made[1]["id"]],
            "expired": [made[2]["id"]],
        }
        everything = self.listing(api, account_id=setup.account)
        assert [h["id"] for h in everything] == [h["id"] for h in reversed(made)]
        first = everything[-1]
        assert first["status"] == "settled" and first["usage_event_id"] == 1
        assert first["created_at"] == "2026-11-29T12:00:00Z"

    def test_expired_without_the_sweeper_too(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = authorize(api, setup.key, setup.model).json()
        assert self.listing(api, status="expired", account_id=setup.account) == []
        api.clock.set(NOW + TTL)
        [listed] = self.listing(api, status="expired", account_id=setup.account)
        assert (listed["id"], listed["status"]) == (hold["id"], "expired")

    def test_a_foreign_cursor_is_400(self, api: Api) -> None:
        for after in ("garbage", "WyJ4Il0"):
            response = api.admin("GET", "/admin/v1/authorizations", params={"after": after})
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "after"

    def test_an_unknown_status_is_400(self, api: Api) -> None:
        response = api.admin("GET", "/admin/v1/authorizations", params={"status": "lost"})
        assert_error(response, 400, "unsupported_value", param="status")

    def test_admin_only(self, api: Api) -> None:
        response = api.gateway("GET", "/admin/v1/authorizations")
        assert_error(response, 401, "invalid_api_key")


class TestExpireHolds:
    def test_marks_only_holds_past_their_expiry(self, api: Api) -> None:
        setup = prepaid(api, 1)
        early = authorize(api, setup.key, setup.model).json()
        api.clock.advance(minutes=10)
        late = authorize(api, setup.key, setup.model).json()
        with api.database.unit_of_work() as session:
            swept = expire_holds(session, NOW + TTL)
            session.commit()
        assert swept >= 1
        by_id = {row.id: row.status for row in holds(api, setup.account)}
        assert by_id == {early["id"]: "expired", late["id"]: "active"}
        with api.database.unit_of_work() as session:
            assert expire_holds(session, NOW + TTL) == 0
            session.commit()
        # A late usage event still settles a swept hold: it did get its usage.
        settle(api, setup, early, 7, event_id=99)
        by_id = {row.id: row.status for row in holds(api, setup.account)}
        assert by_id[early["id"]] == "settled"


class TestMetrics:
    def sample(self, api: Api, series: str) -> int:
        """One series' value in /metrics (0 while it has never been counted)."""
        for line in api.client.get("/metrics").text.splitlines():
            name, _, value = line.rpartition(" ")
            if name == series:
                return int(float(value))
        return 0

    def test_outcomes_are_counted(self, api: Api) -> None:
        setup = prepaid(api, cents(ESTIMATE), limit_cents=cents(2 * ESTIMATE))
        names = {
            result: f'metering_authorizations_total{{result="{result}"}}'
            for result in ("granted", "replayed", "insufficient_credits", "member_spend_limit")
        }
        before = {result: self.sample(api, name) for result, name in names.items()}
        authorize(api, setup.key, setup.model, request_id="m1")
        authorize(api, setup.key, setup.model, request_id="m1")
        authorize(api, setup.key, setup.model)
        grant(api, setup.account, 1)
        authorize(api, setup.key, setup.model)
        authorize(api, setup.key, setup.model)
        after = {result: self.sample(api, name) for result, name in names.items()}
        assert {r: after[r] - before[r] for r in names} == {
            "granted": 2,
            "replayed": 1,
            "insufficient_credits": 1,
            "member_spend_limit": 1,
        }

    def test_expired_holds_are_a_database_gauge(self, api: Api) -> None:
        name = "metering_authorizations_expired_without_usage"
        # An instant no other test uses: the gauge counts the whole database's holds.
        start = NOW + timedelta(days=3, microseconds=424_242)
        api.clock.set(start)
        setup = prepaid(api, 1)
        hold = authorize(api, setup.key, setup.model).json()
        settled = authorize(api, setup.key, setup.model).json()
        settle(api, setup, settled, 1)
        voided = authorize(api, setup.key, setup.model).json()
        expect(api.gateway("DELETE", f"/v1/authorizations/{voided['id']}"), 200)
        api.clock.set(start + TTL - timedelta(microseconds=1))
        before = self.sample(api, name)
        api.clock.set(start + TTL)
        assert self.sample(api, name) == before + 1
        settle(api, setup, hold, 1, event_id=2)  # late usage: no longer lost
        assert self.sample(api, name) == before


class TestBooks:
    def test_ledger_holds_and_balance_agree_after_a_mixed_history(self, api: Api) -> None:
        setup = prepaid(api, 1)
        made = [authorize(api, setup.key, setup.model).json() for _ in range(4)]
        settle(api, setup, made[0], 12_345)
        settle(api, setup, made[1], ESTIMATE * 3)  # above its hold: charged in full
        expect(api.gateway("DELETE", f"/v1/authorizations/{made[2]['id']}"), 200)
        balance, total = books(api, setup.account)
        assert balance == total == 1_000_000 - 12_345 - 3 * ESTIMATE
        body = credits_of(api, setup.key)
        assert body["held_microcents"] == ESTIMATE
        assert body["available_microcents"] == balance - ESTIMATE
