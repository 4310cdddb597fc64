"""Pre-flight authorizations (docs/api.md#post-v1authorizations): the check-and-hold of an LLM
request's maximum cost.

An authorization is a resolving read (the client's key, its account, the model, the price in
force, any earlier hold with the same request id; no lock), the estimate in Python (the pure
rules), then the check-and-hold, atomic per account (metering.ledger.placement: one server-side
function call on PostgreSQL, so the account's row lock is held only while it runs and commits).
On PostgreSQL both run in autocommit on the event loop: two round trips, no BEGIN or COMMIT,
no thread-pool hop. Nothing depends on process memory, so any number of API processes may
share one database.

The steps are written once, as a generator that yields each database step and is sent its
result (``_authorize_steps``); ``Database.run`` drives it, with PostgreSQL's async statements
or SQLite's, in a worker thread inside one BEGIN IMMEDIATE transaction: the one place its unit
of work commits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from metering import citus
from metering.accounts.access import checked_under_lock, not_allowed, unknown_model
from metering.accounts.keys import hash_secret
from metering.accounts.windows import window_bounds
from metering.catalog.rules import is_retired
from metering.db import Database, Kind, Steps, is_cluster
from metering.kit.errors import (
    AuthenticationFailed,
    Conflict,
    InsufficientCredits,
    InvalidRequest,
    MeteringError,
    NotFound,
    RateLimited,
)
from metering.kit.money import cents
from metering.kit.pagination import newest_first_by_time
from metering.kit.ranges import INT64_MAX
from metering.kit.timeutil import format_timestamp
from metering.ledger.metrics import AUTHORIZATIONS, VOIDS
from metering.ledger.placement.postgres import NOT_CONFIRMING, PostgresHolds, Remembered
from metering.ledger.placement.program import EXPIRE, HOLDS, Outcome, Placement
from metering.ledger.placement.sqlite import SqliteHolds
from metering.ledger.resolution import Resolution
from metering.ledger.schemas import AuthorizationCreate
from metering.ledger.service import fingerprint
from metering.pricing import (
    Estimate,
    EstimateError,
    EstimateRequest,
    estimate_cost,
    field_beyond_range,
)
from metering.states import holds
from metering.states.holds import HoldStatus, past_expiry


async def authorize(
    database: Database, request: AuthorizationCreate, now: datetime, ttl_seconds: int
) -> dict[str, Any]:
    """Place a hold of the request's maximum cost, or refuse it (401, 404, 400, 402, 409)."""
    try:
        body, result = await database.run(
            _authorize_steps(request, now, ttl_seconds),
            postgresql=_postgres_holds(database),
            sqlite=SqliteHolds,
        )
    except MeteringError as error:
        AUTHORIZATIONS.inc(error.code)
        raise
    AUTHORIZATIONS.inc(result)
    return body


def _postgres_holds(database: Database) -> Callable[[Any], PostgresHolds]:
    """The hold statements on a connection of ``database`` (PostgreSQL, or a Citus cluster)."""
    return partial(PostgresHolds, cluster=database.kind is Kind.CITUS)


def _authorize_steps(
    request: AuthorizationCreate, now: datetime, ttl_seconds: int
) -> Steps[tuple[dict[str, Any], str]]:
    if not request.api_key:
        raise AuthenticationFailed("no API key given", code="missing_api_key", param="api_key")
    secret_hash, model_key = hash_secret(request.api_key), request.model.lower()
    # PostgreSQL: a resolution this process read before saves the resolving round trip when
    # the check-and-hold confirms it still holds; anything else is decided on a fresh read.
    remembered: Remembered | None = yield lambda holds: holds.remembered(secret_hash, model_key)
    if remembered is not None:
        confirm = remembered.confirmation(secret_hash, model_key)
        answer = yield from _hold_steps(request, remembered.resolution, now, ttl_seconds, confirm)
        if answer is not None:
            return answer
    resolved: tuple[Resolution, bool] | None = yield lambda holds: holds.resolve(
        secret_hash, model_key, request.request_id, now
    )
    if resolved is None:
        raise AuthenticationFailed("invalid API key", code="invalid_api_key", param="api_key")
    found, known_request = resolved
    if known_request:
        # A retry gets the authorization as it now stands, even if (say) the model has been
        # retired since: idempotency wins over re-validation.
        account_id, request_id = found.account_id, request.request_id
        assert request_id is not None
        existing = yield lambda holds: holds.by_request_id(account_id, request_id)
        return _replay(existing, _fingerprint(found.api_key_id, request), now), "replayed"
    answer = yield from _hold_steps(request, found, now, ttl_seconds, None)
    assert answer is not None
    return answer


