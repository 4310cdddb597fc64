"""The payment's state machine, in one place: its statuses, the legal transitions, and the
table's check constraint.

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


class PaymentStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


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


def _in(column: str, values: type[StrEnum]) -> str:
    return f"{column} IN (" + ", ".join(f"'{value}'" for value in values) + ")"


# The same rules as DDL text, for the table's check constraints.
STATUS_CHECK = _in("status", PaymentStatus)
KIND_CHECK = _in("kind", PaymentKind)
PENDING_ROWS = f"status = '{PaymentStatus.PENDING}'"
RECHARGE_IN_FLIGHT = f"kind = '{PaymentKind.AUTO_RECHARGE}' AND status = '{PaymentStatus.PENDING}'"
