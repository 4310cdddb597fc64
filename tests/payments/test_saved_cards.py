"""A saved card (set up for off-session charges) and the operator's off-session top-up, against
localstripe: saved by Stripe's ``setup_intent.succeeded``, forgotten by ``payment_method.detached``,
charged by ``POST /admin/v1/accounts/{id}/top-ups`` idempotently, declines failed with no credit."""

from __future__ import annotations

import json
import threading
from typing import Any

from metering.audit.service import Auditor
from tests.factories import Key, assert_error, create_account, create_key, credits_of
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import Shop
from tests.payments.localstripe import (
    CARD_3DS,
    CARD_DECLINED_ON_CHARGE,
    CARD_OK,
    PUBLISHABLE_KEY,
    SECRET_KEY,
    event,
    sign,
)


def _post_event(shop: Shop, body: dict[str, Any]) -> Any:
    payload = json.dumps(body).encode()
    return shop.api.client.post(
        "/v1/stripe/webhook",
        content=payload,
        headers={"Content-Type": "application/json", "Stripe-Signature": sign(payload)},
    )


def _with_saved_card(shop: Shop, number: str = CARD_OK) -> Key:
    """An account whose card was set up by the portal's "add a card" and saved when Stripe's
    ``setup_intent.succeeded`` arrived."""
    key = create_key(shop.api, create_account(shop.api))
    setup_id, client_secret = shop.payments.setup_for(key.account_id, None, save_card=True)
    answer = shop.stripe.confirm_card_setup(client_secret, number)
    assert answer.status_code == 200, answer.text
    if answer.json()["status"] == "requires_action":  # 3-D Secure passed in Stripe.js
        answer = shop.stripe._request(
            "POST",
            f"/v1/setup_intents/{setup_id}/confirm",
            content=json.dumps(
                {"key": PUBLISHABLE_KEY, "use_stripe_sdk": True, "client_secret": client_secret}
            ),
        )
        assert answer.json()["status"] == "succeeded", answer.text
    assert shop.payments.card_of(key.account_id) is None
    setup = shop.stripe.get(f"/v1/setup_intents/{setup_id}")
    body = event("setup_intent.succeeded", setup)
    assert _post_event(shop, body).status_code == 200
    assert _post_event(shop, body).status_code == 200  # again: nothing more
    return key


def _top_up(shop: Shop, key: Key, amount: Any, idempotency_key: str) -> Any:
    return shop.api.admin(
        "POST",
        f"/admin/v1/accounts/{key.account_id}/top-ups",
        json={"amount_cents": amount, "idempotency_key": idempotency_key},
    )


def _balance(shop: Shop, key: Key) -> int:
    return int(credits_of(shop.api, key)["balance_microcents"])