def _hold_steps(
    request: AuthorizationCreate,
    found: Resolution,
    now: datetime,
    ttl_seconds: int,
    confirm: Mapping[str, Any] | None,
) -> Steps[tuple[dict[str, Any], str] | None]:
    """Estimate, then check and hold. With ``confirm`` (a remembered resolution), None when
    the estimate refuses the request or the resolution no longer holds: the caller then reads
    afresh, so every refusal, and a retry's replay, is decided on what the database holds."""
    request_fingerprint = _fingerprint(found.api_key_id, request)
    try:
        estimate = _estimate(found, request, now)
    except MeteringError:
        if confirm is not None:
            return None
        raise
    assert found.model_id is not None
    values = {
        "id": holds.new_hold_id(found.account_id),
        "account_id": found.account_id,
        "api_key_id": found.api_key_id,
        "request_id": request.request_id,
        "request_fingerprint": request_fingerprint,
        "model_id": found.model_id,
        "api": request.api,
        "prompt_tokens": request.prompt_tokens,
        "requested_max_tokens": request.max_tokens,
        "n": request.n,
        "reasoning": request.reasoning,
        "max_tokens": estimate.max_tokens,
        "estimate_microcents": estimate.total_microcents,
        "created_at": now,
        "expires_at": now + timedelta(seconds=request.hold_ttl_seconds or ttl_seconds),
    }
    placement: Placement
    if checked_under_lock(found.billing, found.max_concurrent_requests):
        hold = {**values, **_spend_limits(found, now), **(confirm or NOT_CONFIRMING)}
        placement = yield lambda holds: holds.place(hold)
    else:
        # Unbilled accounts without a concurrency limit always pass; the hold is still
        # recorded (not counted). Not inserted: its request id is taken, or the held sum
        # would leave the range.
        inserted = yield lambda holds: holds.insert_unbilled(values)
        if inserted:
            placement = Placement(Outcome.GRANTED, 0)
        elif request.request_id is None:
            placement = Placement(Outcome.OUT_OF_RANGE, 0)
        else:
            placement = Placement(Outcome.EXISTS, 0)
    outcome = placement.outcome
    if outcome is Outcome.STALE:
        return None
    if outcome is Outcome.EXISTS:
        # The same request id was authorized before (a retry; with a remembered resolution,
        # the request id was not looked up first) or meanwhile (a concurrent retry).
        assert request.request_id is not None
        account_id, request_id = found.account_id, request.request_id
        existing = yield lambda holds: holds.by_request_id(account_id, request_id)
        if existing is not None:
            return _replay(existing, request_fingerprint, now), "replayed"
        assert found.billing != "prepaid"
        outcome = Outcome.OUT_OF_RANGE
    if outcome is Outcome.OUT_OF_RANGE:
        account_id = found.account_id
        held: int = yield lambda holds: holds.held_in_force(account_id, now)
        param = field_beyond_range(_estimate_request(request), estimate, INT64_MAX - held)
        raise InvalidRequest(
            f"this request's maximum cost would take the account's held credit beyond "
            f"{INT64_MAX} microcents; set a smaller {param}",
            code="invalid_parameter",
            param=param,
        )
    if outcome is Outcome.CONCURRENCY_LIMIT:
        raise RateLimited(
            "the account has as many requests in flight as its max_concurrent_requests allows; "
            "retry when one of them ends",
            code="concurrency_limit_exceeded",
        )
    if outcome is Outcome.INSUFFICIENT_CREDITS:
        raise InsufficientCredits(
            "the credit balance is too low for this request's maximum cost; add credits, or "
            "set a smaller max_tokens",
            code="insufficient_credits",
            credits_available_cents=cents(placement.available),
            credits_required_cents_estimate=cents(estimate.total_microcents),
        )
    if outcome in _LIMIT_SCOPES:
        raise _over_spend_limit(found, outcome, placement, estimate.total_microcents)
    assert outcome is Outcome.GRANTED, outcome
    return hold_body({**values, "status": HoldStatus.ACTIVE.value}, now), "granted"


# The spend limits' outcomes, and the scope each names (``limit_scope``).
_LIMIT_SCOPES = {
    Outcome.PROJECT_SPEND_LIMIT: "project",
    Outcome.MEMBER_SPEND_LIMIT: "member",
    Outcome.KEY_SPEND_LIMIT: "key",
}


def _limits(found: Resolution) -> dict[str, tuple[int | None, str | None]]:
    """Each scope's spend limit and window, by ``limit_scope``."""
    return {
        "project": (found.project_spend_limit_microcents, found.project_spend_limit_window),
        "member": (found.member_spend_limit_microcents, found.member_spend_limit_window),
        "key": (found.spend_limit_microcents, found.spend_limit_window),
    }


