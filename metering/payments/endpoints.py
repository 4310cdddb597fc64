"""Routes of payments: an account's payments (account key), every payment (operators), and
Stripe's events (``POST /v1/stripe/webhook``, signed by Stripe). Every one of them is 404
``not_found`` while payments are off (no ``METERING_STRIPE_SECRET_KEY``)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Strict, StringConstraints
from starlette.concurrency import run_in_threadpool

from metering.accounts.deps import AccountKeyDep
from metering.audit.deps import AuditDep
from metering.kit.errors import InvalidRequest, MeteringError, NotFound
from metering.kit.pagination import PageParams
from metering.ledger.schemas import IdempotencyKey
from metering.payments import recharge, refunds, service
from metering.payments.flows import Payments, checked_amount, payment_body
from metering.payments.stripe_records import BadSignature, StripeUnavailable
from metering.web.deps import AdminDep, SessionDep, get_clock, get_database, get_settings
from metering.web.jsonio import MeteringRoute

log = logging.getLogger("metering.payments")


class PaymentsUnavailable(MeteringError):
    status = 503
    type = "api_error"
    default_code = "payment_provider_unavailable"


async def payments_on(request: Request) -> None:
    """While payments are off, every payment route is an unknown path."""
    if not get_settings(request).payments_on:
        raise NotFound(f"no route {request.method} {request.url.path}", code="not_found")


PaymentsOn = Depends(payments_on)


def payments_of(request: Request) -> Payments:
    return Payments(get_database(request), get_settings(request), get_clock(request))


router = APIRouter(
    prefix="/v1", route_class=MeteringRoute, dependencies=[PaymentsOn], tags=["payments"]
)
admin_router = APIRouter(
    prefix="/admin/v1",
    route_class=MeteringRoute,
    dependencies=[PaymentsOn, AdminDep],
    tags=["admin: payments"],
)

Filter = Annotated[str | None, Query(max_length=40)]


@router.get("/payments")
def list_payments(key: AccountKeyDep, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """Your account's payments, newest first (paginated)."""
    limit, after = paging
    return service.list_payments(session, limit, after, account_id=key.account_id)


@router.get("/payments/{payment_id}")
def get_payment(payment_id: str, key: AccountKeyDep, session: SessionDep) -> dict[str, Any]:
    """One of your account's payments."""
    return service.get_payment(session, payment_id, account_id=key.account_id)


def on_stripe_event(payments: Payments, payload: bytes, signature: str | None) -> str:
    """A webhook's event, verified (``BadSignature`` otherwise), handed to the flow of its type
    (refunds and disputes, or payments and cards), which processes it once."""
    event = payments.stripe.event_from(payload, signature)
    kind, event_id = str(event.get("type")), str(event.get("id"))
    obj = (event.get("data") or {}).get("object") or {}
    if kind in ("charge.refunded", "charge.refund.updated"):
        return refunds.on_refund_event(payments, event_id, kind, obj)
    if kind == "charge.dispute.created":
        return refunds.on_dispute(payments, event_id, kind, obj)
    return payments.on_event(event)


@router.post("/stripe/webhook")
async def stripe_webhook(request: Request) -> dict[str, Any]:
    """Stripe's events (verified by their ``Stripe-Signature``; each processed once)."""
    payload = await request.body()
    signature = request.headers.get("stripe-signature")
    payments = payments_of(request)
    try:
        outcome = await run_in_threadpool(on_stripe_event, payments, payload, signature)
    except BadSignature:
        raise InvalidRequest(
            "the Stripe-Signature header does not verify", code="invalid_signature", param=None
        ) from None
    except StripeUnavailable as error:
        log.warning("a Stripe event could not be processed: %s", error)
        raise PaymentsUnavailable("Stripe could not be asked: send the event again") from None
    log.info("stripe event: %s", outcome)
    return {"received": True}


