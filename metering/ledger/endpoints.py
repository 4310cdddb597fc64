"""Routes for credits (account key), credit holds (gateway) and the ledger (admin)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from metering.kit.errors import InvalidRequest
from metering.kit.money import parse_cents
from metering.kit.pagination import PageParams
from metering.ledger import authorizations, service
from metering.ledger.schemas import AdjustmentCreate, AuthorizationCreate, GrantCreate
from metering.web.deps import (
    AccountKeyDep,
    AdminDep,
    NowDep,
    SessionDep,
    get_clock,
    get_settings,
    require_gateway,
)
from metering.web.jsonio import MeteringRoute


# The gateway's routes are the hot path: their cheap dependencies (no I/O) run inline on the
# event loop. FastAPI runs every plain ``def`` dependency in the thread pool, and on a two-core
# host each such hop costs ~0.1 ms of CPU, about as much as a database round trip.
async def _gateway(request: Request) -> None:
    require_gateway(request)


async def _now(request: Request) -> datetime:
    return get_clock(request).now()


async def _hold_ttl_seconds(request: Request) -> int:
    return get_settings(request).hold_ttl_seconds


GatewayNowDep = Annotated[datetime, Depends(_now)]
HoldTtlDep = Annotated[int, Depends(_hold_ttl_seconds)]

router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["credits"])
gateway_router = APIRouter(
    prefix="/v1", route_class=MeteringRoute, dependencies=[Depends(_gateway)], tags=["gateway"]
)
admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: ledger"]
)


@router.get("/credits")
def get_credits(key: AccountKeyDep, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """Your account's credit: balance, held by requests in flight, and available (exact cents)."""
    return service.credit_balance(session, key.account_id, now)


@gateway_router.post("/authorizations")
def authorize(
    body: AuthorizationCreate, session: SessionDep, now: GatewayNowDep, ttl: HoldTtlDep
) -> dict[str, Any]:
    """Pre-flight check of a request: hold its maximum cost, or refuse it (402, 404, 400)."""
    return authorizations.authorize(session, body, now, ttl)


@gateway_router.delete("/authorizations/{authorization_id}")
def void_authorization(
    authorization_id: str, session: SessionDep, now: GatewayNowDep
) -> dict[str, Any]:
    """Release a hold whose request was rejected before generation (not charged)."""
    return authorizations.void(session, authorization_id, now)


@admin_router.post("/accounts/{account_id}/grants", status_code=201)
def create_grant(
    account_id: str, body: GrantCreate, session: SessionDep, now: NowDep, response: Response
) -> dict[str, Any]:
    """Add prepaid credit (201; 200 with the original grant when the same request is retried)."""
    amount = parse_cents(body.amount_cents, "amount_cents")
    if amount == 0:
        raise InvalidRequest("amount_cents must be greater than 0", param="amount_cents")
    entry, created = service.add_entry(
        session, account_id, "grant", amount, body.idempotency_key, body.note, now
    )
    if not created:
        response.status_code = 200
    return entry


@admin_router.post("/accounts/{account_id}/adjustments", status_code=201)
def create_adjustment(
    account_id: str, body: AdjustmentCreate, session: SessionDep, now: NowDep, response: Response
) -> dict[str, Any]:
    """Correct a balance with a signed amount (201; 200 with the original when retried)."""
    amount = parse_cents(body.amount_cents, "amount_cents", allow_negative=True)
    if amount == 0:
        raise InvalidRequest("amount_cents must not be 0", param="amount_cents")
    entry, created = service.add_entry(
        session, account_id, "adjustment", amount, body.idempotency_key, body.reason, now
    )
    if not created:
        response.status_code = 200
    return entry


@admin_router.get("/accounts/{account_id}/ledger")
def list_ledger(account_id: str, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """An account's ledger entries (grants, charges, adjustments), newest first."""
    limit, after = paging
    return service.list_entries(session, account_id, limit, after)


@admin_router.get("/accounts/{account_id}/credits")
def get_account_credits(account_id: str, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """An account's credit: balance, held and available, as its own keys see it."""
    return service.credit_balance(session, account_id, now)


HoldStatus = Literal["active", "settled", "voided", "expired"]


@admin_router.get("/authorizations")
def list_authorizations(
    session: SessionDep,
    now: NowDep,
    paging: PageParams,
    status: Annotated[HoldStatus | None, Query()] = None,
    account_id: Annotated[str | None, Query(max_length=32)] = None,
) -> dict[str, Any]:
    """Credit holds, newest first; ``status=expired`` lists those that expired without usage."""
    limit, after = paging
    return authorizations.list_holds(session, now, status, account_id, limit, after)
