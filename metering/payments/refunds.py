"""Refunds and disputes of payments (docs/api.md#payments).

A refund takes money back from the grant the payment bought, at once: one ``refund`` ledger
entry naming the grant, the grant's remainder lowered by what it still holds of it (the rest,
which the customer had spent, becomes deficit: metering.ledger.credit_grants.refund_grant), and
the payment's ``refunded_cents`` raised, in the one transaction that marks the refund
``succeeded`` (``apply``, the only place a refund has its effect, under the account's and the
refund's row locks). Two ways in:

* an operator's ``POST /admin/v1/payments/{id}/refund``: at most what the grant still holds, its
  refund row written ``pending`` before Stripe is called (its id the idempotency key and
  ``metadata.refund_id`` of Stripe's refund), then applied with Stripe's answer;
* Stripe's ``charge.refunded`` or ``charge.refund.updated`` (a refund made in Stripe's
  dashboard, one of ours whose answer was lost, or one that failed at Stripe): the refunds
  Stripe lists for the PaymentIntent now, each applied once (by its Stripe id; ours found again
  by ``metadata.refund_id``), those Stripe reports ``failed`` or ``canceled`` never.

A refund of ours that does not succeed is ``failed`` (``fail``: its amount no longer reserved,
``payment.refund_failed``, audited ``refund.fail``): Stripe could not be asked, refused,
or answered a failed refund. One still ``pending`` 5 minutes on (its process died during or
right after Stripe's call) is settled by the scheduler (``reconcile``) from what Stripe lists:
applied if Stripe refunded it, failed if Stripe has no refund of it (the request never reached
Stripe: nothing is sent again, the operator decides).

A dispute (``charge.dispute.created``) changes no credit: it is an operator-only event.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from metering.audit.service import Auditor
from metering.kit.errors import Conflict, InvalidRequest, NotFound
from metering.kit.ids import new_id
from metering.kit.timeutil import format_timestamp
from metering.ledger import credit_grants
from metering.ledger import service as ledger
from metering.metrics import REGISTRY
from metering.models import PaymentRefund, table
from metering.notifications import outbox
from metering.payments.flows import (
    MICROCENTS_PER_CENT,
    PAYMENTS,
    Payments,
    Row,
    counted,
    find,
    locked,
    payment_body,
    settle_stale,
)
from metering.payments.stripe_records import Declined, Refund, StripeUnavailable
from metering.states import payments as states
from metering.states.payments import UNREFUNDED, PaymentStatus, RefundSource, RefundStatus

log = logging.getLogger("metering.payments")

REFUNDS = table(PaymentRefund)

REFUNDS_TOTAL = REGISTRY.counter(
    "metering_payment_refunds_total", "Refunds applied, by source.", ("source",)
)
REFUNDED_MICROCENTS = REGISTRY.counter(
    "metering_payment_refunded_microcents_total",
    "Credit taken back by refunds (microcents), by source.",
    ("source",),
)
REFUND_FAILURES_TOTAL = REGISTRY.counter(
    "metering_payment_refund_failures_total",
    "Refunds of ours failed (Stripe could not be asked, refused, or failed them): nothing was "
    "refunded, and their amount may be refunded again.",
)
DISPUTES_TOTAL = REGISTRY.counter(
    "metering_payment_disputes_total", "Disputes Stripe reported, by payment kind.", ("kind",)
)


class RefundFailed(Exception):
    """Stripe could not be asked, refused, or failed the refund: nothing was refunded (the
    refund is ``failed``)."""


def refund_body(row: Row, payment: Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "refund",
        "payment_id": row["payment_id"],
        "account_id": row["account_id"],
        "source": row["source"],
        "amount_cents": int(row["amount_cents"]),
        "status": row["status"],
        "reason": row["reason"],
        "stripe_refund_id": row["stripe_refund_id"],
        "created_at": format_timestamp(row["created_at"]),
        "payment": payment_body(payment, operator=True),
    }


def _refund_row(session: Session, account_id: str, refund_id: str, lock: bool = False) -> Row:
    query = select(REFUNDS).where(REFUNDS.c.account_id == account_id, REFUNDS.c.id == refund_id)
    if lock:
        query = query.with_for_update()
    return session.execute(query).one()._mapping


def refundable_cents(session: Session, payment: Row, now: datetime) -> int:
    """The most an operator may refund of the payment now: what its grant still holds (whole
    cents), within what was paid and not yet refunded, less refunds still being asked of
    Stripe. The caller holds the account's row lock."""
    if payment["status"] != PaymentStatus.SUCCEEDED or payment["grant_id"] is None:
        return 0
    account_id = payment["account_id"]
    held = credit_grants.live_remainder(session, account_id, payment["grant_id"], now)
    asked = session.execute(
        select(func.coalesce(func.sum(REFUNDS.c.amount_cents), 0)).where(
            REFUNDS.c.account_id == account_id,
            REFUNDS.c.payment_id == payment["id"],
            REFUNDS.c.status == RefundStatus.PENDING.value,
        )
    ).scalar_one()
    unrefunded = int(payment["amount_cents"]) - int(payment["refunded_cents"])
    return max(0, min(held // MICROCENTS_PER_CENT, unrefunded) - int(asked))


def apply(
    session: Session,
    refund: Row,
    stripe_refund_id: str,
    now: datetime,
    auditor: Auditor,
) -> Row:
    """The refund's effect, once (the account's row lock held): its ``refund`` entry, the
    grant's and the deficit's share, the payment's ``refunded_cents``; ``payment.refunded``,
    audited, counted after the commit. A refund already succeeded is returned as it is."""
    account_id = refund["account_id"]
    refund = _refund_row(session, account_id, refund["id"], lock=True)
    if not states.refund_may("succeed", refund["status"]):
        return refund
    payment = locked(session, account_id, refund["payment_id"])
    amount = int(refund["amount_cents"]) * MICROCENTS_PER_CENT
    entry_id, deficit = credit_grants.refund_grant(
        session,
        account_id,
        payment["grant_id"],
        amount,
        refund["reason"] or f"refund {refund['id']} of payment {payment['id']}",
        now,
    )
    session.execute(
        update(PAYMENTS)
        .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment["id"])
        .values(
            refunded_cents=PAYMENTS.c.refunded_cents + int(refund["amount_cents"]),
            updated_at=now,
        )
    )
    session.execute(
        update(REFUNDS)
        .where(REFUNDS.c.account_id == account_id, REFUNDS.c.id == refund["id"])
        .values(
            status=RefundStatus.SUCCEEDED.value,
            stripe_refund_id=stripe_refund_id,
            entry_id=entry_id,
            deficit_microcents=deficit,
            failure_message=None,
            succeeded_at=now,
            updated_at=now,
        )
    )
    outbox.emit(
        session,
        outbox.PAYMENT_REFUNDED,
        account_id,
        {"payment_id": payment["id"], "amount_microcents": amount},
        now,
    )
    auditor.record(
        session,
        now,
        "payment.refund",
        "payment",
        payment["id"],
        account_id,
        {
            "refund_id": refund["id"],
            "amount_cents": int(refund["amount_cents"]),
            "reason": refund["reason"],
            "source": refund["source"],
            "stripe_refund_id": stripe_refund_id,
            "deficit_microcents": deficit,
        },
    )
    source = refund["source"]

    def count() -> None:
        REFUNDS_TOTAL.inc(source)
        REFUNDED_MICROCENTS.inc(source, amount=amount)

    session.info.setdefault("after_commit", []).append(count)
    return _refund_row(session, account_id, refund["id"])


def fail(
    session: Session,
    account_id: str,
    refund_id: str,
    message: str,
    stripe_refund_id: str | None,
    now: datetime,
    auditor: Auditor,
) -> Row:
    """A pending refund that will not be applied (the account's row lock held): ``failed``,
    its amount no longer reserved, ``payment.refund_failed``, audited ``refund.fail``.
    A refund in any other status is returned as it is."""
    refund = _refund_row(session, account_id, refund_id, lock=True)
    if not states.refund_may("fail", refund["status"]):
        return refund
    message = message[:500]
    values: dict[str, Any] = {
        "status": RefundStatus.FAILED.value,
        "failure_message": message,
        "updated_at": now,
    }
    if stripe_refund_id is not None:
        values["stripe_refund_id"] = stripe_refund_id
    session.execute(
        update(REFUNDS)
        .where(REFUNDS.c.account_id == account_id, REFUNDS.c.id == refund["id"])
        .values(values)
    )
    REFUND_FAILURES_TOTAL.inc()
    amount_cents = int(refund["amount_cents"])
    outbox.emit(
        session,
        outbox.PAYMENT_REFUND_FAILED,
        account_id,
        {
            "payment_id": refund["payment_id"],
            "refund_id": refund["id"],
            "amount_microcents": amount_cents * MICROCENTS_PER_CENT,
            "failure_message": message,
        },
        now,
    )
    auditor.record(
        session,
        now,
        "refund.fail",
        "payment",
        refund["payment_id"],
        account_id,
        {
            "refund_id": refund["id"],
            "amount_cents": amount_cents,
            "stripe_refund_id": stripe_refund_id,
            "failure_message": message,
        },
    )
    return _refund_row(session, account_id, refund["id"])


def _failed_at_stripe(stripe_refund: Refund) -> str:
    return f"Stripe's refund {stripe_refund.id} is {stripe_refund.status}: nothing was refunded"


def _payment_by_id(payments: Payments, payment_id: str) -> Row:
    with payments.database.reading() as session:
        row = session.execute(select(PAYMENTS).where(PAYMENTS.c.id == payment_id)).first()
    if row is None:
        raise NotFound(f"no payment {payment_id}", param="payment_id")
    return row._mapping


def _replayed(session: Session, account_id: str, key: str, fingerprint: str) -> Row | None:
    """The refund made before with ``key`` (None: none), if it was the same request (409
    ``idempotency_conflict`` otherwise)."""
    row = session.execute(
        select(REFUNDS).where(REFUNDS.c.account_id == account_id, REFUNDS.c.idempotency_key == key)
    ).first()
    if row is None:
        return None
    if row.request_fingerprint != fingerprint:
        raise Conflict(
            f"idempotency_key {key!r} was already used for another refund of this account",
            code="idempotency_conflict",
            param="idempotency_key",
        )
    return row._mapping


def refund(
    payments: Payments,
    payment_id: str,
    amount_cents: int | None,
    reason: str | None,
    idempotency_key: str | None,
    auditor: Auditor,
) -> tuple[dict[str, Any], bool]:
    """An operator's refund: checked and written ``pending`` (one transaction), asked of Stripe
    (no transaction open), then applied (another). ``amount_cents`` None: the most refundable.
    With ``idempotency_key``, the same request again answers the refund made first, as it
    stands (never refunded twice). Returns the refund's body and whether this request made it;
    ``RefundFailed`` when Stripe did not refund it."""
    account_id = _payment_by_id(payments, payment_id)["account_id"]
    now = payments.clock.now()
    fingerprint = ledger.fingerprint(
        {"payment_id": payment_id, "amount_cents": amount_cents, "reason": reason}
    )
    with payments.database.unit_of_work() as session:
        ledger.lock_account(session, account_id)
        payment = locked(session, account_id, payment_id)
        if idempotency_key is not None:
            before = _replayed(session, account_id, idempotency_key, fingerprint)
            if before is not None:
                return refund_body(before, payment), False
        most = refundable_cents(session, payment, now)
        amount = most if amount_cents is None else amount_cents
        if amount_cents is not None and amount_cents <= 0:
            raise InvalidRequest(
                "amount_cents must be a whole number of cents above 0",
                code="invalid_parameter",
                param="amount_cents",
            )
        if amount <= 0 or amount > most:
            raise InvalidRequest(
                f"at most {most} cents of payment {payment_id} can be refunded (what its grant "
                "still holds)",
                code="refund_exceeds_remaining",
                param="amount_cents",
            )
        refund_id = new_id("refund")
        session.execute(
            insert(REFUNDS).values(
                id=refund_id,
                account_id=account_id,
                payment_id=payment_id,
                source=RefundSource.OPERATOR.value,
                amount_cents=amount,
                status=RefundStatus.PENDING.value,
                reason=reason,
                idempotency_key=idempotency_key,
                request_fingerprint=fingerprint if idempotency_key is not None else None,
                deficit_microcents=0,
                created_at=now,
                updated_at=now,
            )
        )
        intent_id = str(payment["stripe_payment_intent_id"])
        session.commit()
    metadata = {"refund_id": refund_id, "payment_id": payment_id, "account_id": account_id}
    failure: tuple[str, str | None] | None = None  # why, and Stripe's refund if it made one
    try:
        answer = payments.stripe.create_refund(refund_id, intent_id, amount, metadata)
    except (StripeUnavailable, Declined) as error:
        failure = (str(error), None)
    else:
        if answer.status in UNREFUNDED:
            failure = (_failed_at_stripe(answer), answer.id)
    if failure is not None:
        message, stripe_refund_id = failure
        log.warning("refund %s of payment %s: not refunded: %s", refund_id, payment_id, message)
        with payments.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            fail(
                session,
                account_id,
                refund_id,
                message,
                stripe_refund_id,
                payments.clock.now(),
                auditor,
            )
            session.commit()
        raise RefundFailed(message)
    with payments.database.unit_of_work() as session:
        ledger.lock_account(session, account_id)
        row = apply(
            session,
            _refund_row(session, account_id, refund_id),
            answer.id,
            payments.clock.now(),
            auditor,
        )
        payment = locked(session, account_id, payment_id)
        session.commit()
        counted(session)
    return refund_body(row, payment), True


# -- Stripe's events -----------------------------------------------------------------------------


def _ours(payments: Payments, obj: Row) -> tuple[str, str, str] | None:
    """The (PaymentIntent, account, payment) a charge, refund or dispute of an event is about
    (its ``payment_intent``, else its charge's), as Stripe's own copy of the intent says (its
    metadata), if this service made it and the payment names it."""
    intent_id = obj.get("payment_intent")
    if not isinstance(intent_id, str):
        charge = obj.get("charge")
        if not isinstance(charge, str):
            return None
        intent_id = payments.stripe.intent_of_charge(charge)
        if intent_id is None:
            return None
    intent = payments.stripe.retrieve_payment_intent(intent_id)
    account_id, payment_id = intent.metadata.get("account_id"), intent.metadata.get("payment_id")
    if not account_id or not payment_id:
        return None
    with payments.database.reading() as session:
        found = session.execute(
            select(PAYMENTS.c.stripe_payment_intent_id).where(
                PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id
            )
        ).first()
    if found is None or found.stripe_payment_intent_id != intent_id:
        return None
    return intent_id, account_id, payment_id


def _row_of(session: Session, payment: Row, stripe_refund: Refund) -> tuple[Row | None, bool]:
    """Our row of a refund Stripe lists (None: none), and whether it was found by its Stripe id
    (already settled with Stripe's answer) rather than as ours by ``metadata.refund_id``."""
    account_id = payment["account_id"]
    known = session.execute(
        select(REFUNDS).where(
            REFUNDS.c.account_id == account_id, REFUNDS.c.stripe_refund_id == stripe_refund.id
        )
    ).first()
    if known is not None:
        return known._mapping, True
    ours = stripe_refund.metadata.get("refund_id")
    if not ours:
        return None, False
    row = session.execute(
        select(REFUNDS).where(
            REFUNDS.c.account_id == account_id,
            REFUNDS.c.id == ours,
            REFUNDS.c.payment_id == payment["id"],
        )
    ).first()
    return (row._mapping if row is not None else None), False


def _learn(
    session: Session, payment: Row, stripe_refund: Refund, now: datetime, auditor: Auditor
) -> None:
    """One refund Stripe lists for the payment: applied unless it already was (or failed, if
    Stripe failed or canceled it: then never applied)."""
    row, settled = _row_of(session, payment, stripe_refund)
    if stripe_refund.status in UNREFUNDED:
        if row is None:
            return  # made in Stripe's dashboard and failed there: it never had an effect
        if row["status"] == RefundStatus.SUCCEEDED:
            # Stripe took back a refund it had reported made: the credit stays taken back
            # (the money is back in the Stripe balance), for an operator to settle.
            log.error(
                "refund %s of payment %s was applied but Stripe now reports %s",
                row["id"],
                payment["id"],
                _failed_at_stripe(stripe_refund),
            )
            return
        message = _failed_at_stripe(stripe_refund)
        fail(session, row["account_id"], row["id"], message, stripe_refund.id, now, auditor)
        return
    if settled:
        return
    if row is None:
        refund_id = new_id("refund")
        session.execute(
            insert(REFUNDS).values(
                id=refund_id,
                account_id=payment["account_id"],
                payment_id=payment["id"],
                source=RefundSource.STRIPE.value,
                amount_cents=stripe_refund.amount,
                status=RefundStatus.PENDING.value,
                reason=None,
                deficit_microcents=0,
                created_at=now,
                updated_at=now,
            )
        )
        row = _refund_row(session, payment["account_id"], refund_id)
    apply(session, row, stripe_refund.id, now, auditor)


def on_refund_event(payments: Payments, event_id: str, kind: str, obj: Row) -> str:
    """Stripe's ``charge.refunded`` (its object a charge) or ``charge.refund.updated`` (a
    refund): the refunds Stripe lists for the PaymentIntent now, each applied once (what the
    grant no longer holds is taken as a deficit); ours that Stripe failed are failed."""
    found = _ours(payments, obj)
    if found is None:
        return "not ours"
    intent_id, account_id, payment_id = found
    listed = payments.stripe.list_refunds(intent_id)
    auditor = Auditor("stripe")
    with payments.database.unit_of_work() as session:
        ledger.lock_account(session, account_id)
        if not payments.record_event(session, account_id, event_id, kind):
            return "already processed"
        payment = locked(session, account_id, payment_id)
        if payment["status"] != PaymentStatus.SUCCEEDED or payment["grant_id"] is None:
            log.warning("payment %s was refunded in Stripe but never credited", payment_id)
        else:
            now = payments.clock.now()
            # Oldest first: each refund's share of the grant as it happened.
            for stripe_refund in reversed(listed):
                _learn(session, payment, stripe_refund, now, auditor)
                payment = locked(session, account_id, payment_id)
        session.commit()
        counted(session)
    return "processed"


# -- the scheduler -------------------------------------------------------------------------------


def reconcile(payments: Payments, limit: int = 100) -> int:
    """Operators' refunds still ``pending`` 5 minutes on (their process died during or right
    after Stripe's call), settled from what Stripe lists for the payment: applied once if
    Stripe refunded them, failed if Stripe failed them or has none of them. Returns how many
    moved. Replicas and Stripe's events may settle the same refund at once: each step takes
    the account's and the refund's row locks and moves only a refund still pending."""
    auditor = Auditor("scheduler")
    return settle_stale(
        payments,
        select(REFUNDS.c.id, REFUNDS.c.account_id, REFUNDS.c.payment_id).where(
            REFUNDS.c.status == RefundStatus.PENDING.value
        ),
        REFUNDS.c.created_at,
        limit,
        "refund",
        lambda row: _settle(payments, row.account_id, row.payment_id, row.id, auditor),
    )


def _settle(
    payments: Payments, account_id: str, payment_id: str, refund_id: str, auditor: Auditor
) -> int:
    with payments.database.reading() as session:
        intent_id = str(find(session, account_id, payment_id)["stripe_payment_intent_id"])
    # Stripe lists newest first: the oldest refund carrying our id is the one our call made.
    mine = [
        r
        for r in payments.stripe.list_refunds(intent_id)
        if r.metadata.get("refund_id") == refund_id
    ]
    with payments.database.unit_of_work() as session:
        ledger.lock_account(session, account_id)
        if _refund_row(session, account_id, refund_id)["status"] != RefundStatus.PENDING:
            return 0  # settled meanwhile (another scheduler, Stripe's event)
        payment = locked(session, account_id, payment_id)
        now = payments.clock.now()
        if mine:
            _learn(session, payment, mine[-1], now, auditor)
        else:
            fail(
                session,
                account_id,
                refund_id,
                "Stripe has no refund of it: the request never reached Stripe",
                None,
                now,
                auditor,
            )
        after = _refund_row(session, account_id, refund_id)
        session.commit()
        counted(session)
    return int(after["status"] != RefundStatus.PENDING)


def on_dispute(payments: Payments, event_id: str, kind: str, obj: Row) -> str:
    """Stripe's ``charge.dispute.created``: ``payment.disputed`` for operators; no credit
    changes."""
    found = _ours(payments, obj)
    if found is None:
        return "not ours"
    _, account_id, payment_id = found
    amount = obj.get("amount")
    amount_cents = amount if isinstance(amount, int) and not isinstance(amount, bool) else 0
    reason = str(obj.get("reason") or "")[:200]
    now = payments.clock.now()
    with payments.database.unit_of_work() as session:
        ledger.lock_account(session, account_id)
        if not payments.record_event(session, account_id, event_id, kind):
            return "already processed"
        payment_kind = str(locked(session, account_id, payment_id)["kind"])
        data = {
            "payment_id": payment_id,
            "amount_microcents": amount_cents * MICROCENTS_PER_CENT,
            "reason": reason,
        }
        outbox.emit(session, outbox.PAYMENT_DISPUTED, account_id, data, now)
        Auditor("stripe").record(
            session,
            now,
            "payment.dispute",
            "payment",
            payment_id,
            account_id,
            {"amount_cents": amount_cents, "reason": reason, "dispute": obj.get("id")},
        )
        session.commit()
    DISPUTES_TOTAL.inc(payment_kind)
    return "processed"
