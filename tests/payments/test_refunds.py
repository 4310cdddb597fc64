"""Refunds and disputes against localstripe: an operator's refund takes at most what the
payment's grant still holds, at once; a refund made in Stripe's dashboard (``charge.refunded``)
has the same effect once per refund, what the grant no longer holds taken as a deficit; a
dispute is an event and changes no credit; the roll-forward's identity holds with refunds."""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from metering.audit.service import Auditor
from metering.exports.rollforward import rows_of_day
from metering.models import LedgerEntry, PaymentRefund, WebhookEvent, table
from metering.payments import refunds
from metering.payments.flows import Payments
from tests.exports.test_rollforward import post
from tests.factories import Key, assert_error, credits_of
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import Shop, assert_verified
from tests.payments.localstripe import SECRET_KEY, event, sign
from tests.payments.test_saved_cards import _top_up, _with_saved_card

ENTRIES = table(LedgerEntry)
REFUNDS = table(PaymentRefund)


def _post_event(shop: Shop, body: dict[str, Any]) -> Any:
    payload = json.dumps(body).encode()
    return shop.api.client.post(
        "/v1/stripe/webhook",
        content=payload,
        headers={"Content-Type": "application/json", "Stripe-Signature": sign(payload)},
    )


def _delivered(shop: Shop, body: dict[str, Any]) -> None:
    answer = _post_event(shop, body)
    assert (answer.status_code, answer.json()) == (200, {"received": True}), answer.text


def _credits(shop: Shop, key: Key) -> dict[str, Any]:
    return dict(credits_of(shop.api, key))


def _paid(shop: Shop, amount_cents: int) -> tuple[Key, dict[str, Any]]:
    """An account with a saved card topped up by ``amount_cents`` (the payment, operators')."""
    key = _with_saved_card(shop)
    answer = _top_up(shop, key, amount_cents, f"paid-{amount_cents}")
    assert answer.status_code == 201, answer.text
    payment = answer.json()
    assert payment["status"] == "succeeded" and payment["refunded_cents"] == 0, payment
    return key, payment


def _spend(shop: Shop, key: Key, microcents: int) -> None:
    """A negative adjustment: spent from the live grants like a charge."""
    path = f"/admin/v1/accounts/{key.account_id}/adjustments"
    post(shop.api, path, -Decimal(microcents) / MICROCENTS_PER_CENT, reason="usage")


def _refund(shop: Shop, payment_id: str, **body: Any) -> Any:
    return shop.api.admin("POST", f"/admin/v1/payments/{payment_id}/refund", json=body)


