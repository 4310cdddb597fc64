"""Routes for credits (account key), credit holds (gateway) and the ledger (admin)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session
from starlette.datastructures import State

from metering.accounts.deps import AccountKeyDep
from metering.audit.deps import AuditDep
from metering.audit.service import Auditor
from metering.kit import jsonenc
from metering.kit.errors import InvalidRequest
from metering.kit.money import parse_cents
from metering.kit.pagination import PageParams
from metering.kit.timeutil import parse_timestamp
from metering.ledger import authorizations, credit_grants, service
from metering.ledger import grants as grant_rules
from metering.ledger.schemas import AdjustmentCreate, AuthorizationCreate, GrantCreate, GrantVoid
from metering.states.holds import HoldStatus
from metering.web.deps import AdminDep, GatewayDep, NowDep, SessionDep
from metering.web.fastlane import fast_lane
from metering.web.jsonio import MeteringRoute, json_answer

router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["credits"])
gateway_router = APIRouter(
    prefix="/v1", route_class=MeteringRoute, dependencies=[GatewayDep], tags=["gateway"]
)
admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: ledger"]
)


@router.get("/credits")
def get_credits(key: AccountKeyDep, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """Your account's credit: balance, held by requests in flight, and available (exact cents)."""
    return service.credit_balance(session, key.account_id, now)


# The gateway's two routes are the hot path: each is served by the lean path
# (metering.web.fastlane) when well formed, runs its statements on the event loop (on
# PostgreSQL asynchronously in autocommit, on SQLite in a worker thread: see
# metering.ledger.authorizations), and reads the clock and settings from the app's state.


async def _authorize(state: State, body: AuthorizationCreate, _params: Mapping[str, str]) -> bytes:
    hold = await authorizations.authorize(
        state.database, body, state.clock.now(), state.settings.hold_ttl_seconds
    )
    return jsonenc.dumps(hold)


async def _void(state: State, _body: None, params: Mapping[str, str]) -> bytes:
    hold = await authorizations.void(state.database, params["authorization_id"], state.clock.now())
    return jsonenc.dumps(hold)


@gateway_router.post("/authorizations")
@fast_lane(_authorize)
async def authorize(body: AuthorizationCreate, request: Request) -> Response:
    """Pre-flight check of a request: hold its maximum cost, or refuse it (402, 404, 400)."""
    return json_answer(await _authorize(request.app.state, body, request.path_params))


@gateway_router.delete("/authorizations/{authorization_id}")
@fast_lane(_void)
async def void_authorization(authorization_id: str, request: Request) -> Response:
    """Release a hold whose request was rejected before generation (not charged)."""
    return json_answer(await _void(request.app.state, None, request.path_params))


# A retry with the same idempotency key and body: the original entry, nothing changed.
_REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"description": "The same request was made before: the original entry, unchanged."}
}


@admin_router.post("/accounts/{account_id}/grants", status_code=201, responses=_REPLAYED)
def create_grant(
    account_id: str,
    body: GrantCreate,
    session: SessionDep,
    now: NowDep,
    response: Response,
    audit: AuditDep,
) -> dict[str, Any]:
    """Add prepaid credit: a credit grant (201; 200 with the grant as it now stands when the
    same request is retried)."""
    amount = parse_cents(body.amount_cents, "amount_cents")
    if amount == 0:
        raise InvalidRequest("amount_cents must be greater than 0", param="amount_cents")
    expires_at = None
    if body.expires_at is not None:
        expires_at = parse_timestamp(body.expires_at, "expires_at")  # later than now: checked
        # once it is known not to be a replay (a replay answers even after its expiry)
    priority = body.priority
    if priority is None:
        priority = grant_rules.DEFAULT_PRIORITY[body.category]
    terms = service.GrantTerms(body.category, priority, expires_at)
    grant, created = service.add_entry(
        session, account_id, "grant", amount, body.idempotency_key, body.note, now, terms
    )
    if created:
        changes = {
            "amount_cents": grant["amount_cents"],
            "idempotency_key": body.idempotency_key,
            "note": grant["note"],
            "category": grant["category"],
            "priority": grant["priority"],
            "expires_at": grant["expires_at"],
        }
        audit.record(session, now, "grant.create", "credit_grant", grant["id"], account_id, changes)
    else:
        response.status_code = 200
    return grant


@admin_router.get("/accounts/{account_id}/grants")
def list_grants(
    account_id: str, session: SessionDep, now: NowDep, paging: PageParams
) -> dict[str, Any]:
    """An account's credit grants, newest first."""
    limit, after = paging
    return credit_grants.list_grants(session, account_id, limit, after, now)


@admin_router.get("/grants/{grant_id}")
def get_grant(grant_id: str, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """One credit grant as it now stands."""
    return credit_grants.get_grant(session, grant_id, now)


@admin_router.post("/grants/{grant_id}/void")
def void_grant(
    grant_id: str, body: GrantVoid, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Forfeit a grant's remainder at once; a grant no longer active is returned unchanged."""
    grant, entry = credit_grants.void_grant(session, grant_id, body.reason, now)
    if entry is not None:
        changes = {
            "status": grant["status"],
            "forfeited_microcents": -entry["amount_microcents"],
            "reason": body.reason,
        }
        audit.record(
            session, now, "grant.void", "credit_grant", grant_id, grant["account_id"], changes
        )
    return grant


@admin_router.post("/accounts/{account_id}/adjustments", status_code=201, responses=_REPLAYED)
def create_adjustment(
    account_id: str,
    body: AdjustmentCreate,
    session: SessionDep,
    now: NowDep,
    response: Response,
    audit: AuditDep,
) -> dict[str, Any]:
    """Correct a balance with a signed amount (201; 200 with the original when retried)."""
    amount = parse_cents(body.amount_cents, "amount_cents", allow_negative=True)
    if amount == 0:
        raise InvalidRequest("amount_cents must not be 0", param="amount_cents")
    entry, created = service.add_entry(
        session, account_id, "adjustment", amount, body.idempotency_key, body.reason, now
    )
    if created:
        _record_entry(session, audit, "adjustment.create", entry, now)
    else:
        response.status_code = 200
    return entry


def _record_entry(
    session: Session, audit: Auditor, action: str, entry: dict[str, Any], now: datetime
) -> None:
    """A new adjustment in the audit log (a replay is no change: never recorded)."""
    text = "reason"
    changes = {
        "amount_cents": entry["amount_cents"],
        "idempotency_key": entry["idempotency_key"],
        text: entry[text],
    }
    account_id = entry["account_id"]
    audit.record(session, now, action, "ledger_entry", str(entry["id"]), account_id, changes)


@admin_router.get("/accounts/{account_id}/ledger")
def list_ledger(account_id: str, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """An account's ledger entries (grants, charges, adjustments), newest first."""
    limit, after = paging
    return service.list_entries(session, account_id, limit, after)


@admin_router.get("/accounts/{account_id}/credits")
def get_account_credits(account_id: str, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """An account's credit: balance, held and available, as its own keys see it."""
    return service.credit_balance(session, account_id, now)


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