def _spend_limits(found: Resolution, now: datetime) -> dict[str, Any]:
    """What the check-and-hold is given of the three spend limits: each limit and the bounds of
    its current window (read only for a limit that is set)."""
    given: dict[str, Any] = {"project_id": found.project_id, "member_id": found.member_id}
    prefixes = {"project": "project_", "member": "member_", "key": ""}
    for scope, (limit, window) in _limits(found).items():
        start, end = (None, None) if limit is None or window is None else window_bounds(window, now)
        prefix = prefixes[scope]
        given[f"{prefix}limit" if prefix else "spend_limit"] = limit
        given[f"{prefix}window_start"] = start
        given[f"{prefix}window_end"] = end
    return given


def _over_spend_limit(
    found: Resolution, outcome: Outcome, placement: Placement, estimate: int
) -> InsufficientCredits:
    """The 402 of a spend limit: ``project_spend_limit`` for a project's, ``member_spend_limit``
    for a member's or a key's, each naming its ``limit_scope``."""
    scope = _LIMIT_SCOPES[outcome]
    limit, window = _limits(found)[scope]
    assert limit is not None and window is not None and placement.spent is not None
    whose = {"project": "this key's project", "member": "this key's member", "key": "this API key"}
    # A key's limit also under its first name, as the key's object shows it: for a month only.
    monthly = cents(limit) if window == "month" else None
    extra = {"monthly_spend_limit_cents": monthly} if scope == "key" else {}
    return InsufficientCredits(
        f"{whose[scope]}'s spend limit for the {window} would be exceeded by this request's "
        "maximum cost",
        code="project_spend_limit" if scope == "project" else "member_spend_limit",
        spend_limit_cents=cents(limit),
        spend_limit_window=window,
        spent_cents=cents(placement.spent),
        limit_scope=scope,
        **extra,
        credits_required_cents_estimate=cents(estimate),
    )


def _fingerprint(api_key_id: str, request: AuthorizationCreate) -> str:
    """The request as billing sees it: the key by id, the model case-folded, defaults applied;
    ``hold_ttl_seconds`` as given (omitted ≠ any value), and only when given, so that holds
    placed before it existed keep their fingerprints."""
    values: dict[str, Any] = {
        "api_key_id": api_key_id,
        "model": request.model.lower(),
        "api": request.api,
        "prompt_tokens": request.prompt_tokens,
        "max_tokens": request.max_tokens,
        "n": request.n,
        "reasoning": request.reasoning,
    }
    if request.hold_ttl_seconds is not None:
        values["hold_ttl_seconds"] = request.hold_ttl_seconds
    return fingerprint(values)


def _estimate(found: Resolution, request: AuthorizationCreate, now: datetime) -> Estimate:
    """The maximum cost at the account's rates in force now (404 for a model that is unknown,
    not among the account's, retired, or without a price; 403 for one the key may not use; 400
    for the estimate's rules)."""
    if found.model_id is None or not found.account_sees:
        raise unknown_model(request.model)
    if is_retired(found.deprecation_date, now):
        assert found.deprecation_date is not None
        raise NotFound(
            f"model {found.model_id!r} was retired on {found.deprecation_date.isoformat()}",
            code="model_not_found",
            param="model",
        )
    rates = found.rates
    if rates is None:
        # A model nobody can be billed for cannot be served: the same answer as an unknown one.
        raise NotFound(
            f"model {found.model_id!r} has no price in force",
            code="model_not_found",
            param="model",
        )
    if not (found.key_allows and found.project_allows):
        raise not_allowed(found.model_id)
    try:
        return estimate_cost(_estimate_request(request), found.limits, rates)
    except EstimateError as error:
        extra = dict(error.extra)
        if "context_length_limit" in extra:
            extra["model"] = found.model_id
        raise InvalidRequest(str(error), code=error.code, param=error.param, **extra) from None


def _estimate_request(request: AuthorizationCreate) -> EstimateRequest:
    return EstimateRequest(
        api=request.api,
        prompt_tokens=request.prompt_tokens,
        max_tokens=request.max_tokens,
        n=request.n,
        reasoning=request.reasoning,
    )


def _replay(existing: dict[str, Any], request_fingerprint: str, now: datetime) -> dict[str, Any]:
    """The authorization already made for this request id as it now stands; 409 when it was
    made for a different request."""
    if existing["request_fingerprint"] != request_fingerprint:
        raise Conflict(
            f"request_id {existing['request_id']!r} was already authorized for a different request",
            code="idempotency_conflict",
            param="request_id",
        )
    return hold_body(existing, now)


