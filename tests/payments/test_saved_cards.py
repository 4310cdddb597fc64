"""A saved card (set up for off-session charges) and the operator's off-session top-up, against
localstripe: saved by Stripe's ``setup_intent.succeeded``, forgotten by ``payment_method.detached``,
charged by ``POST /admin/v1/accounts/{id}/top-ups`` idempotently, declines failed with no credit."""

from __future__ import annotations

import html
import json
import re
import threading
from typing import Any
from urllib.parse import urlsplit

from fastapi.testclient import TestClient

from metering.audit.service import Auditor
from tests.factories import Key, assert_error, create_account, create_key, credits_of
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import Shop
from tests.payments.localstripe import (
    CARD_3DS,
    CARD_DECLINED,
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
            for intent in shop.stripe.every("/v1/payment_intents")
            if intent["customer"] == customer and intent["status"] == "succeeded"
        ]
        assert len(charged) == 1


CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _portal(shop: Shop, account: str, member_id: str | None = None) -> TestClient:
    """A browser-less portal client signed in to the account (as its admin by default)."""
    body = {"member_id": member_id} if member_id else {}
    link = shop.api.admin("POST", f"/admin/v1/accounts/{account}/portal-sessions", json=body)
    assert link.status_code == 201, link.text
    client = TestClient(shop.api.client.app, base_url="http://testserver")  # type: ignore[arg-type]
    path = urlsplit(str(link.json()["url"])).path
    signed = client.post(path, data={"csrf_token": _csrf(client.get(path))}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    return client


def _csrf(page: Any) -> str:
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


def _card_page(client: TestClient) -> tuple[Any, str, str]:
    """The "add a card" page: the page, its SetupIntent's id and client secret."""
    page = client.get("/billing/payments/card")
    assert page.status_code == 200, page.text
    setup = re.search(r'name="setup_intent" value="(seti_\w+)"', page.text)
    secret = re.search(r'data-client-secret="(seti_\w+_secret_\w+)"', page.text)
    assert setup and secret, page.text
    return page, setup.group(1), secret.group(1)


class TestAddACard:
    """The portal's "add a card": a SetupIntent confirmed by Stripe.js, saved without paying."""

    def test_a_card_set_up_on_its_page_becomes_the_saved_card(self, shop: Shop) -> None:
        account = create_account(shop.api)
        client = _portal(shop, account)
        billing = client.get("/billing/payments")
        assert billing.status_code == 200 and 'id="add-card"' in billing.text, billing.text
        assert ">Add a card</a>" in billing.text
        page, setup_id, secret = _card_page(client)
        policy = page.headers["content-security-policy"]
        stripe_origin = shop.stripe.base
        assert f"script-src 'self' {stripe_origin}" in policy and "frame-src" in policy, policy
        assert f'<script src="{shop.api.settings.stripe_js_url}">' in page.text
        setup = shop.stripe.get(f"/v1/setup_intents/{setup_id}")
        assert setup["metadata"] == {"account_id": account, "save_card": "true"}
        assert setup["usage"] == "off_session"
        answer = shop.stripe.confirm_card_setup(secret, CARD_OK)
        assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text

        saved = client.post(
            "/billing/payments/card",
            data={"csrf_token": _csrf(page), "setup_intent": setup_id},
            follow_redirects=False,
        )
        assert saved.status_code == 303, saved.text
        assert saved.headers["location"].endswith("/billing/payments")
        card = shop.payments.card_of(account)
        assert card is not None
        assert (card.brand, card.last4, card.exp_month, card.exp_year) == ("visa", "4242", 12, 2031)
        billing = client.get("/billing/payments")
        assert "ending <strong>4242</strong>, expires 12/2031" in billing.text, billing.text
        assert ">Replace the saved card</a>" in billing.text
        audit = shop.api.admin(
            "GET", f"/admin/v1/audit-events?account_id={account}&action=card.save"
        ).json()["data"]
        assert [(a["actor"], a["changes"]) for a in audit] == [
            (f"portal:{account}", {"brand": "visa", "last4": "4242"})
        ]
        # Stripe's setup_intent.succeeded for that SetupIntent, later: the same card, no change.
        late = _post_event(
            shop, event("setup_intent.succeeded", shop.stripe.get(f"/v1/setup_intents/{setup_id}"))
        )
        assert late.status_code == 200 and late.json() == {"received": True}, late.text
        after = shop.api.admin(
            "GET", f"/admin/v1/audit-events?account_id={account}&action=card.save"
        ).json()["data"]
        assert len(after) == 1, after
        # Nothing was charged: no payment, no credit.
        assert (
            shop.api.admin("GET", f"/admin/v1/payments?account_id={account}").json()["data"] == []
        )

    def test_a_new_card_replaces_the_saved_one_which_is_detached(self, shop: Shop) -> None:
        key = _with_saved_card(shop)
        old = shop.payments.saved_method(key.account_id)
        client = _portal(shop, key.account_id)
        page, setup_id, secret = _card_page(client)
        answer = shop.stripe.confirm_card_setup(secret, CARD_DECLINED_ON_CHARGE)
        assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
        saved = client.post(
            "/billing/payments/card",
            data={"csrf_token": _csrf(page), "setup_intent": setup_id},
            follow_redirects=False,
        )
        assert saved.status_code == 303, saved.text
        card = shop.payments.card_of(key.account_id)
        assert card is not None and card.last4 == "0341"
        assert shop.payments.saved_method(key.account_id) != old
        assert shop.stripe.get(f"/v1/payment_methods/{old}")["customer"] is None

    def test_a_declined_card_is_shown_and_nothing_is_saved(self, shop: Shop) -> None:
        account = create_account(shop.api)
        client = _portal(shop, account)
        page, setup_id, secret = _card_page(client)
        answer = shop.stripe.confirm_card_setup(secret, CARD_DECLINED)
        assert answer.status_code == 402, answer.text
        message = answer.json()["error"]["message"]
        shown = client.post(
            "/billing/payments/card",
            data={
                "csrf_token": _csrf(page),
                "setup_intent": setup_id,
                "error_code": "card_declined",
                "error_message": message,
            },
            follow_redirects=False,
        )
        assert shown.status_code == 200, shown.text
        problem = re.search(r'id="card-problem">([^<]*)<', shown.text)
        assert problem and problem.group(1) == html.escape(message), shown.text
        assert re.search(r'name="setup_intent" value="(seti_\w+)"', shown.text)
        assert setup_id not in shown.text  # a new SetupIntent for the next try
        assert shop.payments.card_of(account) is None

    def test_another_accounts_setup_or_none_is_refused(self, shop: Shop) -> None:
        account, other = create_account(shop.api), create_account(shop.api)
        client = _portal(shop, account)
        page, _, _ = _card_page(client)
        _, others, others_secret = _card_page(_portal(shop, other))
        shop.stripe.confirm_card_setup(others_secret, CARD_OK)
        for setup_intent, message in (
            (others, "that card setup is not this account&#39;s"),
            ("", "the card&#39;s set-up is missing: reload the page"),
            ("pm_123", "the card&#39;s set-up is missing: reload the page"),
        ):
            refused = client.post(
                "/billing/payments/card",
                data={"csrf_token": _csrf(page), "setup_intent": setup_intent},
                follow_redirects=False,
            )
            assert refused.status_code == 400, refused.text
            assert f'<p class="problem" role="alert">{message}</p>' in refused.text, refused.text
            assert "<code>invalid_parameter</code>" in refused.text, refused.text
        assert shop.payments.card_of(account) is None
        assert shop.payments.card_of(other) is None

    def test_only_an_admin_may_add_a_card(self, shop: Shop) -> None:
        account = create_account(shop.api)
        admin = _portal(shop, account)
        _, setup_id, secret = _card_page(admin)
        shop.stripe.confirm_card_setup(secret, CARD_OK)
        for role in ("viewer", "developer"):
            member = shop.api.admin(
                "POST",
                f"/admin/v1/accounts/{account}/members",
                json={"email": f"{role}-{account}@example.com", "role": role},
            )
            assert member.status_code == 201, member.text
            client = _portal(shop, account, member.json()["id"])
            billing = client.get("/billing/payments")
            assert billing.status_code == 200 and 'id="add-card"' not in billing.text
            assert client.get("/billing/payments/card").status_code == 403
            refused = client.post(
                "/billing/payments/card",
                data={"csrf_token": _csrf(billing), "setup_intent": setup_id},
                follow_redirects=False,
            )
            assert refused.status_code == 403, refused.text
        assert shop.payments.card_of(account) is None