class TopUpCreate(BaseModel):
    """``POST /admin/v1/accounts/{id}/top-ups``: whole cents, and the request's key."""

    model_config = ConfigDict(extra="forbid")

    amount_cents: Annotated[int, Strict()]
    idempotency_key: IdempotencyKey


@admin_router.post("/accounts/{account_id}/top-ups", status_code=201)
def create_top_up(
    account_id: str, body: TopUpCreate, request: Request, response: Response, audit: AuditDep
) -> dict[str, Any]:
    """Charge the account's saved card off-session (201 the payment, succeeded or failed; 200
    with the payment as it stands when the same request is retried)."""
    amount = checked_amount(body.amount_cents, get_settings(request))
    try:
        row, created = payments_of(request).top_up(account_id, amount, body.idempotency_key, audit)
    except StripeUnavailable as error:
        log.warning("a top-up could not reach Stripe: %s", error)
        raise PaymentsUnavailable("Stripe could not be asked: retry with the same key") from None
    if not created:
        response.status_code = 200
    return payment_body(row, operator=True)


class AutoRechargePut(BaseModel):
    """``PUT /admin/v1/accounts/{id}/auto-recharge``: the four settings, all given."""

    model_config = ConfigDict(extra="forbid")

    enabled: Annotated[bool, Strict()]
    threshold_cents: Annotated[int, Strict()]
    amount_cents: Annotated[int, Strict()]
    monthly_limit_cents: Annotated[int, Strict()]


@admin_router.get("/accounts/{account_id}/auto-recharge")
def get_auto_recharge(account_id: str, session: SessionDep) -> dict[str, Any]:
    """The account's auto-recharge settings."""
    return recharge.settings_body(session, account_id)


@admin_router.put("/accounts/{account_id}/auto-recharge")
def put_auto_recharge(
    account_id: str, body: AutoRechargePut, request: Request, session: SessionDep, audit: AuditDep
) -> dict[str, Any]:
    """Replace the account's auto-recharge settings (enabling needs a saved card)."""
    wanted = recharge.checked_settings(body.model_dump(), get_settings(request))
    return recharge.put_settings(session, account_id, wanted, get_clock(request).now(), audit)


@admin_router.get("/payments")
def admin_list_payments(
    session: SessionDep,
    paging: PageParams,
    account_id: Filter = None,
    status: Filter = None,
    kind: Filter = None,
) -> dict[str, Any]:
    """Every account's payments, newest first; filters ``account_id``, ``status``, ``kind``."""
    limit, after = paging
    return service.list_payments(
        session, limit, after, account_id=account_id, status=status, kind=kind, operator=True
    )


class RefundCreate(BaseModel):
    """``POST /admin/v1/payments/{id}/refund``: how much (default: the most refundable), and
    why (kept here: Stripe is not told)."""

    model_config = ConfigDict(extra="forbid")

    amount_cents: Annotated[int, Strict()] | None = None
    reason: Annotated[str, Strict(), StringConstraints(max_length=500)] | None = None
    idempotency_key: IdempotencyKey | None = None


@admin_router.post("/payments/{payment_id}/refund", status_code=201)
def refund_payment(
    payment_id: str, body: RefundCreate, request: Request, response: Response, audit: AuditDep
) -> dict[str, Any]:
    """Refund (part of) a payment: its grant loses that much at once (at most what it holds)."""
    try:
        refund, created = refunds.refund(
            payments_of(request),
            payment_id,
            body.amount_cents,
            body.reason,
            body.idempotency_key,
            audit,
        )
    except refunds.RefundFailed:
        raise PaymentsUnavailable("Stripe did not refund it: nothing was refunded") from None
    if not created:
        response.status_code = 200
    return refund


@admin_router.get("/payments/{payment_id}")
def admin_get_payment(payment_id: str, session: SessionDep) -> dict[str, Any]:
    """One payment, with its Stripe PaymentIntent's id."""
    return service.get_payment(session, payment_id, operator=True)
