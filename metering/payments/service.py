"""Reading payments: an account's, and every account's for operators (newest first)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.kit.errors import InvalidRequest, NotFound
from metering.kit.pagination import newest_first_by_time
from metering.payments.flows import PAYMENTS, payment_body
from metering.states.payments import PaymentKind, PaymentStatus


def list_payments(
    session: Session,
    limit: int,
    after: str | None,
    *,
    account_id: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    operator: bool = False,
) -> dict[str, Any]:
    """Payments newest first (by creation, then id), of one account or of all (operators)."""
    query = select(PAYMENTS)
    if account_id is not None:
        query = query.where(PAYMENTS.c.account_id == account_id)
    if status is not None:
        if status not in set(PaymentStatus):
            raise InvalidRequest(
                f"status must be one of {', '.join(PaymentStatus)}", param="status"
            )
        query = query.where(PAYMENTS.c.status == status)
    if kind is not None:
        if kind not in set(PaymentKind):
            known = ", ".join(PaymentKind)
            raise InvalidRequest(f"kind must be one of {known}", param="kind")
        query = query.where(PAYMENTS.c.kind == kind)
    return newest_first_by_time(
        session,
        query,
        PAYMENTS.c.created_at,
        PAYMENTS.c.id,
        limit,
        after,
        lambda row: payment_body(row, operator),
    )


def get_payment(
    session: Session, payment_id: str, *, account_id: str | None = None, operator: bool = False
) -> dict[str, Any]:
    query = select(PAYMENTS).where(PAYMENTS.c.id == payment_id)
    if account_id is not None:
        query = query.where(PAYMENTS.c.account_id == account_id)
    row = session.execute(query).first()
    if row is None:
        raise NotFound(f"no payment {payment_id}", param="payment_id")
    return payment_body(row._mapping, operator)
