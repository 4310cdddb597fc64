"""Pre-flight authorizations (contract §4): the check-and-hold of an LLM request's maximum cost.

An authorization is a resolving read (the client's key, its account, the model, the price in
force, any earlier hold with the same request id; no lock), the estimate in Python (the pure
rules), then the check-and-hold, atomic per account (metering.ledger.placement: one server-side
function call on PostgreSQL, so the account's row lock is held only while it runs and commits).
On PostgreSQL both run in autocommit on the event loop: two round trips, no BEGIN or COMMIT,
no thread-pool hop. Nothing depends on process memory, so any number of API processes may
share one database.

The steps are written once, as a generator that yields each database step and is sent its
result (``_authorize_steps``); PostgreSQL's async statements and SQLite's, in a worker thread
inside one BEGIN IMMEDIATE transaction, each drive it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement
from starlette.concurrency import run_in_threadpool

from metering.db import Database
from metering.kit.errors import (
    AuthenticationFailed,
    Conflict,
    InsufficientCredits,
    InvalidRequest,
    MeteringError,
    NotFound,
)
from metering.kit.ids import new_id
from metering.kit.money import cents
from metering.kit.pagination import decode_cursor, page
from metering.kit.timeutil import format_timestamp, parse_timestamp, start_of_month
from metering.ledger.metrics import AUTHORIZATIONS, VOIDS
from metering.ledger.placement import Confirm, Placement, PostgresHolds, Resolved, SqliteHolds
from metering.ledger.schemas import AuthorizationCreate
from metering.ledger.service import HOLDS, fingerprint, is_active
from metering.pricing import Estimate, EstimateError, EstimateRequest, ModelLimits, estimate_cost
from metering.web.deps import hash_secret

T = TypeVar("T")
# A database step: called with the backend (PostgresHolds or SqliteHolds), it returns the
# step's result (awaitable on PostgreSQL).
Step = Callable[[Any], Any]
Steps = Generator[Step, Any, T]


def _run(steps: Steps[T], backend: SqliteHolds) -> T:
    result = None
    try:
        while True:
            result = steps.send(result)(backend)
    except StopIteration as finished:
        return finished.value


async def _run_async(steps: Steps[T], backend: PostgresHolds) -> T:
    result = None
    try:
        while True:
            result = await steps.send(result)(backend)
    except StopIteration as finished:
        return finished.value


async def authorize(
    database: Database, request: AuthorizationCreate, now: datetime, ttl_seconds: int
) -> dict[str, Any]:
    """Place a hold of the request's maximum cost, or refuse it (401, 404, 400, 402, 409)."""
    steps = _authorize_steps(request, now, ttl_seconds)
    try:
        if database.dialect == "postgresql":
            async with database.async_driver_autocommit() as connection:
                body, result = await _run_async(steps, PostgresHolds(connection))
        else:
            body, result = await run_in_threadpool(_run_sqlite, database, steps)
    except MeteringError as error:
        AUTHORIZATIONS.inc(error.code)
        raise
    AUTHORIZATIONS.inc(result)
    return body


def _run_sqlite(database: Database, steps: Steps[T]) -> T:
    """In one transaction; a refusal keeps what the check wrote (the releases it stopped
    counting), as PostgreSQL's autocommit does."""
    with database.unit_of_work() as session:
        try:
            return _run(steps, SqliteHolds(session.connection()))
        except MeteringError as error:
            refusal = error
    raise refusal


def _authorize_steps(
    request: AuthorizationCreate, now: datetime, ttl_seconds: int
) -> Steps[tuple[dict[str, Any], str]]:
    if not request.api_key:
        raise AuthenticationFailed("no API key given", code="missing_api_key", param="api_key")
    secret_hash, model_key = hash_secret(request.api_key), request.model.lower()
    # PostgreSQL: a resolution this process read before saves the resolving round trip when
    # the check-and-hold confirms it still holds; anything else is decided on a fresh read.
    remembered: Resolved | None = yield lambda holds: holds.remembered(secret_hash, model_key)
    if remembered is not None:
        assert remembered.text is not None
        confirm = Confirm(remembered.text, secret_hash, model_key)
        answer = yield from _hold_steps(request, remembered, now, ttl_seconds, confirm)
        if answer is not None:
            return answer
    resolved: Resolved | None = yield lambda holds: holds.resolve(
        secret_hash, model_key, request.request_id, now
    )
    if resolved is None:
        raise AuthenticationFailed("invalid API key", code="invalid_api_key", param="api_key")
    if resolved.known_request:
        # A retry gets the authorization as it now stands, even if (say) the model has been
        # retired since: idempotency wins over re-validation.
        account_id, request_id = resolved.account_id, request.request_id
        assert request_id is not None
        existing = yield lambda holds: holds.by_request_id(account_id, request_id)
        return _replay(existing, _fingerprint(resolved.api_key_id, request), now), "replayed"
    answer = yield from _hold_steps(request, resolved, now, ttl_seconds, None)
    assert answer is not None
    return answer


