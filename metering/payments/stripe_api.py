"""The one place that calls Stripe, through its official library (``stripe``).

Everything else sees plain snapshots (``Intent``, ``Setup``, ``Card``) and two exceptions
(``Declined``: the card or bank said no; ``StripeUnavailable``: Stripe could not be asked or
answered with an error that is not a decline), defined in metering.payments.stripe_records.
No database session is open while these calls run: each flow commits what it knows first
(metering.payments.flows).

Idempotency: the payment's id is the key of the call that creates its PaymentIntent, and
``<payment id>:confirm`` of the call that confirms it (Stripe refuses one key on two endpoints),
so a retried call never charges twice. The PaymentIntent is created unconfirmed, its id recorded,
then confirmed: a process that dies in between leaves an intent that charged nobody, and one that
dies after the confirmation leaves an id the scheduler can look up.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import stripe

from metering.payments.stripe_records import (
    BadSignature,
    Card,
    Declined,
    Intent,
    Refund,
    Setup,
    StripeUnavailable,
)
from metering.settings import Settings
from metering.states.payments import IntentStatus

CURRENCY = "usd"


@lru_cache(maxsize=4)
def _client(secret_key: str, api_base: str) -> stripe.StripeClient:
    # A client of its own (never the library's globals): the API base is per service.
    return stripe.StripeClient(secret_key, base_addresses={"api": api_base}, max_network_retries=2)


class Stripe:
    """Stripe as the service configures it."""

    def __init__(self, settings: Settings) -> None:
        self._client = _client(settings.stripe_secret_key, settings.stripe_api_base)
        self._webhook_secret = settings.stripe_webhook_secret

    # -- customers and cards --------------------------------------------------------------------

    def create_customer(self, account_id: str) -> str:
        customer = _call(
            self._client.v1.customers.create,
            {"metadata": {"account_id": account_id}},
            {"idempotency_key": f"customer:{account_id}"},
        )
        return str(customer.id)

    def create_setup_intent(self, customer: str, metadata: dict[str, str]) -> Setup:
        setup = _call(
            self._client.v1.setup_intents.create,
            {"customer": customer, "usage": "off_session", "metadata": metadata},
            None,
        )
        return _setup(setup)

    def retrieve_setup_intent(self, setup_intent_id: str) -> Setup:
        return _setup(_call(self._client.v1.setup_intents.retrieve, setup_intent_id, None))

    def claim_card(self, payment_method_id: str, account_id: str) -> Card:
        """The card of a payment method being saved, its ``metadata.account_id`` set: Stripe's
        ``payment_method.detached`` (which names no customer any more) then says whose card it
        was, so the event is handled on that account's rows alone."""
        method = _call(
            self._client.v1.payment_methods.update,
            payment_method_id,
            {"metadata": {"account_id": account_id}},
        )
        card = _plain(method).get("card") or {}
        return Card(
            brand=str(card.get("brand") or "card"),
            last4=str(card.get("last4") or ""),
            exp_month=int(card.get("exp_month") or 0),
            exp_year=int(card.get("exp_year") or 0),
        )

    def detach_payment_method(self, payment_method_id: str) -> None:
        """Detached from its customer (one already detached, or unknown, is left so)."""
        try:
            self._client.v1.payment_methods.detach(payment_method_id)
        except stripe.InvalidRequestError:
            return
        except stripe.StripeError as error:
            raise StripeUnavailable(_described(error)) from None

    # -- payment intents ------------------------------------------------------------------------

    def create_payment_intent(
        self,
        payment_id: str,
        account_id: str,
        amount_cents: int,
        customer: str,
        payment_method: str,
    ) -> Intent:
        """An unconfirmed PaymentIntent for the payment (its id the idempotency key)."""
        params = {
            "amount": amount_cents,
            "currency": CURRENCY,
            "customer": customer,
            "payment_method": payment_method,
            "metadata": {"payment_id": payment_id, "account_id": account_id},
        }
        intent = _call(
            self._client.v1.payment_intents.create, params, {"idempotency_key": payment_id}
        )
        return self._intent(intent)

    def confirm_payment_intent(self, payment_id: str, intent_id: str) -> Intent:
        """Confirm it with its payment method: succeeded, or requires_action (3-D Secure, for
        Stripe.js to complete), or ``Declined``."""
        options: Any = {"idempotency_key": f"{payment_id}:confirm"}
        try:
            intent = self._client.v1.payment_intents.confirm(intent_id, None, options)
        except stripe.CardError as error:
            raise Declined(
                error.code or "card_declined", error.user_message or str(error)
            ) from None
        except stripe.StripeError as error:
            raise StripeUnavailable(_described(error)) from None
        return self._intent(intent)

    def retrieve_payment_intent(self, intent_id: str) -> Intent:
        return self._intent(_call(self._client.v1.payment_intents.retrieve, intent_id, None))

    def cancel_payment_intent(self, intent_id: str) -> Intent:
        return self._intent(_call(self._client.v1.payment_intents.cancel, intent_id, None))

    def _intent(self, intent: Any) -> Intent:
        data = _plain(intent)
        error = data.get("last_payment_error") or {}
        try:
            status = IntentStatus(str(data.get("status")))
        except ValueError:
            raise StripeUnavailable(f"PaymentIntent status {data.get('status')!r}") from None
        return Intent(
            id=str(data["id"]),
            status=status,
            amount=int(data.get("amount") or 0),
            currency=str(data.get("currency") or ""),
            metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
            client_secret=data.get("client_secret"),
            customer=_id_of(data.get("customer")),
            payment_method=_id_of(data.get("payment_method")),
            receipt_url=self._receipt_url(data.get("latest_charge")),
            error_code=error.get("code"),
            error_message=error.get("message"),
        )

    def _receipt_url(self, charge: Any) -> str | None:
        """The receipt of the intent's charge (Stripe gives the charge's id; an expanded charge
        is read as it is)."""
        if charge is None:
            return None
        if isinstance(charge, str):
            charge = _plain(_call(self._client.v1.charges.retrieve, charge, None))
        url = charge.get("receipt_url")
        return str(url) if url else None

    # -- refunds --------------------------------------------------------------------------------

    def create_refund(
        self, refund_id: str, intent_id: str, amount_cents: int, metadata: dict[str, str]
    ) -> Refund:
        """Refund ``amount_cents`` of the PaymentIntent's charge (``refund_id`` the idempotency
        key). The reason stays ours: it is never sent (localstripe refuses the parameter)."""
        params = {"payment_intent": intent_id, "amount": amount_cents, "metadata": metadata}
        refund = _call(self._client.v1.refunds.create, params, {"idempotency_key": refund_id})
        return _refund(refund)

    def list_refunds(self, intent_id: str) -> list[Refund]:
        """The refunds of the PaymentIntent's charge, as Stripe has them now (at most 100: a
        payment is refunded a few times at most)."""
        params = {"payment_intent": intent_id, "limit": 100}
        found = _call(self._client.v1.refunds.list, params, None)
        return [_refund(refund) for refund in _plain(found).get("data") or []]

    def intent_of_charge(self, charge_id: str) -> str | None:
        """The PaymentIntent a charge belongs to (None: none)."""
        charge = _plain(_call(self._client.v1.charges.retrieve, charge_id, None))
        return _id_of(charge.get("payment_intent"))

    # -- events ---------------------------------------------------------------------------------

    def event_from(self, payload: bytes, signature: str | None) -> dict[str, Any]:
        """The event of a webhook request, verified by the library (its 5-minute tolerance)."""
        if not self._webhook_secret:
            raise BadSignature("METERING_STRIPE_WEBHOOK_SECRET is not set")
        try:
            event = self._client.construct_event(payload, signature, self._webhook_secret)
        except (stripe.SignatureVerificationError, ValueError) as error:
            raise BadSignature(str(error)) from None
        return _plain(event)


def _call(method: Any, first: Any, options: Any) -> Any:
    try:
        if options is None:
            return method(first)
        return method(first, options)
    except stripe.CardError as error:
        raise Declined(error.code or "card_declined", error.user_message or str(error)) from None
    except stripe.StripeError as error:
        raise StripeUnavailable(_described(error)) from None


def _described(error: stripe.StripeError) -> str:
    # The library's text names no secret (the key is never in it): kept for the logs.
    return f"{type(error).__name__}: {error.user_message or error}"


def _plain(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    result: dict[str, Any] = obj.to_dict()
    return result


def _id_of(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(_plain(value).get("id"))


def _setup(setup: Any) -> Setup:
    data = _plain(setup)
    return Setup(
        id=str(data["id"]),
        status=str(data.get("status")),
        customer=_id_of(data.get("customer")),
        payment_method=_id_of(data.get("payment_method")),
        metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
        client_secret=data.get("client_secret"),
    )


def _refund(refund: Any) -> Refund:
    data = _plain(refund)
    return Refund(
        id=str(data["id"]),
        amount=int(data.get("amount") or 0),
        status=str(data.get("status")),
        metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
    )