def _operator_payment(shop: Shop, payment_id: str) -> dict[str, Any]:
    answer = shop.api.admin("GET", f"/admin/v1/payments/{payment_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _grant(shop: Shop, grant_id: str) -> dict[str, Any]:
    answer = shop.api.admin("GET", f"/admin/v1/grants/{grant_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _refund_entries(shop: Shop, account_id: str) -> list[tuple[int, str | None, str | None]]:
    with shop.api.database.reading() as session:
        return [
            (int(row.amount_microcents), row.grant_id, row.note)
            for row in session.execute(
                select(ENTRIES.c.amount_microcents, ENTRIES.c.grant_id, ENTRIES.c.note)
                .where(ENTRIES.c.account_id == account_id, ENTRIES.c.kind == "refund")
                .order_by(ENTRIES.c.id)
            )
        ]


def _events(shop: Shop, account_id: str, kind: str) -> list[dict[str, Any]]:
    events = table(WebhookEvent)
    with shop.api.database.reading() as session:
        return [
            json.loads(data)
            for (data,) in session.execute(
                select(events.c.data)
                .where(events.c.account_id == account_id, events.c.type == kind)
                .order_by(events.c.id)
            )
        ]


def _stripe_refund(shop: Shop, intent_id: str, amount_cents: int) -> dict[str, Any]:
    """A refund made in Stripe's dashboard (straight at Stripe, the service not told)."""
    answer = shop.stripe._request(
        "POST",
        "/v1/refunds",
        data={"payment_intent": intent_id, "amount": str(amount_cents)},
        headers={"Authorization": f"Bearer {SECRET_KEY}"},
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _charge_of(shop: Shop, intent_id: str) -> dict[str, Any]:
    intent = shop.stripe.get(f"/v1/payment_intents/{intent_id}")
    charge = intent["latest_charge"]
    charge_id = charge if isinstance(charge, str) else charge["id"]
    return shop.stripe.get(f"/v1/charges/{charge_id}")


def _rollforward_identities(shop: Shop, key: Key, day: date) -> list[Any]:
    """The day's roll-forward rows of the account, each with closing = opening + granted −
    spent − expired − voided − refunded, summing to its balance (the day is today)."""
    with shop.api.database.reading() as session:
        rows = [row for row in rows_of_day(session, day) if row.account_id == key.account_id]
    for row in rows:
        assert row.closing_microcents == (
            row.opening_microcents
            + row.granted_microcents
            - row.spent_microcents
            - row.expired_microcents
            - row.voided_microcents
            - row.refunded_microcents
        ), row
    balance = _credits(shop, key)["balance_microcents"]
    assert sum(row.closing_microcents for row in rows) == balance
    return rows


class TestOperatorRefund:
    def test_part_of_the_remainder_is_taken_from_the_grant_at_once(self, shop: Shop) -> None:
        key, payment = _paid(shop, 2500)
        spent = 2050 * MICROCENTS_PER_CENT + 1  # the grant then holds 449.999999 cents
        _spend(shop, key, spent)
        before = _credits(shop, key)

        answer = _refund(shop, payment["id"], amount_cents=200, reason="customer asked")

        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert (body["object"], body["status"], body["source"]) == (
            "refund",
            "succeeded",
            "operator",
        )
        assert (body["amount_cents"], body["reason"]) == (200, "customer asked")
        assert body["stripe_refund_id"].startswith("re_")
        assert body["payment"]["refunded_cents"] == 200
        after = _credits(shop, key)
        refunded = 200 * MICROCENTS_PER_CENT
        assert before["balance_microcents"] - after["balance_microcents"] == refunded
        held = 2500 * MICROCENTS_PER_CENT - spent - refunded
        assert _grant(shop, payment["grant_id"])["remaining_microcents"] == held
        assert after["deficit_microcents"] == 0
        assert _refund_entries(shop, key.account_id) == [
            (-refunded, payment["grant_id"], "customer asked")
        ]
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 200
        # Stripe refunded exactly that, and was never told the reason.
        stripe_refund = shop.stripe.get(f"/v1/refunds/{body['stripe_refund_id']}")
        assert stripe_refund["amount"] == 200
        assert stripe_refund["metadata"]["refund_id"] == body["id"]
        assert _events(shop, key.account_id, "payment.refunded") == [
            {"payment_id": payment["id"], "amount_microcents": refunded}
        ]
        audit = shop.api.admin(
            "GET", "/admin/v1/audit-events", params={"action": "payment.refund"}
        ).json()["data"]
        mine = [a for a in audit if a["target_id"] == payment["id"]]
        assert len(mine) == 1 and mine[0]["actor"].startswith("token:"), mine
        metrics = shop.api.admin("GET", "/metrics").text
        assert 'metering_payment_refunds_total{source="operator"}' in metrics
        assert 'metering_payment_refunded_microcents_total{source="operator"}' in metrics
        rows = _rollforward_identities(shop, key, shop.api.clock.now().date())
        paid = [row for row in rows if row.category == "paid"]
        assert len(paid) == 1 and paid[0].refunded_microcents == refunded

    def test_more_than_remains_is_refused_and_changes_nothing(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1000)
        _spend(shop, key, 700 * MICROCENTS_PER_CENT)
        before = _credits(shop, key)

        too_much = _refund(shop, payment["id"], amount_cents=301, reason="x")

        assert_error(too_much, 400, "refund_exceeds_remaining", param="amount_cents")
        assert "300" in too_much.json()["error"]["message"]
        assert _credits(shop, key) == before
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 0
        assert _refund_entries(shop, key.account_id) == []
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        assert _charge_of(shop, intent)["amount_refunded"] == 0
        for bad in (0, -5, "10", 1.5, True):
            answer = _refund(shop, payment["id"], amount_cents=bad)
            assert answer.status_code in (400, 422), answer.text
            assert answer.json()["error"]["param"] == "amount_cents", answer.text
        assert_error(
            _refund(shop, "pay_nosuchpayment", amount_cents=1), 404, "not_found", param="payment_id"
        )
        assert _credits(shop, key) == before

    def test_without_an_amount_the_most_refundable_then_nothing_more(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1000)
        _spend(shop, key, 333 * MICROCENTS_PER_CENT + 500_000)  # 666.5 cents left: 666 refundable
        before = _credits(shop, key)

        path = f"/admin/v1/payments/{payment['id']}/refund"
        first = shop.api.client.post(path, headers=shop.api.admin_headers)  # no body at all

        assert first.status_code == 201, first.text
        assert (first.json()["amount_cents"], first.json()["reason"]) == (666, None)
        after = _credits(shop, key)
        assert (
            before["balance_microcents"] - after["balance_microcents"] == 666 * MICROCENTS_PER_CENT
        )
        assert _grant(shop, payment["grant_id"])["remaining_microcents"] == 500_000
        # The same request again: nothing is left to refund, and it says so.
        again = _refund(shop, payment["id"], reason="all of it")
        assert_error(again, 400, "refund_exceeds_remaining", param="amount_cents")
        assert _credits(shop, key) == after
        assert len(_refund_entries(shop, key.account_id)) == 1
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        assert _charge_of(shop, intent)["amount_refunded"] == 666

    def test_the_same_request_with_its_key_refunds_once(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1200)
        before = _credits(shop, key)
        request = {"amount_cents": 250, "reason": "late delivery", "idempotency_key": "r-1"}

        first = _refund(shop, payment["id"], **request)
        again = _refund(shop, payment["id"], **request)

        assert first.status_code == 201, first.text
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["payment"]["refunded_cents"] == 250
        dropped = before["balance_microcents"] - _credits(shop, key)["balance_microcents"]
        assert dropped == 250 * MICROCENTS_PER_CENT
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        assert _charge_of(shop, intent)["amount_refunded"] == 250
        other = _refund(shop, payment["id"], **{**request, "amount_cents": 251})
        assert_error(other, 409, "idempotency_conflict", param="idempotency_key")
        assert len(_refund_entries(shop, key.account_id)) == 1


class TestStripeRefund:
    def test_a_dashboard_refund_beyond_the_remainder_is_a_deficit_once(self, shop: Shop) -> None:
        key, payment = _paid(shop, 2000)
        _spend(shop, key, 1500 * MICROCENTS_PER_CENT)  # 500 cents left in the grant
        before = _credits(shop, key)
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        made = _stripe_refund(shop, intent, 1200)

        body = event("charge.refunded", _charge_of(shop, intent))
        _delivered(shop, body)
        _delivered(shop, body)  # the same event again
        again = event("charge.refunded", _charge_of(shop, intent))  # another event, same refund
        _delivered(shop, again)

        after = _credits(shop, key)
        refunded = 1200 * MICROCENTS_PER_CENT
        assert before["balance_microcents"] - after["balance_microcents"] == refunded
        assert after["deficit_microcents"] == 700 * MICROCENTS_PER_CENT
        assert _grant(shop, payment["grant_id"])["remaining_microcents"] == 0
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 1200
        assert [e[:2] for e in _refund_entries(shop, key.account_id)] == [
            (-refunded, payment["grant_id"])
        ]
        with shop.api.database.reading() as session:
            stored = session.execute(
                select(REFUNDS.c.source, REFUNDS.c.stripe_refund_id, REFUNDS.c.amount_cents).where(
                    REFUNDS.c.account_id == key.account_id
                )
            ).all()
        assert [tuple(row) for row in stored] == [("stripe", made["id"], 1200)]
        assert _events(shop, key.account_id, "payment.refunded") == [
            {"payment_id": payment["id"], "amount_microcents": refunded}
        ]
        rows = {
            row.category: row
            for row in _rollforward_identities(shop, key, shop.api.clock.now().date())
        }
        assert rows["paid"].refunded_microcents == 500 * MICROCENTS_PER_CENT
        assert rows["deficit"].refunded_microcents == 700 * MICROCENTS_PER_CENT
        assert rows["deficit"].closing_microcents == -700 * MICROCENTS_PER_CENT
        # A later grant pays the deficit off first.
        topped = _top_up(shop, key, 1000, "after-refund")
        assert (topped.status_code, topped.json()["status"]) == (201, "succeeded"), topped.text
        assert (
            _credits(shop, key)["balance_microcents"]
            == after["balance_microcents"] + 1000 * MICROCENTS_PER_CENT
        )
        assert _credits(shop, key)["deficit_microcents"] == 0
        _rollforward_identities(shop, key, shop.api.clock.now().date())

    def test_an_operators_refund_reported_by_stripe_is_not_applied_twice(self, shop: Shop) -> None:
        key, payment = _paid(shop, 900)
        answer = _refund(shop, payment["id"], amount_cents=400)
        assert answer.status_code == 201, answer.text
        assert (answer.json()["status"], answer.json()["amount_cents"]) == ("succeeded", 400)
        after = _credits(shop, key)
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        _delivered(shop, event("charge.refunded", _charge_of(shop, intent)))
        assert _credits(shop, key) == after
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 400
        # A second refund in the dashboard: only that one is applied.
        _stripe_refund(shop, intent, 100)
        _delivered(shop, event("charge.refunded", _charge_of(shop, intent)))
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 500
        assert (
            after["balance_microcents"] - _credits(shop, key)["balance_microcents"]
            == 100 * MICROCENTS_PER_CENT
        )
        assert len(_refund_entries(shop, key.account_id)) == 2
        assert_verified(shop.api)


class TestDispute:
    def test_a_dispute_is_an_operator_event_and_changes_no_credit(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1500)
        before = _credits(shop, key)
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        charge = _charge_of(shop, intent)
        dispute = {
            "id": "dp_test_metering",
            "object": "dispute",
            "amount": 1500,
            "currency": "usd",
            "charge": charge["id"],
            "payment_intent": intent,
            "reason": "fraudulent",
            "status": "needs_response",
        }
        body = event("charge.dispute.created", dispute)
        _delivered(shop, body)
        _delivered(shop, body)  # once

        assert _credits(shop, key) == before
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 0
        assert _events(shop, key.account_id, "payment.disputed") == [
            {
                "payment_id": payment["id"],
                "amount_microcents": 1500 * MICROCENTS_PER_CENT,
                "reason": "fraudulent",
            }
        ]
        # Operators only: an account key may not subscribe to it.
        made = shop.api.as_key(
            key.secret,
            "POST",
            "/v1/webhook-endpoints",
            json={"url": "https://11.22.33.44/hook", "event_types": ["payment.disputed"]},
        )
        assert made.status_code == 400, made.text


class TestStripeUnreachable:
    def test_a_refund_stripe_did_not_make_changes_no_credit_and_is_failed(self, shop: Shop) -> None:
        key, payment = _paid(shop, 800)
        before = _credits(shop, key)
        failures = _refund_failures(shop)
        nowhere = shop.api.settings.model_copy(update={"stripe_api_base": "http://127.0.0.1:9"})
        cut_off = Payments(shop.api.database, nowhere, shop.api.clock)

        with pytest.raises(refunds.RefundFailed):
            refunds.refund(cut_off, payment["id"], 300, "x", None, Auditor("test"))

        assert _credits(shop, key) == before
        assert _refund_failures(shop) == failures + 1
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 0
        with shop.api.database.reading() as session:
            stored = session.execute(
                select(REFUNDS.c.status, REFUNDS.c.amount_cents, REFUNDS.c.stripe_refund_id).where(
                    REFUNDS.c.account_id == key.account_id
                )
            ).all()
        assert [tuple(row) for row in stored] == [("failed", 300, None)]
        # Nothing reserved by it: the whole amount may still be refunded.
        answer = _refund(shop, payment["id"])
        assert (answer.status_code, answer.json()["amount_cents"]) == (201, 800), answer.text


def _refund_failures(shop: Shop) -> int:
    """``metering_payment_refund_failures_total`` as the metrics endpoint shows it now."""
    metrics = shop.api.admin("GET", "/metrics").text
    name = "metering_payment_refund_failures_total "
    [line] = [line for line in metrics.splitlines() if line.startswith(name)] or [name + "0"]
    return int(float(line.removeprefix(name)))


class _Died(Exception):
    """The process ended here (what ``kill -9`` leaves, without the process)."""


def _dying(shop: Shop, reach_stripe: bool) -> Payments:
    """The flows of a process that dies in Stripe's refund call: after Stripe refunded
    (``reach_stripe``) or before the request reached it. The refund stays ``pending``."""
    payments = shop.payments
    create = payments.stripe.create_refund

    def create_refund(*args: Any) -> Any:
        if reach_stripe:
            create(*args)
        raise _Died

    payments.stripe.create_refund = create_refund  # type: ignore[method-assign]
    return payments


def _left_pending(shop: Shop, payment_id: str, amount_cents: int, reach_stripe: bool) -> str:
    with pytest.raises(_Died):
        refunds.refund(
            _dying(shop, reach_stripe), payment_id, amount_cents, "crash", None, Auditor("test")
        )
    with shop.api.database.reading() as session:
        row = session.execute(
            select(REFUNDS.c.id, REFUNDS.c.status).where(REFUNDS.c.payment_id == payment_id)
        ).one()
    assert row.status == "pending"
    return str(row.id)


def _stored_refund(shop: Shop, refund_id: str) -> Any:
    with shop.api.database.reading() as session:
        return session.execute(select(REFUNDS).where(REFUNDS.c.id == refund_id)).one()


def _audited(shop: Shop, action: str, payment_id: str) -> list[dict[str, Any]]:
    audit = shop.api.admin("GET", "/admin/v1/audit-events", params={"action": action})
    assert audit.status_code == 200, audit.text
    return [a for a in audit.json()["data"] if a["target_id"] == payment_id]


def _fail_at_stripe(shop: Shop, stripe_refund_id: str) -> dict[str, Any]:
    """Stripe fails a refund it had made (a card that can no longer receive it)."""
    answer = shop.stripe._request(
        "POST",
        f"/v1/refunds/{stripe_refund_id}",
        data={"status": "failed"},
        headers={"Authorization": f"Bearer {SECRET_KEY}"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "failed"
    return dict(answer.json())


def _settled_by_replicas(shop: Shop, also: Any = None) -> list[int]:
    """Two schedulers' reconciliations at once (and ``also``, e.g. Stripe's event)."""
    moved: list[int] = []
    work = [lambda: moved.append(refunds.reconcile(shop.payments)) for _ in range(2)]
    threads = [threading.Thread(target=w) for w in [*work, *([also] if also else [])]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return moved


class TestPendingRefund:
    def test_one_stripe_made_is_applied_once_by_the_scheduler(self, shop: Shop) -> None:
        key, payment = _paid(shop, 2000)
        spent = 1200 * MICROCENTS_PER_CENT + 1  # the grant then holds 799.999999 cents
        _spend(shop, key, spent)
        before = _credits(shop, key)
        refund_id = _left_pending(shop, payment["id"], 700, reach_stripe=True)
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        assert _charge_of(shop, intent)["amount_refunded"] == 700  # Stripe refunded it
        assert _credits(shop, key) == before
        # Its amount stays reserved: 799 - 700 cents may still be refunded, no more.
        too_much = _refund(shop, payment["id"], amount_cents=100)
        assert_error(too_much, 400, "refund_exceeds_remaining", param="amount_cents")
        assert refunds.reconcile(shop.payments) == 0  # too early: pending under 5 minutes
        assert _stored_refund(shop, refund_id).status == "pending"
        shop.api.clock.advance(minutes=5)

        charge_refunded = event("charge.refunded", _charge_of(shop, intent))
        moved = _settled_by_replicas(shop, lambda: _delivered(shop, charge_refunded))

        assert sum(moved) <= 1
        stored = _stored_refund(shop, refund_id)
        [made] = shop.stripe.get(f"/v1/refunds?payment_intent={intent}")["data"]
        assert (stored.status, stored.stripe_refund_id) == ("succeeded", made["id"])
        refunded = 700 * MICROCENTS_PER_CENT
        after = _credits(shop, key)
        assert before["balance_microcents"] - after["balance_microcents"] == refunded
        held = 2000 * MICROCENTS_PER_CENT - spent - refunded
        assert _grant(shop, payment["grant_id"])["remaining_microcents"] == held
        assert after["deficit_microcents"] == 0
        assert _refund_entries(shop, key.account_id) == [(-refunded, payment["grant_id"], "crash")]
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 700
        assert _events(shop, key.account_id, "payment.refunded") == [
            {"payment_id": payment["id"], "amount_microcents": refunded}
        ]
        assert len(_audited(shop, "payment.refund", payment["id"])) == 1
        assert refunds.reconcile(shop.payments) == 0
        _delivered(shop, event("charge.refunded", _charge_of(shop, intent)))
        assert _credits(shop, key) == after
        _rollforward_identities(shop, key, shop.api.clock.now().date())

    def test_one_that_never_reached_stripe_is_failed_and_its_amount_freed(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1500)
        before = _credits(shop, key)
        refund_id = _left_pending(shop, payment["id"], 600, reach_stripe=False)
        shop.api.clock.advance(minutes=5)

        moved = _settled_by_replicas(shop)

        assert sorted(moved) == [0, 1]
        stored = _stored_refund(shop, refund_id)
        assert (stored.status, stored.stripe_refund_id) == ("failed", None)
        assert "never reached Stripe" in stored.failure_message
        assert _credits(shop, key) == before
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 0
        assert _refund_entries(shop, key.account_id) == []
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        assert _charge_of(shop, intent)["amount_refunded"] == 0  # nothing sent again
        [failed] = _events(shop, key.account_id, "payment.refund_failed")
        assert failed["payment_id"] == payment["id"] and failed["refund_id"] == refund_id
        assert failed["amount_microcents"] == 600 * MICROCENTS_PER_CENT
        [audit] = _audited(shop, "refund.fail", payment["id"])
        assert audit["actor"] == "scheduler"
        assert refunds.reconcile(shop.payments) == 0
        # Nothing reserved any more: the whole payment may be refunded.
        answer = _refund(shop, payment["id"])
        assert (answer.status_code, answer.json()["amount_cents"]) == (201, 1500), answer.text
        assert (
            before["balance_microcents"] - _credits(shop, key)["balance_microcents"]
            == 1500 * MICROCENTS_PER_CENT
        )


class TestFailedAtStripe:
    def test_a_refund_stripe_answers_failed_is_failed_and_never_applied(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1000)
        before = _credits(shop, key)
        payments = shop.payments
        create = payments.stripe.create_refund

        def create_refund(*args: Any) -> Any:
            made = create(*args)
            _fail_at_stripe(shop, made.id)
            return dataclasses.replace(made, status="failed")

        payments.stripe.create_refund = create_refund  # type: ignore[method-assign]

        with pytest.raises(refunds.RefundFailed):
            refunds.refund(payments, payment["id"], 400, "x", None, Auditor("test"))

        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        [made] = shop.stripe.get(f"/v1/refunds?payment_intent={intent}")["data"]
        with shop.api.database.reading() as session:
            stored = session.execute(
                select(REFUNDS.c.status, REFUNDS.c.stripe_refund_id).where(
                    REFUNDS.c.account_id == key.account_id
                )
            ).all()
        assert [tuple(row) for row in stored] == [("failed", made["id"])]
        [failed] = _events(shop, key.account_id, "payment.refund_failed")
        assert failed["amount_microcents"] == 400 * MICROCENTS_PER_CENT
        assert len(_audited(shop, "refund.fail", payment["id"])) == 1
        # Stripe's event about it applies nothing either.
        _delivered(shop, event("charge.refunded", _charge_of(shop, intent)))
        _delivered(
            shop, event("charge.refund.updated", shop.stripe.get(f"/v1/refunds/{made['id']}"))
        )
        assert _credits(shop, key) == before
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 0
        assert _refund_entries(shop, key.account_id) == []
        assert len(_events(shop, key.account_id, "payment.refund_failed")) == 1
        answer = _refund(shop, payment["id"])
        assert (answer.status_code, answer.json()["amount_cents"]) == (201, 1000), answer.text

    def test_charge_refund_updated_fails_a_pending_refund_once(self, shop: Shop) -> None:
        key, payment = _paid(shop, 1800)
        before = _credits(shop, key)
        refund_id = _left_pending(shop, payment["id"], 500, reach_stripe=True)
        intent = _operator_payment(shop, payment["id"])["stripe_payment_intent_id"]
        [made] = shop.stripe.get(f"/v1/refunds?payment_intent={intent}")["data"]
        updated = event("charge.refund.updated", _fail_at_stripe(shop, made["id"]))
        shop.api.clock.advance(minutes=5)

        moved = _settled_by_replicas(shop, lambda: _delivered(shop, updated))
        _delivered(shop, updated)  # again

        assert sum(moved) <= 1
        stored = _stored_refund(shop, refund_id)
        assert (stored.status, stored.stripe_refund_id) == ("failed", made["id"])
        assert _credits(shop, key) == before
        assert _refund_entries(shop, key.account_id) == []
        assert _operator_payment(shop, payment["id"])["refunded_cents"] == 0
        assert len(_events(shop, key.account_id, "payment.refund_failed")) == 1
        assert len(_audited(shop, "refund.fail", payment["id"])) == 1
        # A refund failed in Stripe's dashboard changes nothing either.
        dashboard = _stripe_refund(shop, intent, 300)
        _fail_at_stripe(shop, dashboard["id"])
        _delivered(shop, event("charge.refunded", _charge_of(shop, intent)))
        assert _credits(shop, key) == before
        answer = _refund(shop, payment["id"])
        assert (answer.status_code, answer.json()["amount_cents"]) == (201, 1800), answer.text