def _hold_steps(
    request: AuthorizationCreate,
    resolved: Resolved,
    now: datetime,
    ttl_seconds: int,
    confirm: Confirm | None,
) -> Steps[tuple[dict[str, Any], str] | None]:
    """Estimate, then check and hold. With ``confirm`` (a remembered resolution), None when
    the estimate refuses the request or the resolution no longer holds: the caller then reads
    afresh, so every refusal, and a retry's replay, is decided on what the database holds."""
    print_ = _fingerprint(resolved.api_key_id, request)
    try:
        estimate = _estimate(resolved, request, now)
    except MeteringError:
        if confirm is not None:
            return None
        raise
    assert resolved.model is not None
    values = {
        "id": new_id("auth"),
        "account_id": resolved.account_id,
        "api_key_id": resolved.api_key_id,
        "request_id": request.request_id,
        "request_fingerprint": print_,
        "model_id": resolved.model.id,
        "api": request.api,
        "prompt_tokens": request.prompt_tokens,
        "requested_max_tokens": request.max_tokens,
        "n": request.n,
        "reasoning": request.reasoning,
        "max_tokens": estimate.max_tokens,
        "estimate_microcents": estimate.total_microcents,
        "created_at": now,
        "expires_at": now + timedelta(seconds=ttl_seconds),
    }
    placement: Placement
    if resolved.billing == "prepaid":
        month_start = start_of_month(now)
        limit, month_end = resolved.spend_limit, _next_month(month_start)
        placement = yield lambda holds: holds.place(values, limit, month_start, month_end, confirm)
    else:
        # Unbilled accounts always pass; the hold is still recorded (not counted).
        inserted = yield lambda holds: holds.insert_unbilled(values)
        placement = Placement("granted" if inserted else "exists", 0)
    outcome = placement.outcome
    if outcome == "stale":
        return None
    if outcome == "exists":
        # The same request id was authorized before (a retry; with a remembered resolution,
        # the request id was not looked up first) or meanwhile (a concurrent retry).
        assert request.request_id is not None
        account_id, request_id = resolved.account_id, request.request_id
        existing = yield lambda holds: holds.by_request_id(account_id, request_id)
        assert existing is not None
        return _replay(existing, print_, now), "replayed"
    if outcome == "insufficient_credits":
        raise InsufficientCredits(
            "the credit balance is too low for this request's maximum cost; add credits, or "
            "set a smaller max_tokens",
            code="insufficient_credits",
            credits_available_cents=cents(placement.available),
            credits_required_cents_estimate=cents(estimate.total_microcents),
        )
    if outcome == "member_spend_limit":
        assert resolved.spend_limit is not None
        raise InsufficientCredits(
            "this API key's monthly spend limit would be exceeded by this request's maximum cost",
            code="member_spend_limit",
            monthly_spend_limit_cents=cents(resolved.spend_limit),
            credits_required_cents_estimate=cents(estimate.total_microcents),
        )
    assert outcome == "granted", outcome
    return hold_body({**values, "status": "active"}, now), "granted"


def _fingerprint(api_key_id: str, request: AuthorizationCreate) -> str:
    """The request as billing sees it: the key by id, the model case-folded, defaults applied."""
    return fingerprint(
        {
            "api_key_id": api_key_id,
            "model": request.model.lower(),
            "api": request.api,
            "prompt_tokens": request.prompt_tokens,
            "max_tokens": request.max_tokens,
            "n": request.n,
            "reasoning": request.reasoning,
        }
    )


def _estimate(resolved: Resolved, request: AuthorizationCreate, now: datetime) -> Estimate:
    """The maximum cost at the account's rates in force now (404 for a model that is unknown,
    retired, or without a price; 400 for the estimate's rules)."""
    model = resolved.model
    if model is None:
        raise NotFound(
            f"model {request.model!r} does not exist", code="model_not_found", param="model"
        )
    # catalog.service.is_retired's rule: retired from the start (UTC) of its deprecation date.
    if model.deprecation_date is not None and now.date() >= model.deprecation_date:
        raise NotFound(
            f"model {model.id!r} was retired on {model.deprecation_date.isoformat()}",
            code="model_not_found",
            param="model",
        )
    if resolved.rates is None:
        # A model nobody can be billed for cannot be served: the same answer as an unknown one.
        raise NotFound(
            f"model {model.id!r} has no price in force", code="model_not_found", param="model"
        )
    try:
        return estimate_cost(
            EstimateRequest(
                api=request.api,
                prompt_tokens=request.prompt_tokens,
                max_tokens=request.max_tokens,
                n=request.n,
                reasoning=request.reasoning,
            ),
            ModelLimits(
                context_length=model.context_length,
                max_output_tokens=model.max_output_tokens,
                reasoning_headroom_tokens=model.reasoning_headroom_tokens,
            ),
            resolved.rates,
        )
    except EstimateError as error:
        extra = dict(error.extra)
        if "context_length_limit" in extra:
            extra["model"] = model.id
        raise InvalidRequest(str(error), code=error.code, param=error.param, **extra) from None


