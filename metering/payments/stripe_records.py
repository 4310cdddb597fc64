"""What Stripe's answers become for the rest of the service: plain snapshots (``Intent``,
``Setup``, ``Refund``, ``Card``) and the exceptions of a call (metering.payments.stripe_api, the
one module that calls Stripe).

Kept apart from the library: the routes and flows that name these are imported by every API
process, while ``stripe`` (and the HTTP libraries it brings, about 18 MB of a process's memory)
is imported only by a process that has payments switched on.
"""

from __future__ import annotations

from dataclasses import dataclass

from metering.states.payments import IntentStatus


class StripeUnavailable(Exception):
    """Stripe could not be reached, or refused the request for a reason other than a decline
    (never retried as if it were a decline: the payment stays pending for the scheduler)."""


@dataclass(frozen=True, slots=True)
class Declined(Exception):
    """The card was declined (or needs authentication that cannot be asked for)."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class BadSignature(Exception):
    """A Stripe event whose ``Stripe-Signature`` does not verify (forged, stale, missing)."""


@dataclass(frozen=True, slots=True)
class Intent:
    """What the service reads of a PaymentIntent."""

    id: str
    status: IntentStatus
    amount: int
    currency: str
    metadata: dict[str, str]
    client_secret: str | None
    customer: str | None
    payment_method: str | None
    receipt_url: str | None
    error_code: str | None
    error_message: str | None


@dataclass(frozen=True, slots=True)
class Setup:
    """What the service reads of a SetupIntent (a card set up for later use)."""

    id: str
    status: str
    customer: str | None
    payment_method: str | None
    metadata: dict[str, str]
    client_secret: str | None


@dataclass(frozen=True, slots=True)
class Refund:
    """What the service reads of a Stripe refund."""

    id: str
    amount: int  # cents
    status: str
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class Card:
    brand: str
    last4: str
    exp_month: int
    exp_year: int
