"""Top-ups against localstripe: a payment credited exactly once whichever signal says it
succeeded (Stripe's event, the return page, the scheduler), declines credited nothing, forged
events refused, and the routes off without a Stripe key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from metering.audit.service import Auditor
from metering.models import LedgerEntry, Payment, StripeEvent, table
from metering.payments.flows import _record_intent
from metering.payments.stripe_records import Declined
from metering.scheduler import Scheduler
from tests.conftest import Api
from tests.factories import Key, create_account, create_key, credits_of
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import Shop
from tests.payments.localstripe import (
    CARD_3DS,
    CARD_DECLINED,
    CARD_DECLINED_ON_CHARGE,
    CARD_OK,
    PUBLISHABLE_KEY,
    event,
    sign,
)


def _customer(shop: Shop) -> Key:
    return create_key(shop.api, create_account(shop.api))


def _balance(api: Api, key: Key) -> int:
    return int(credits_of(api, key)["balance_microcents"])


def _payment(api: Api, key: Key, payment_id: str) -> dict[str, Any]:
    response = api.as_key(key.secret, "GET", f"/v1/payments/{payment_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _grant_entries(api: Api, account_id: str) -> int:
    entries = table(LedgerEntry)
    with api.database.reading() as session:
        return int(
            session.execute(
                select(func.count()).where(
                    entries.c.account_id == account_id, entries.c.kind == "grant"
                )
            ).scalar_one()
        )


def _post_event(api: Api, body: dict[str, Any], signature: str | None = None) -> Any:
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    headers["Stripe-Signature"] = signature if signature is not None else sign(payload)
    return api.client.post("/v1/stripe/webhook", content=payload, headers=headers)


def _paid_at_stripe_only(shop: Shop, key: Key, amount_cents: int) -> tuple[str, str]:
    """A payment whose PaymentIntent succeeded at Stripe while the service heard nothing more
    (the process died between Stripe's answer and the grant): (payment id, intent id)."""
    payment_id = shop.start(key.account_id, amount_cents)
    setup_id, answer = shop.new_card(key.account_id, payment_id, CARD_OK)
    assert answer.status_code == 200, answer.text
    method = shop.payments.method_of_setup(key.account_id, setup_id)
    assert isinstance(method, str)
    stripe = shop.payments.stripe
    customer = shop.payments.customer_of(key.account_id)
    intent = stripe.create_payment_intent(
        payment_id, key.account_id, amount_cents, customer, method
    )
    with shop.api.database.unit_of_work() as session:
        _record_intent(session, key.account_id, payment_id, intent.id)
        session.commit()
    assert stripe.confirm_payment_intent(payment_id, intent.id).status == "succeeded"
    return payment_id, intent.id


class TestTopUp:
    def test_a_new_card_credits_exactly_the_amount(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id = shop.start(key.account_id, 2500)
        setup_id, answer = shop.new_card(key.account_id, payment_id, CARD_OK)
        assert answer.status_code == 200, answer.text
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)

        row, intent = shop.payments.pay(key.account_id, payment_id, method, Auditor("test"))

        assert intent is not None and intent.status == "succeeded"
        assert row["status"] == "succeeded"
        assert _balance(shop.api, key) - before == 2500 * MICROCENTS_PER_CENT == 2_500_000_000
        shown = _payment(shop.api, key, payment_id)
        assert shown["status"] == "succeeded" and shown["amount_cents"] == 2500
        assert shown["kind"] == "top_up" and shown["refunded_cents"] == 0
        assert shown["succeeded_at"] is not None and shown["failure_code"] is None
        assert "stripe_payment_intent_id" not in shown  # for operators only
        grant = shop.api.admin("GET", f"/admin/v1/grants/{shown['grant_id']}").json()
        assert (grant["category"], grant["priority"], grant["expires_at"]) == ("paid", 50, None)
        assert grant["amount_microcents"] == 2_500_000_000
        assert payment_id in grant["note"]
        operator = shop.api.admin("GET", f"/admin/v1/payments/{payment_id}").json()
        assert operator["stripe_payment_intent_id"] == intent.id
        metrics = shop.api.admin("GET", "/metrics").text
        assert 'metering_payments_total{kind="top_up",result="succeeded"}' in metrics
        assert 'metering_payment_credit_microcents_total{kind="top_up"}' in metrics
        assert shop.stripe.get(f"/v1/payment_intents/{intent.id}")["metadata"] == {
            "payment_id": payment_id,
            "account_id": key.account_id,
        }

    def test_paying_again_changes_nothing(self, shop: Shop) -> None:
        key = _customer(shop)
        payment_id = shop.start(key.account_id, 700)
        setup_id, _ = shop.new_card(key.account_id, payment_id, CARD_OK)
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)
        shop.payments.pay(key.account_id, payment_id, method, Auditor("test"))
        before = _balance(shop.api, key)
        row, intent = shop.payments.pay(key.account_id, payment_id, method, Auditor("test"))
        assert row["status"] == "succeeded" and intent is None
        assert _balance(shop.api, key) == before
        assert _grant_entries(shop.api, key.account_id) == 1