def hold_body(row: Any, now: datetime) -> dict[str, Any]:
    estimate = int(row["estimate_microcents"])
    return {
        "id": row["id"],
        "object": "authorization",
        "status": holds.reads_as(row["status"], row["expires_at"], now).value,
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
    row, voided = await database.run(
        _void_steps(hold_id, now), postgresql=_postgres_holds(database), sqlite=SqliteHolds
    )
    if row is None:
        raise NotFound(f"no authorization {hold_id}", param="authorization_id")
    VOIDS.inc("voided" if voided else "unchanged")
    return hold_body(row, now)


def _void_steps(hold_id: str, now: datetime) -> Steps[tuple[dict[str, Any] | None, bool]]:
    outcome: tuple[dict[str, Any] | None, bool] = yield lambda holds: holds.void(hold_id, now)
    return outcome


def list_holds(
    session: Session,
    now: datetime,
    status: str | None,
    account_id: str | None,
    limit: int,
    after: str | None,
) -> dict[str, Any]:
    """Authorizations, newest first, optionally only those of one status or account."""
    query = select(HOLDS)
    if status is not None:
        query = query.where(holds.reads_as_sql(HoldStatus(status), HOLDS, now))
    if account_id is not None:
        query = query.where(HOLDS.c.account_id == account_id)
    return newest_first_by_time(
        session,
        query,
        HOLDS.c.created_at,
        HOLDS.c.id,
        limit,
        after,
        lambda row: admin_hold_body(row, now),
    )


def expire_holds(session: Session, now: datetime, account_id: str | None = None) -> int:
    """Mark holds past their ``expires_at`` as 'expired'; returns how many. A tidy-up for the
    scheduler: nothing depends on it, since an active hold stops counting at its expiry (the
    account's held counter stops counting it at its next check-and-hold). ``account_id`` (a
    Citus cluster, ``tidy_up_accounts``): that account's holds only; without it on a cluster,
    each account's in turn, in the session's transaction."""
    if account_id is None:
        if is_cluster(session):  # every account's, each statement on its shard
            overdue = citus.accounts_with(session, HOLDS, past_expiry(HOLDS, now))
            return sum(expire_holds(session, now, account) for account in overdue)
        result = session.execute(EXPIRE, {"now": now})
    else:
        result = citus.execute_of_account(session, EXPIRE, account_id, {"now": now})
    return int(result.rowcount)  # type: ignore[attr-defined]


def tidy_up_accounts(session: Session, now: datetime) -> list[str]:
    """On a Citus cluster, the accounts the tidy-up has work for (``citus.accounts_with``):
    holds past their expiry, or expired and not yet announced."""
    return citus.accounts_with(session, HOLDS, or_(past_expiry(HOLDS, now), holds.unnoticed(HOLDS)))


def notice_expired_unused(
    session: Session, now: datetime, limit: int = 1000, account_id: str | None = None
) -> int:
    """``authorization.expired_unused``: one event per hold that expired with no usage
    (marked by the tidy-up or by a check-and-hold of its account), in the tidy-up's
    transaction; returns how many. Holds locked by a settlement meanwhile are skipped: they are
    getting their usage, or are seen by the next tick. ``account_id`` (a Citus cluster): that
    account's holds only."""
    from metering.notifications import outbox

    if account_id is None and is_cluster(session):
        accounts = citus.accounts_with(session, HOLDS, holds.unnoticed(HOLDS))
        return sum(notice_expired_unused(session, now, limit, account) for account in accounts)
    query = (
        select(HOLDS.c.id, HOLDS.c.account_id, HOLDS.c.api_key_id, HOLDS.c.estimate_microcents)
        .where(holds.unnoticed(HOLDS))
        .order_by(HOLDS.c.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    rows: Sequence[Any]
    if account_id is None:
        rows = session.execute(query).all()
    else:
        rows = citus.execute_of_account(session, query, account_id).all()
    for row in rows:
        data = {
            "authorization_id": row.id,
            "api_key_id": row.api_key_id,
            "estimate_microcents": row.estimate_microcents,
        }
        outbox.emit(session, outbox.EXPIRED_UNUSED, row.account_id, data, now)
    if rows:
        noticed = (
            update(HOLDS).where(HOLDS.c.id.in_([r.id for r in rows])).values(unused_noticed=True)
        )
        if account_id is None:
            session.execute(noticed)
        else:
            citus.execute_of_account(session, noticed, account_id)
    return len(rows)
