"""Auto-recharge against localstripe: the debit that takes the balance below the threshold marks
the recharge due in its own transaction; the scheduler's loop charges the saved card off-session,
one in flight per account, within the monthly limit, an hour after a failure at the earliest,
and disables it after three failures in a row; two schedulers at once charge once."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from metering.models import Account, Payment, WebhookEvent, table
from metering.payments.recharge import Recharger
from metering.scheduler import Scheduler
from tests.conftest import NOW
from tests.factories import (
    Key,
    assert_error,
    chat_usage,
    create_account,
    create_key,
    credits_of,
    grant,
    priced_model,
    usage_event,
)
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import Shop
from tests.payments.localstripe import CARD_DECLINED_ON_CHARGE
from tests.payments.test_saved_cards import _with_saved_card
from tests.portal.test_member_audit import _signed_in_as
from tests.threads import run_together

ACCOUNTS = table(Account)
PAYMENTS = table(Payment)
EVENTS = table(WebhookEvent)


def _put(shop: Shop, key: Key, **settings: Any) -> Any:
    body = {
        "enabled": True,
        "threshold_cents": 1000,
        "amount_cents": 2000,
        "monthly_limit_cents": 100_000,
        **settings,
    }
    return shop.api.admin("PUT", f"/admin/v1/accounts/{key.account_id}/auto-recharge", json=body)


def _balance(shop: Shop, key: Key) -> int:
    return int(credits_of(shop.api, key)["balance_microcents"])


def _recharges(shop: Shop, key: Key) -> list[Any]:
    with shop.api.database.reading() as session:
        return list(
            session.execute(
                select(PAYMENTS.c.status, PAYMENTS.c.amount_cents, PAYMENTS.c.failure_code)
                .where(PAYMENTS.c.account_id == key.account_id, PAYMENTS.c.kind == "auto_recharge")
                .order_by(PAYMENTS.c.created_at, PAYMENTS.c.id)
            ).all()
        )


def _events(shop: Shop, key: Key, type_: str) -> list[dict[str, Any]]:
    with shop.api.database.reading() as session:
        rows = session.execute(
            select(EVENTS.c.data)
            .where(EVENTS.c.account_id == key.account_id, EVENTS.c.type == type_)
            .order_by(EVENTS.c.created_at)
        ).scalars()
        return [json.loads(data) for data in rows]


def _due_at(shop: Shop, key: Key) -> Any:
    with shop.api.database.reading() as session:
        return session.execute(
            select(ACCOUNTS.c.recharge_due_at).where(ACCOUNTS.c.id == key.account_id)
        ).scalar()


def _pass(shop: Shop) -> int:
    return Recharger(shop.api.database, shop.api.settings, shop.api.clock).run_once()


class TestSettings:
    def test_read_and_replaced_and_audited(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        path = f"/admin/v1/accounts/{key.account_id}/auto-recharge"
        assert shop.api.admin("GET", path).json() == {
            "object": "auto_recharge",
            "account_id": key.account_id,
            "enabled": False,
            "threshold_cents": None,
            "amount_cents": None,
            "monthly_limit_cents": None,
        }
        grant(shop.api, key.account_id, 5000)
        answer = _put(shop, key, threshold_cents=1000, amount_cents=2000, monthly_limit_cents=4000)
        assert answer.status_code == 200, answer.text
        assert shop.api.admin("GET", path).json()["monthly_limit_cents"] == 4000
        assert _due_at(shop, key) is None  # $50 is not below $10
        audit = shop.api.admin(
            "GET", f"/admin/v1/audit-events?account_id={key.account_id}&action=auto_recharge.update"
        ).json()["data"]
        assert len(audit) == 1

    def test_set_in_the_portal_by_an_admin_member_audited_as_the_member(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        member = shop.api.admin(
            "POST",
            f"/admin/v1/accounts/{key.account_id}/members",
            json={"email": "finance@example.com", "role": "admin"},
        )
        assert member.status_code == 201, member.text
        # Above the threshold: nothing due for the other tests' recharge passes to charge.
        grant(shop.api, key.account_id, 5000)
        client, csrf = _signed_in_as(shop.api, key.account_id, member.json()["id"])
        form = {
            "csrf_token": csrf,
            "enabled": "1",
            "threshold": "10",
            "recharge_amount": "20",
            "monthly_limit": "100",
        }
        posted = client.post("/billing/payments/auto-recharge", data=form, follow_redirects=False)
        assert posted.status_code == 303, posted.text
        path = f"/admin/v1/accounts/{key.account_id}/auto-recharge"
        shown = shop.api.admin("GET", path).json()
        assert (shown["enabled"], shown["threshold_cents"], shown["amount_cents"]) == (
            True,
            1000,
            2000,
        )
        audit = shop.api.admin(
            "GET", f"/admin/v1/audit-events?account_id={key.account_id}&action=auto_recharge.update"
        ).json()["data"]
        assert [e["actor"] for e in audit] == [f"portal:{member.json()['id']}"]
        assert _due_at(shop, key) is None

    def test_bad_settings_change_nothing(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        assert_error(
            _put(shop, key, amount_cents=499), 400, "invalid_parameter", param="amount_cents"
        )
        assert_error(
            _put(shop, key, amount_cents=2000, monthly_limit_cents=1999),
            400,
            "invalid_parameter",
            param="monthly_limit_cents",
        )
        assert_error(
            _put(shop, key, threshold_cents=-1), 400, "invalid_parameter", param="threshold_cents"
        )
        assert_error(
            _put(shop, key, threshold_cents=10**19),
            400,
            "invalid_parameter",
            param="threshold_cents",
        )
        assert_error(_put(shop, key, enabled="yes"), 400, "invalid_parameter", param="enabled")
        path = f"/admin/v1/accounts/{key.account_id}/auto-recharge"
        assert shop.api.admin("GET", path).json()["enabled"] is False
        assert (
            shop.api.admin("GET", "/admin/v1/accounts/acct_nope/auto-recharge").status_code == 404
        )

    def test_enabling_needs_a_saved_card(self, shop: Shop) -> None:
        key = create_key(shop.api, create_account(shop.api))
        assert_error(_put(shop, key), 400, "payment_method_required", param="enabled")
        assert _put(shop, key, enabled=False).status_code == 200


class TestRecharging:
    def test_fifty_concurrent_debits_crossing_make_one_recharge(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        model = priced_model(shop.api, NOW - timedelta(days=1))
        grant(shop.api, key.account_id, 10_000)
        events = [
            usage_event(key, model, NOW - timedelta(seconds=1), chat_usage(1_000_000, 100_000))
            for _ in range(51)
        ]
        start = _balance(shop, key)
        ingested = shop.api.gateway("POST", "/v1/usage/events", json={"events": [events[0]]})
        assert ingested.status_code == 200, ingested.text
        cost = start - _balance(shop, key)
        assert cost > 0
        # The threshold lies half-way down the fifty debits still to come.
        threshold_cents = (start - cost - 25 * cost) // MICROCENTS_PER_CENT
        assert (
            _put(shop, key, threshold_cents=threshold_cents, amount_cents=5000).status_code == 200
        )
        assert _due_at(shop, key) is None

        def debit(event: dict[str, Any]) -> Any:
            return lambda: shop.api.gateway("POST", "/v1/usage/events", json={"events": [event]})

        answers = run_together(*(debit(event) for event in events[1:]))
        assert [a.status_code for a in answers] == [200] * 50
        assert _due_at(shop, key) is not None  # written by the debit that crossed
        assert _recharges(shop, key) == []  # nothing charged on the gateway's path
        low = _balance(shop, key)
        assert low == start - 51 * cost
        scheduler = Scheduler(shop.api.database, shop.api.settings, shop.api.clock)
        assert scheduler.recharge() == 1
        assert scheduler.recharge() == 0
        assert [tuple(r) for r in _recharges(shop, key)] == [("succeeded", 5000, None)]
        assert _balance(shop, key) == low + 5000 * MICROCENTS_PER_CENT
        assert _due_at(shop, key) is None  # back above the threshold: the mark cleared
        succeeded = _events(shop, key, "payment.succeeded")
        assert [e["kind"] for e in succeeded] == ["auto_recharge"]

    def test_two_schedulers_at_once_charge_once(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        assert _put(shop, key, threshold_cents=1000, amount_cents=2000).status_code == 200
        assert _due_at(shop, key) is not None  # enabled below the threshold: due at once
        first = Recharger(shop.api.database, shop.api.settings, shop.api.clock)
        second = Recharger(shop.api.database, shop.api.settings, shop.api.clock)
        charged = run_together(first.run_once, second.run_once, first.run_once, second.run_once)
        assert sum(charged) == 1
        assert [tuple(r) for r in _recharges(shop, key)] == [("succeeded", 2000, None)]
        assert _balance(shop, key) == 2000 * MICROCENTS_PER_CENT

    def test_still_below_after_a_recharge_another_follows_up_to_the_monthly_limit(
        self, shop: Shop
    ) -> None:
        key = _with_saved_card(shop)
        answer = _put(
            shop, key, threshold_cents=10_000, amount_cents=3000, monthly_limit_cents=6000
        )
        assert answer.status_code == 200
        assert _pass(shop) == 1
        assert _pass(shop) == 1  # $30 is still below $100: another, 6,000 ≤ 6,000 cents
        assert _pass(shop) == 0  # a third would pass the limit
        assert _pass(shop) == 0
        assert [r.amount_cents for r in _recharges(shop, key)] == [3000, 3000]
        assert _balance(shop, key) == 6000 * MICROCENTS_PER_CENT
        assert _events(shop, key, "auto_recharge.limit_reached") == [
            {
                "monthly_limit_microcents": 6000 * MICROCENTS_PER_CENT,
                "recharged_microcents": 6000 * MICROCENTS_PER_CENT,
            }
        ]
        assert _due_at(shop, key) is not None  # still due: next month
        shop.api.clock.set(NOW + timedelta(days=3))  # December
        assert _pass(shop) == 1
        assert _balance(shop, key) == 9000 * MICROCENTS_PER_CENT

    def test_a_decline_backs_off_an_hour_and_three_disable_it(self, shop: Shop) -> None:
        key = _with_saved_card(shop, CARD_DECLINED_ON_CHARGE)
        assert _put(shop, key).status_code == 200
        assert _pass(shop) == 1
        assert [r.status for r in _recharges(shop, key)] == ["failed"]
        failed = _events(shop, key, "payment.failed")
        assert [(e["kind"], e["failure_code"]) for e in failed] == [
            ("auto_recharge", "card_declined")
        ]
        shop.api.clock.advance(minutes=59)
        assert _pass(shop) == 0  # within the hour of the failure
        shop.api.clock.advance(minutes=2)
        assert _pass(shop) == 1
        shop.api.clock.advance(minutes=61)
        assert _pass(shop) == 1
        assert [r.status for r in _recharges(shop, key)] == ["failed"] * 3
        assert _events(shop, key, "auto_recharge.disabled") == [{"reason": "3_failures_in_a_row"}]
        path = f"/admin/v1/accounts/{key.account_id}/auto-recharge"
        assert shop.api.admin("GET", path).json()["enabled"] is False
        assert _due_at(shop, key) is None
        shop.api.clock.advance(hours=2)
        assert _pass(shop) == 0
        assert len(_recharges(shop, key)) == 3
        assert _balance(shop, key) == 0


class TestDueMark:
    """Every move that takes the balance below the threshold marks the recharge due with it."""

    def _armed(self, shop: Shop, expires_at: Any = None) -> tuple[Key, str]:
        key = _with_saved_card(shop)
        body: dict[str, Any] = {"amount_cents": 5000, "idempotency_key": f"g-{key.account_id}"}
        if expires_at is not None:
            body["expires_at"] = expires_at
        answer = shop.api.admin("POST", f"/admin/v1/accounts/{key.account_id}/grants", json=body)
        assert answer.status_code == 201, answer.text
        assert _put(shop, key, threshold_cents=1000).status_code == 200
        assert _due_at(shop, key) is None
        return key, str(answer.json()["id"])

    def test_a_void_below_the_threshold(self, shop: Shop) -> None:
        key, grant_id = self._armed(shop)
        voided = shop.api.admin("POST", f"/admin/v1/grants/{grant_id}/void", json={})
        assert voided.status_code == 200, voided.text
        assert _due_at(shop, key) == shop.api.clock.now()
        assert _pass(shop) == 1
        assert _balance(shop, key) == 2000 * MICROCENTS_PER_CENT

    def test_an_expiry_below_the_threshold(self, shop: Shop) -> None:
        key, _ = self._armed(shop, expires_at="2026-11-29T13:00:00Z")
        shop.api.clock.set(NOW + timedelta(hours=2))
        Scheduler(shop.api.database, shop.api.settings, shop.api.clock).tick()
        assert _due_at(shop, key) == shop.api.clock.now()
        assert _pass(shop) == 1
        assert _balance(shop, key) == 2000 * MICROCENTS_PER_CENT

    def test_disabled_marks_nothing(self, shop: Shop) -> None:
        key, grant_id = self._armed(shop)
        assert _put(shop, key, enabled=False).status_code == 200
        assert shop.api.admin("POST", f"/admin/v1/grants/{grant_id}/void", json={}).status_code
        assert _due_at(shop, key) is None
        assert _pass(shop) == 0


def test_a_claim_whose_scheduler_died_before_stripe_is_taken_over_once(shop: Shop) -> None:
    from metering.audit.service import Auditor
    from metering.payments.flows import create_payment
    from metering.states.payments import PaymentKind

    key = _with_saved_card(shop)
    assert _put(shop, key, threshold_cents=1000, amount_cents=2000).status_code == 200
    with shop.api.database.unit_of_work() as session:  # claimed, then the scheduler killed
        create_payment(
            session,
            key.account_id,
            PaymentKind.AUTO_RECHARGE,
            2000,
            shop.api.clock.now(),
            Auditor("scheduler"),
        )
        session.commit()
    assert _pass(shop) == 0  # still in flight
    shop.api.clock.advance(minutes=6)
    assert _pass(shop) == 1
    assert _pass(shop) == 0
    assert [tuple(r) for r in _recharges(shop, key)] == [("succeeded", 2000, None)]
    assert _balance(shop, key) == 2000 * MICROCENTS_PER_CENT


def test_two_scheduler_processes_at_once_charge_once(shop: Shop, tmp_path: Any) -> None:
    """Two ``metering scheduler --once`` processes on the same database, started together."""
    import os
    import subprocess
    import sys

    from tests.conftest import SECRET_KEY
    from tests.payments.conftest import stripe_settings

    key = _with_saved_card(shop)
    assert _put(shop, key, threshold_cents=1000, amount_cents=2000).status_code == 200
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": shop.api.url,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_EXPORT_DIR": str(tmp_path / "exports"),
            "METERING_LOG_LEVEL": "INFO",
            **{
                f"METERING_{name.upper()}": str(value)
                for name, value in stripe_settings(shop.stripe).items()
            },
        }
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "metering.cli", "scheduler", "--once"],
            env=env,
            stdout=(tmp_path / f"scheduler-{n}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        for n in range(2)
    ]
    for process in processes:
        process.wait(timeout=120)
    logs = "".join((tmp_path / f"scheduler-{n}.log").read_text() for n in range(2))
    assert "auto-recharge pass failed" not in logs, logs
    assert [tuple(r) for r in _recharges(shop, key)] == [("succeeded", 2000, None)], logs
    assert _balance(shop, key) == 2000 * MICROCENTS_PER_CENT