class TestExactlyOnce:
    def test_every_signal_at_once_makes_one_grant(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id, intent_id = _paid_at_stripe_only(shop, key, 1234)
        assert _payment(shop.api, key, payment_id)["status"] == "pending"
        succeeded = event(
            "payment_intent.succeeded", shop.stripe.get(f"/v1/payment_intents/{intent_id}")
        )
        again = dict(succeeded, id=succeeded["id"] + "_other")  # Stripe's other delivery

        answers: list[Any] = []
        errors: list[BaseException] = []

        def run(work: Any) -> None:
            try:
                answers.append(work())
            except BaseException as error:
                errors.append(error)

        signals = [
            lambda: _post_event(shop.api, succeeded),
            lambda: _post_event(shop.api, succeeded),
            lambda: _post_event(shop.api, again),
            lambda: shop.payments.learn(key.account_id, payment_id, Auditor("portal")),
        ]
        threads = [threading.Thread(target=run, args=(signal,)) for signal in signals]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        for answer in answers:
            if hasattr(answer, "status_code"):
                assert answer.status_code == 200, answer.text

        # Later still: the scheduler, and the event delivered once more.
        shop.api.clock.advance(minutes=6)
        shop.payments.reconcile()
        assert _post_event(shop.api, succeeded).status_code == 200

        assert _balance(shop.api, key) - before == 1234 * MICROCENTS_PER_CENT
        assert _grant_entries(shop.api, key.account_id) == 1
        shown = _payment(shop.api, key, payment_id)
        assert shown["status"] == "succeeded"
        events = table(StripeEvent)
        with shop.api.database.reading() as session:
            processed = session.execute(
                select(func.count()).where(events.c.account_id == key.account_id)
            ).scalar_one()
        assert processed == 2  # each Stripe event id once

    def test_the_scheduler_credits_a_payment_nobody_reported(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id, _ = _paid_at_stripe_only(shop, key, 999)
        shop.payments.reconcile()  # too early: pending for less than 5 minutes
        assert _payment(shop.api, key, payment_id)["status"] == "pending"
        shop.api.clock.advance(minutes=5)
        scheduler = Scheduler(shop.api.database, shop.api.settings, shop.api.clock)
        try:
            report = scheduler.tick()
        finally:
            scheduler.close()
        assert report.payments_moved is not None and report.payments_moved >= 1
        assert _payment(shop.api, key, payment_id)["status"] == "succeeded"
        assert _balance(shop.api, key) - before == 999 * MICROCENTS_PER_CENT


class TestReplicas:
    def test_two_schedulers_reconciling_at_once_credit_each_payment_once(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        paid = [_paid_at_stripe_only(shop, key, cents)[0] for cents in (501, 502, 503)]
        shop.api.clock.advance(minutes=5)
        replicas = [shop.payments, shop.payments]  # two schedulers: nothing shared but the db
        moved: list[int] = []
        threads = [
            threading.Thread(target=lambda r=replica: moved.append(r.reconcile()))
            for replica in replicas
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sum(moved) >= 3
        assert _balance(shop.api, key) - before == (501 + 502 + 503) * MICROCENTS_PER_CENT
        assert _grant_entries(shop.api, key.account_id) == 3
        assert {_payment(shop.api, key, p)["status"] for p in paid} == {"succeeded"}


class TestSignatures:
    def test_forged_or_stale_signatures_change_nothing(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id, intent_id = _paid_at_stripe_only(shop, key, 600)
        body = event(
            "payment_intent.succeeded", shop.stripe.get(f"/v1/payment_intents/{intent_id}")
        )
        payload = json.dumps(body).encode()
        for signature in (
            sign(payload, secret="whsec_someone_else"),
            sign(payload, at=int(time.time()) - 600),  # beyond the 5-minute tolerance
            "t=1,v1=00",
            "",
        ):
            answer = _post_event(shop.api, body, signature)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_signature"
        missing = shop.api.client.post("/v1/stripe/webhook", content=payload)
        assert missing.status_code == 400
        assert missing.json()["error"]["code"] == "invalid_signature"
        assert _payment(shop.api, key, payment_id)["status"] == "pending"
        assert _balance(shop.api, key) == before
        events = table(StripeEvent)
        with shop.api.database.reading() as session:
            assert (
                session.execute(
                    select(func.count()).where(events.c.account_id == key.account_id)
                ).scalar_one()
                == 0
            )

    def test_other_event_types_are_answered_and_ignored(self, shop: Shop) -> None:
        answer = _post_event(
            shop.api, event("customer.created", {"id": "cus_x", "object": "customer"})
        )
        assert answer.status_code == 200, answer.text


class TestDeclines:
    def test_a_card_declined_when_set_up_fails_the_payment(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id = shop.start(key.account_id, 2500)
        setup_id, answer = shop.new_card(key.account_id, payment_id, CARD_DECLINED)
        assert answer.status_code == 402
        assert answer.json()["error"]["code"] == "card_declined"
        found = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(found, Declined)
        shop.payments.fail_unpaid(
            key.account_id, payment_id, found.code, found.message, Auditor("t")
        )
        shown = _payment(shop.api, key, payment_id)
        assert (shown["status"], shown["failure_code"]) == ("failed", "card_declined")
        assert shown["grant_id"] is None
        assert _balance(shop.api, key) == before

    def test_a_charge_declined_fails_the_payment_and_its_event_changes_nothing(
        self, shop: Shop
    ) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id = shop.start(key.account_id, 2500)
        setup_id, answer = shop.new_card(key.account_id, payment_id, CARD_DECLINED_ON_CHARGE)
        assert answer.status_code == 200, answer.text
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)
        row, _ = shop.payments.pay(key.account_id, payment_id, method, Auditor("test"))
        assert (row["status"], row["failure_code"]) == ("failed", "card_declined")
        intent_id = row["stripe_payment_intent_id"]
        failed = event(
            "payment_intent.payment_failed", shop.stripe.get(f"/v1/payment_intents/{intent_id}")
        )
        assert _post_event(shop.api, failed).status_code == 200
        assert _payment(shop.api, key, payment_id)["status"] == "failed"
        assert _balance(shop.api, key) == before
        assert _grant_entries(shop.api, key.account_id) == 0


def _mismatches(api: Api) -> float:
    for line in api.admin("GET", "/metrics").text.splitlines():
        if line.startswith('metering_payment_mismatches_total{kind="top_up"}'):
            return float(line.split()[-1])
    return 0.0


class TestMismatch:
    def test_an_intent_of_another_amount_credits_nothing(self, shop: Shop) -> None:
        counted = _mismatches(shop.api)
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id = shop.start(key.account_id, 500)
        setup_id, _ = shop.new_card(key.account_id, payment_id, CARD_OK)
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)
        customer = shop.payments.customer_of(key.account_id)
        # An intent naming our payment but of another amount (made outside the service).
        stripe = shop.payments.stripe
        other = stripe.create_payment_intent(payment_id, key.account_id, 600, customer, method)
        stripe.confirm_payment_intent(payment_id, other.id)
        body = event("payment_intent.succeeded", shop.stripe.get(f"/v1/payment_intents/{other.id}"))
        assert _post_event(shop.api, body).status_code == 200
        assert _payment(shop.api, key, payment_id)["status"] == "pending"
        assert _balance(shop.api, key) == before
        assert _mismatches(shop.api) == counted + 1


class TestReading:
    def test_an_account_sees_its_own_payments_newest_first(self, shop: Shop) -> None:
        key, other = _customer(shop), _customer(shop)
        first = shop.start(key.account_id, 500)
        shop.api.clock.advance(seconds=1)
        second = shop.start(key.account_id, 600)
        theirs = shop.start(other.account_id, 700)
        listed = shop.api.as_key(key.secret, "GET", "/v1/payments?limit=1").json()
        assert [p["id"] for p in listed["data"]] == [second] and listed["has_more"]
        rest = shop.api.as_key(
            key.secret, "GET", f"/v1/payments?limit=1&after={listed['next_cursor']}"
        ).json()
        assert [p["id"] for p in rest["data"]] == [first] and not rest["has_more"]
        hidden = shop.api.as_key(key.secret, "GET", f"/v1/payments/{theirs}")
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
        by_operator = shop.api.admin(
            "GET", f"/admin/v1/payments?account_id={key.account_id}&status=pending"
        ).json()
        assert [p["id"] for p in by_operator["data"]] == [second, first]
        for limit in ("1.0", "+5", "0", "1001", "1e2"):
            for answer in (
                shop.api.as_key(key.secret, "GET", f"/v1/payments?limit={limit}"),
                shop.api.admin("GET", f"/admin/v1/payments?limit={limit}"),
            ):
                assert answer.status_code == 400, (limit, answer.text)
                assert answer.json()["error"]["param"] == "limit"
        forged = shop.api.as_key(key.secret, "GET", "/v1/payments?after=bm90LWEtY3Vyc29y")
        assert forged.status_code == 400 and forged.json()["error"]["param"] == "after"
        bad = shop.api.admin("GET", "/admin/v1/payments?status=paid")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "status"
        payments = table(Payment)
        with shop.api.database.reading() as session:
            assert (
                session.execute(
                    select(func.count()).where(payments.c.account_id == key.account_id)
                ).scalar_one()
                == 2
            )


class TestCredentials:
    def test_each_payment_route_takes_its_own_credential_only(self, shop: Shop) -> None:
        key = _customer(shop)
        payment_id = shop.start(key.account_id, 500)
        own = {"Authorization": f"Bearer {key.secret}"}
        for method, path, body in (
            ("GET", "/admin/v1/payments", None),
            ("GET", f"/admin/v1/payments/{payment_id}", None),
            (
                "POST",
                f"/admin/v1/accounts/{key.account_id}/top-ups",
                {"amount_cents": 1000, "idempotency_key": "steal"},
            ),
        ):
            for headers in (own, {"x-api-key": key.secret}, shop.api.gateway_headers):
                answer = shop.api.client.request(method, path, headers=headers, json=body)
                assert answer.status_code == 401, (path, answer.text)
                assert answer.json()["error"]["code"] == "invalid_api_key"
        for path in ("/v1/payments", f"/v1/payments/{payment_id}"):
            answer = shop.api.client.get(path, headers=shop.api.gateway_headers)
            assert answer.status_code == 401, answer.text
            assert shop.api.client.get(path).json()["error"]["code"] == "missing_api_key"
        by_admin = shop.api.client.post(
            f"/admin/v1/accounts/{key.account_id}/top-ups",
            headers=shop.api.admin_headers,
            json={"amount_cents": 1000, "idempotency_key": "k"},
        )
        assert by_admin.json()["error"]["code"] == "payment_method_required"
        assert [
            p["id"] for p in shop.api.as_key(key.secret, "GET", "/v1/payments").json()["data"]
        ] == [payment_id]


class TestOff:
    def test_without_a_stripe_key_every_payment_route_is_unknown(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        for method, path, headers in (
            ("GET", "/v1/payments", {"Authorization": f"Bearer {key.secret}"}),
            ("GET", "/v1/payments/pay_x", {"Authorization": f"Bearer {key.secret}"}),
            ("POST", "/v1/stripe/webhook", {"Stripe-Signature": "t=1,v1=00"}),
            ("GET", "/admin/v1/payments", api.admin_headers),
            ("GET", "/admin/v1/payments/pay_x", api.admin_headers),
        ):
            answer = api.client.request(method, path, headers=headers)
            assert answer.status_code == 404, (path, answer.text)
            assert answer.json()["error"]["code"] == "not_found"

    def test_a_process_without_payments_never_loads_the_stripe_library(
        self, tmp_path: Path
    ) -> None:
        # The library and the HTTP clients it brings weigh about 18 MB in every API process:
        # loaded on a process's first payment, never by the app's routes.
        env = {
            **os.environ,
            "METERING_DATABASE_URL": f"sqlite:///{tmp_path / 'metering.db'}",
            "METERING_DATA_DIR": str(tmp_path),
        }
        env.pop("METERING_STRIPE_SECRET_KEY", None)
        probe = (
            "import sys; from metering.asgi import create; create(); "
            "print(sorted({m.split('.')[0] for m in sys.modules}"
            " & {'stripe', 'requests', 'aiohttp'}))"
        )
        shown = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.strip() == "[]"


class TestVerify:
    def test_verify_names_a_payment_credited_wrongly(self, shop: Shop) -> None:
        from sqlalchemy import update

        from metering.usage.verify import verify

        key = _customer(shop)
        payment_id, _ = _paid_at_stripe_only(shop, key, 800)
        shop.payments.learn(key.account_id, payment_id, Auditor("portal"))
        payments = table(Payment)
        moved = update(payments).where(
            payments.c.account_id == key.account_id, payments.c.id == payment_id
        )
        with shop.api.database.unit_of_work() as session:
            session.execute(moved.values(amount_cents=801))
            session.commit()
        with shop.api.database.reading() as session:
            report = verify(session, shop.api.clock.now())
        assert any(payment_id in problem for problem in report.mismatches or []), report
        with shop.api.database.unit_of_work() as session:
            session.execute(moved.values(amount_cents=800))
            session.commit()


class TestAbandoned:
    def test_a_payment_unpaid_for_a_day_fails_as_abandoned(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        never_paid = shop.start(key.account_id, 500)  # the card page was never used
        started = shop.start(key.account_id, 600)  # an intent made, never confirmed
        setup_id, _ = shop.new_card(key.account_id, started, CARD_OK)
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)
        customer = shop.payments.customer_of(key.account_id)
        intent = shop.payments.stripe.create_payment_intent(
            started, key.account_id, 600, customer, method
        )
        with shop.api.database.unit_of_work() as session:
            _record_intent(session, key.account_id, started, intent.id)
            session.commit()
        shop.api.clock.advance(hours=23)
        shop.payments.reconcile()
        assert _payment(shop.api, key, never_paid)["status"] == "pending"
        assert _payment(shop.api, key, started)["status"] == "pending"
        shop.api.clock.advance(hours=1)
        shop.payments.reconcile()
        for payment_id in (never_paid, started):
            shown = _payment(shop.api, key, payment_id)
            assert (shown["status"], shown["failure_code"]) == ("failed", "abandoned")
        assert shop.stripe.get(f"/v1/payment_intents/{intent.id}")["status"] == "canceled"
        assert _balance(shop.api, key) == before


class TestThreeDSecure:
    def test_a_card_that_needs_authentication_is_credited_once_authenticated(
        self, shop: Shop
    ) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id = shop.start(key.account_id, 2500)
        setup_id, client_secret = shop.payments.setup_for(key.account_id, payment_id)
        first = shop.stripe.confirm_card_setup(client_secret, CARD_3DS)
        assert first.json()["status"] == "requires_action"
        # Stripe.js, once the customer passed 3-D Secure for the set-up:
        passed = shop.stripe._request(
            "POST",
            f"/v1/setup_intents/{setup_id}/confirm",
            content=json.dumps(
                {"key": PUBLISHABLE_KEY, "use_stripe_sdk": True, "client_secret": client_secret}
            ),
        )
        assert passed.json()["status"] == "succeeded", passed.text
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)
        row, intent = shop.payments.pay(key.account_id, payment_id, method, Auditor("t"))
        assert row["status"] == "pending"
        assert intent is not None and intent.status == "requires_action"
        assert intent.client_secret is not None
        assert shop.stripe.authenticate(intent.client_secret, True).status_code == 200
        after = shop.payments.learn(key.account_id, payment_id, Auditor("portal"))
        assert after["status"] == "succeeded"
        assert _balance(shop.api, key) - before == 2500 * MICROCENTS_PER_CENT

    def test_failed_authentication_credits_nothing(self, shop: Shop) -> None:
        key = _customer(shop)
        before = _balance(shop.api, key)
        payment_id = shop.start(key.account_id, 700)
        setup_id, client_secret = shop.payments.setup_for(key.account_id, payment_id)
        shop.stripe.confirm_card_setup(client_secret, CARD_3DS)
        shop.stripe._request(
            "POST",
            f"/v1/setup_intents/{setup_id}/confirm",
            content=json.dumps(
                {"key": PUBLISHABLE_KEY, "use_stripe_sdk": True, "client_secret": client_secret}
            ),
        )
        method = shop.payments.method_of_setup(key.account_id, setup_id)
        assert isinstance(method, str)
        _row, intent = shop.payments.pay(key.account_id, payment_id, method, Auditor("t"))
        assert intent is not None and intent.client_secret is not None
        shop.stripe.authenticate(intent.client_secret, False)
        after = shop.payments.learn(key.account_id, payment_id, Auditor("portal"))
        assert (after["status"], after["failure_code"]) == (
            "failed",
            "payment_intent_authentication_failure",
        )
        assert _balance(shop.api, key) == before


class TestEvents:
    def test_payment_events_are_written_with_the_change_and_may_be_subscribed(
        self, shop: Shop
    ) -> None:
        from metering.models import WebhookEvent

        key = _customer(shop)
        made = shop.api.as_key(
            key.secret,
            "POST",
            "/v1/webhook-endpoints",
            json={
                "url": "https://11.22.33.44/hook",
                "event_types": ["payment.succeeded", "payment.failed"],
            },
        )
        assert made.status_code == 201, made.text
        paid, _ = _paid_at_stripe_only(shop, key, 1500)
        shop.payments.learn(key.account_id, paid, Auditor("portal"))
        declined = shop.start(key.account_id, 500)
        shop.payments.fail_unpaid(key.account_id, declined, "card_declined", "No.", Auditor("t"))
        events = table(WebhookEvent)
        with shop.api.database.reading() as session:
            rows = session.execute(
                select(events.c.type, events.c.data)
                .where(events.c.account_id == key.account_id)
                .order_by(events.c.created_at, events.c.type.desc())
            ).all()
        found = {row.type: json.loads(row.data) for row in rows}
        grant_id = _payment(shop.api, key, paid)["grant_id"]
        assert found["payment.succeeded"] == {
            "payment_id": paid,
            "kind": "top_up",
            "amount_microcents": 1500 * MICROCENTS_PER_CENT,
            "grant_id": grant_id,
        }
        assert found["payment.failed"] == {
            "payment_id": declined,
            "kind": "top_up",
            "amount_microcents": 500 * MICROCENTS_PER_CENT,
            "failure_code": "card_declined",
        }
