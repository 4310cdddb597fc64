"""The payment's state machine, in one place: its statuses, the legal transitions, and the
table's check constraint; beside it a refund's, and the statuses Stripe gives a PaymentIntent.

    pending ──succeed──▶ succeeded   (Stripe says the PaymentIntent succeeded: one paid grant,
       │                     ▲         written in the same transaction)
       └────fail────▶ failed ┘ late   (a decline, an abandoned payment; a PaymentIntent that
                                       still succeeds afterwards is money received: credited)

A payment is created ``pending`` before Stripe is called (its id is the idempotency key of every
Stripe call that creates or confirms its PaymentIntent). ``succeeded`` is final: whatever arrives
afterwards (a repeated event, the return page, the scheduler) finds it so and changes nothing.
``failed`` is final for our side unless Stripe later reports the PaymentIntent succeeded (a
customer who retried the same PaymentIntent with another card): credit follows money received.
"""

from __future__ import annotations

from enum import StrEnum

from metering.states import listed


class PaymentStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class IntentStatus(StrEnum):
    """A Stripe PaymentIntent's (or SetupIntent's: the same names) status, as Stripe reports it
    (the service never writes one)."""

    REQUIRES_PAYMENT_METHOD = "requires_payment_method"
    REQUIRES_CONFIRMATION = "requires_confirmation"
    REQUIRES_ACTION = "requires_action"
    PROCESSING = "processing"
    REQUIRES_CAPTURE = "requires_capture"
    CANCELED = "canceled"
    SUCCEEDED = "succeeded"


# PaymentIntent statuses in which nothing was or will be paid without the customer.
UNPAID = frozenset(
    {
        IntentStatus.REQUIRES_PAYMENT_METHOD,
        IntentStatus.REQUIRES_CONFIRMATION,
        IntentStatus.REQUIRES_ACTION,
    }
)


class PaymentKind(StrEnum):
    TOP_UP = "top_up"
    AUTO_RECHARGE = "auto_recharge"


# The stored status a step writes, from the statuses it may leave.
SUCCEED = (frozenset({PaymentStatus.PENDING, PaymentStatus.FAILED}), PaymentStatus.SUCCEEDED)
FAIL = (frozenset({PaymentStatus.PENDING}), PaymentStatus.FAILED)
TRANSITIONS = {"succeed": SUCCEED, "fail": FAIL}


class IllegalTransition(Exception):
    """A step asked of a payment in a status it may not leave that way."""


def may(transition: str, status: str) -> bool:
    """Whether ``transition`` may be taken from ``status``."""
    sources, _ = TRANSITIONS[transition]
    return PaymentStatus(status) in sources


def target(transition: str, status: str) -> PaymentStatus:
    """The status ``transition`` writes from ``status``; ``IllegalTransition`` if it may not."""
    sources, result = TRANSITIONS[transition]
    if PaymentStatus(status) not in sources:
        raise IllegalTransition(f"a {status} payment cannot {transition}")
    return result


# The same rules as DDL text, for the table's check constraints.
STATUS_CHECK = listed("status", PaymentStatus)
KIND_CHECK = listed("kind", PaymentKind)
PENDING_ROWS = f"status = '{PaymentStatus.PENDING}'"
RECHARGE_IN_FLIGHT = f"kind = '{PaymentKind.AUTO_RECHARGE}' AND status = '{PaymentStatus.PENDING}'"


# -- refunds -------------------------------------------------------------------------------------
#
#     pending ──succeed──▶ succeeded   (Stripe refunded it: the grant loses it, in that transaction)
#        │                     ▲
#        └────fail────▶ failed ┘ late  (Stripe could not be asked, refused, or failed it; or the
#                                       scheduler found no such refund at Stripe. One that Stripe
#                                       reports made afterwards, by ``charge.refunded``, is
#                                       applied; one Stripe failed, never)
#
# An operator's refund is written ``pending`` before Stripe is called (its id is the idempotency
# key and ``metadata.refund_id`` of Stripe's refund); one made in Stripe's dashboard is written
# ``succeeded`` when its ``charge.refunded`` arrives. Applied once: a refund's effect is written
# only by the step that makes it ``succeeded``.


class RefundStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class RefundSource(StrEnum):
    OPERATOR = "operator"  # POST /admin/v1/payments/{id}/refund
    STRIPE = "stripe"  # made in Stripe's dashboard: learnt from charge.refunded


REFUND_SUCCEED = (
    frozenset({RefundStatus.PENDING, RefundStatus.FAILED}),
    RefundStatus.SUCCEEDED,
)
REFUND_FAIL = (frozenset({RefundStatus.PENDING}), RefundStatus.FAILED)
REFUND_TRANSITIONS = {"succeed": REFUND_SUCCEED, "fail": REFUND_FAIL}


def refund_may(transition: str, status: str) -> bool:
    """Whether a refund in ``status`` may take ``transition``."""
    sources, _ = REFUND_TRANSITIONS[transition]
    return RefundStatus(status) in sources


class StripeRefundStatus(StrEnum):
    """A Stripe refund's status, as Stripe reports it."""

    PENDING = "pending"
    REQUIRES_ACTION = "requires_action"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


# Stripe refund statuses in which no money went back (any other is money leaving: a card
# refund may stay pending a while).
UNREFUNDED = frozenset({StripeRefundStatus.FAILED, StripeRefundStatus.CANCELED})

REFUND_STATUS_CHECK = listed("status", RefundStatus)
REFUND_SOURCE_CHECK = listed("source", RefundSource)