class TestSavedCard:
    def test_saved_from_stripes_event_shown_as_brand_last4_and_expiry(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        card = shop.payments.card_of(key.account_id)
        assert card is not None
        assert (card.brand, card.last4, card.exp_month, card.exp_year) == ("visa", "4242", 12, 2031)
        audit = shop.api.admin(
            "GET", f"/admin/v1/audit-events?account_id={key.account_id}&action=card.save"
        ).json()["data"]
        assert [(a["actor"], a["changes"]) for a in audit] == [
            ("stripe", {"brand": "visa", "last4": "4242"})
        ]

    def test_forgotten_when_stripe_says_it_was_detached(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        method = shop.payments.saved_method(key.account_id)
        assert method is not None
        detached = shop.stripe._request(
            "POST",
            f"/v1/payment_methods/{method}/detach",
            headers={"Authorization": f"Bearer {SECRET_KEY}"},
        )
        assert detached.status_code == 200, detached.text
        # Saving it labelled it with its account: the event says whose card it was.
        assert detached.json()["customer"] is None
        assert detached.json()["metadata"] == {"account_id": key.account_id}
        other = _with_saved_card(shop)
        # The card named by the event must be the account's saved card: another account's
        # card, or this one under another account's name, is left as it is.
        forged = dict(detached.json(), metadata={"account_id": other.account_id})
        answer = _post_event(shop, event("payment_method.detached", forged))
        assert answer.status_code == 200 and answer.json() == {"received": True}, answer.text
        assert shop.payments.card_of(other.account_id) is not None
        assert shop.payments.card_of(key.account_id) is not None
        answer = _post_event(shop, event("payment_method.detached", detached.json()))
        assert answer.status_code == 200 and answer.json() == {"received": True}, answer.text
        assert shop.payments.card_of(key.account_id) is None
        assert shop.payments.card_of(other.account_id) is not None
        answer = _top_up(shop, key, 1000, "after-detach")
        assert_error(answer, 400, "payment_method_required")

    def test_removed_by_the_portal_detaches_it_in_stripe(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        method = shop.payments.saved_method(key.account_id)
        assert shop.payments.remove_card(key.account_id, Auditor(f"portal:{key.account_id}"))
        assert shop.payments.card_of(key.account_id) is None
        assert shop.stripe.get(f"/v1/payment_methods/{method}")["customer"] is None


class TestOperatorTopUp:
    def test_charges_the_saved_card_once_per_key(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        before = _balance(shop, key)
        first = _top_up(shop, key, 2000, "ops-1")
        assert first.status_code == 201, first.text
        payment = first.json()
        assert (payment["status"], payment["kind"], payment["amount_cents"]) == (
            "succeeded",
            "top_up",
            2000,
        )
        assert payment["stripe_payment_intent_id"].startswith("pi_")
        assert _balance(shop, key) - before == 2000 * MICROCENTS_PER_CENT
        again = _top_up(shop, key, 2000, "ops-1")
        assert again.status_code == 200 and again.json()["id"] == payment["id"]
        assert _balance(shop, key) - before == 2000 * MICROCENTS_PER_CENT
        assert_error(
            _top_up(shop, key, 2001, "ops-1"), 409, "idempotency_conflict", param="idempotency_key"
        )
        listed = shop.api.as_key(key.secret, "GET", "/v1/payments").json()["data"]
        assert [p["id"] for p in listed] == [payment["id"]]
        audit = shop.api.admin("GET", f"/admin/v1/audit-events?account_id={key.account_id}").json()[
            "data"
        ]
        recorded = [
            (a["action"], a["actor"], a["request_id"] == first.headers["x-request-id"])
            for a in audit
            if a["target_id"] == payment["id"]
        ]
        operator = recorded[0][1]
        assert operator.startswith("token:")  # the admin token that asked (unnamed)
        assert sorted(recorded) == [
            ("payment.create", operator, True),
            ("payment.succeed", operator, True),
        ]

    def test_refuses_without_a_saved_card_or_with_a_bad_amount(self, shop: Shop) -> None:
        key = create_key(shop.api, create_account(shop.api))
        assert_error(_top_up(shop, key, 1000, "k"), 400, "payment_method_required")
        card = _with_saved_card(shop)
        for bad in (499, 1_000_001, 10.5, "1000", None, True):
            answer = _top_up(shop, card, bad, "bad")
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["error"]["param"] == "amount_cents", bad
        missing = shop.api.admin(
            "POST",
            "/admin/v1/accounts/acct_nobody/top-ups",
            json={"amount_cents": 1000, "idempotency_key": "x"},
        )
        assert_error(missing, 404, "not_found", param="account_id")
        assert shop.api.as_key(card.secret, "GET", "/v1/payments").json()["data"] == []

    def test_a_declined_charge_is_a_failed_payment_and_no_credit(self, shop: Shop) -> None:
        key = _with_saved_card(shop, CARD_DECLINED_ON_CHARGE)
        before = _balance(shop, key)
        answer = _top_up(shop, key, 1500, "declined")
        assert answer.status_code == 201, answer.text
        payment = answer.json()
        assert (payment["status"], payment["failure_code"], payment["grant_id"]) == (
            "failed",
            "card_declined",
            None,
        )
        assert _balance(shop, key) == before

    def test_a_card_that_needs_authentication_fails_off_session(self, shop: Shop) -> None:
        key = _with_saved_card(shop, CARD_3DS)
        before = _balance(shop, key)
        answer = _top_up(shop, key, 900, "needs-3ds")
        assert answer.status_code == 201, answer.text
        payment = answer.json()
        assert (payment["status"], payment["failure_code"]) == (
            "failed",
            "authentication_required",
        )
        intent = shop.stripe.get(f"/v1/payment_intents/{payment['stripe_payment_intent_id']}")
        assert intent["status"] == "canceled"
        assert _balance(shop, key) == before

    def test_the_same_request_twice_at_once_charges_once(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        before = _balance(shop, key)
        answers: list[Any] = []
        threads = [
            threading.Thread(target=lambda: answers.append(_top_up(shop, key, 1100, "twice")))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        # Each answer is the one payment (or, at worst, a 503 asking to retry: never a 2nd charge).
        assert {a.status_code for a in answers} <= {200, 201, 503}, [a.text for a in answers]
        ids = {a.json()["id"] for a in answers if a.status_code in (200, 201)}
        assert len(ids) == 1
        settled = _top_up(shop, key, 1100, "twice")
        assert settled.status_code == 200 and settled.json()["status"] == "succeeded"
        assert _balance(shop, key) - before == 1100 * MICROCENTS_PER_CENT
        customer = shop.payments.customer_of(key.account_id)
        charged = [
            intent
            for intent in shop.stripe.get("/v1/payment_intents?limit=100")["data"]
            if intent["customer"] == customer and intent["status"] == "succeeded"
        ]
        assert len(charged) == 1