def _replay(existing: dict[str, Any], print_: str, now: datetime) -> dict[str, Any]:
    """The authorization already made for this request id as it now stands; 409 when it was
    made for a different request."""
    if existing["request_fingerprint"] != print_:
        raise Conflict(
            f"request_id {existing['request_id']!r} was already authorized for a different request",
            code="idempotency_conflict",
            param="request_id",
        )
    return hold_body(existing, now)


def _next_month(month_start: datetime) -> datetime:
    return (month_start + timedelta(days=32)).replace(day=1)


def hold_status(status: str, expires_at: datetime, now: datetime) -> str:
    """An active hold past its ``expires_at`` reads as expired, swept or not."""
    return "expired" if status == "active" and expires_at <= now else status


def hold_body(row: Any, now: datetime) -> dict[str, Any]:
    estimate = int(row["estimate_microcents"])
    return {
        "id": row["id"],
        "object": "authorization",
        "status": hold_status(row["status"], row["expires_at"], now),
        "request_id": row["request_id"],
        "account_id": row["account_id"],
        "api_key_id": row["api_key_id"],
        "model": row["model_id"],
        "max_tokens": row["max_tokens"],
        "estimate_microcents": estimate,
        "credits_required_cents_estimate": cents(estimate),
        "expires_at": format_timestamp(row["expires_at"]),
    }


def admin_hold_body(row: Any, now: datetime) -> dict[str, Any]:
    """The gateway's view plus what an operator investigating lost usage needs."""
    return {
        **hold_body(row, now),
        "api": row["api"],
        "prompt_tokens": row["prompt_tokens"],
        "n": row["n"],
        "reasoning": row["reasoning"],
        "created_at": format_timestamp(row["created_at"]),
        "closed_at": format_timestamp(row["closed_at"]) if row["closed_at"] else None,
        "usage_event_id": row["usage_event_id"],
    }


# -- void, list, tidy up -------------------------------------------------------------------------


async def void(database: Database, hold_id: str, now: datetime) -> dict[str, Any]:
    """Release a hold whose request was rejected before generation (it will not be charged).

    A hold no longer active (settled, voided, expired) is returned as it stands. The account's
    held counter is not touched here (no wait for the account's lock): its next check-and-hold
    stops counting the hold."""
    if database.dialect == "postgresql":
        async with database.async_driver_autocommit() as connection:
            row, voided = await PostgresHolds(connection).void(hold_id, now)
    else:
        row, voided = await run_in_threadpool(_void_sqlite, database, hold_id, now)
    if row is None:
        raise NotFound(f"no authorization {hold_id}", param="authorization_id")
    VOIDS.inc("voided" if voided else "unchanged")
    return hold_body(row, now)


def _void_sqlite(
    database: Database, hold_id: str, now: datetime
) -> tuple[dict[str, Any] | None, bool]:
    with database.unit_of_work() as session:
        return SqliteHolds(session.connection()).void(hold_id, now)


def status_filter(status: str, now: datetime) -> ColumnElement[bool]:
    """Holds that read as ``status`` now (expired: past ``expires_at`` without usage)."""
    if status == "active":
        return is_active(now)
    if status == "expired":
        return or_(
            HOLDS.c.status == "expired",
            and_(HOLDS.c.status == "active", HOLDS.c.expires_at <= now),
        )
    return HOLDS.c.status == status


def list_holds(
    session: Session,
    now: datetime,
    status: str | None,
    account_id: str | None,
    limit: int,
    after: str | None,
) -> dict[str, Any]:
    """Authorizations, newest first, optionally only those of one status or account."""
    query = select(HOLDS).order_by(HOLDS.c.created_at.desc(), HOLDS.c.id.desc()).limit(limit + 1)
    if status is not None:
        query = query.where(status_filter(status, now))
    if account_id is not None:
        query = query.where(HOLDS.c.account_id == account_id)
    if after:
        created, last_id = decode_cursor(after, 2)
        created_at = parse_timestamp(created, "after")
        query = query.where(
            or_(
                HOLDS.c.created_at < created_at,
                and_(HOLDS.c.created_at == created_at, HOLDS.c.id < str(last_id)),
            )
        )
    rows = [row._mapping for row in session.execute(query)]
    return page(
        rows,
        limit,
        lambda row: admin_hold_body(row, now),
        lambda row: (format_timestamp(row["created_at"]), row["id"]),
    )


def expire_holds(session: Session, now: datetime) -> int:
    """Mark holds past their ``expires_at`` as 'expired'; returns how many. A tidy-up for the
    scheduler: nothing depends on it, since an active hold stops counting at its expiry.

    Holds locked by someone else (a check-and-hold expiring them itself, a settlement) are
    skipped rather than waited for, so the tidy-up never takes part in a deadlock; the account's
    held counter stops counting the rest at its next check-and-hold."""
    overdue = (
        select(HOLDS.c.id)
        .where(HOLDS.c.status == "active", HOLDS.c.expires_at <= now)
        .with_for_update(skip_locked=True)
    )
    result = session.execute(
        update(HOLDS).where(HOLDS.c.id.in_(overdue.scalar_subquery())).values(status="expired")
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
