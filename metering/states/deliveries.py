"""The webhook delivery's state machine, in one place: its statuses, the legal transitions, and
which deliveries the delivery loop still owes — as plain Python and as SQL, for every backend,
the listings and the metrics.

    pending ──deliver──▶ delivered   (an attempt was answered 2xx)
      │  ╲───retry────▶ pending     (an attempt failed, attempts are left: due again later)
      │  ╲───fail─────▶ failed      (the last attempt failed)
      └─────drop──────▶ dropped     (its endpoint was deleted)

    any status ──resend──▶ pending  (due now, as new: an operator's resend, an endpoint's test)

A delivery is made pending (the fan-out, a resend). A claim (metering.notifications.delivery)
leaves it pending: it counts the attempt and puts the next one a lease ahead, so a sender that
dies mid-send is retried; the attempt's outcome is recorded only by the claim that made it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    DROPPED = "dropped"


# The status a step leads to, from the statuses it may leave.
DELIVER = (frozenset({DeliveryStatus.PENDING}), DeliveryStatus.DELIVERED)
RETRY = (frozenset({DeliveryStatus.PENDING}), DeliveryStatus.PENDING)
FAIL = (frozenset({DeliveryStatus.PENDING}), DeliveryStatus.FAILED)
DROP = (frozenset({DeliveryStatus.PENDING}), DeliveryStatus.DROPPED)
RESEND = (frozenset(DeliveryStatus), DeliveryStatus.PENDING)
TRANSITIONS = {"deliver": DELIVER, "retry": RETRY, "fail": FAIL, "drop": DROP, "resend": RESEND}

# The same rule as DDL text, for the table's partial index of what the loop still owes.
PENDING_ROWS = f"status = '{DeliveryStatus.PENDING}'"


def target(transition: str) -> str:
    return TRANSITIONS[transition][1].value


def is_pending(status: str) -> bool:
    """The loop still owes the delivery an attempt (it shows its next attempt's time)."""
    return status == DeliveryStatus.PENDING


def pending(deliveries: Any) -> ColumnElement[bool]:
    """``is_pending`` over ``deliveries``' columns (the table or an alias): the status every
    step but ``resend`` leaves."""
    return deliveries.c.status == DeliveryStatus.PENDING.value
