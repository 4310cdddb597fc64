"""Pre-flight authorizations (contract §4): the check-and-hold of an LLM request's maximum cost.

The check and the hold are atomic per account. The first statement resolves the client's key
and locks its account's row (FOR NO KEY UPDATE on PostgreSQL, which returns the row as last
committed; SQLite's BEGIN IMMEDIATE serialises writers instead); the holds, charges and request
ids the decision reads come from a later statement, which sees everything committed before the
lock was granted. Nothing depends on process memory, so any number of API processes may share
one database. A granted request costs five round trips: BEGIN, resolve-and-lock, the decision's
state, the insert, COMMIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Select, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from metering.catalog.service import is_retired, limits_of
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
from metering.ledger.schemas import AuthorizationCreate
from metering.ledger.service import HOLDS, fingerprint, held_by_account, is_active
from metering.models import (
    Account,
    AccountRate,
    ApiKey,
    CatalogModel,
    PriceVersion,
    UsageRollup,
    table,
)
from metering.pricing import Estimate, EstimateError, EstimateRequest, Rates, estimate_cost
from metering.web.deps import KeyPrincipal, hash_secret

_KEYS = table(ApiKey)
_ACCOUNTS = table(Account)
_MODELS = table(CatalogModel)
_LIST_PRICES = table(PriceVersion)
_ACCOUNT_RATES = table(AccountRate)
_ROLLUPS = table(UsageRollup)
_NOW = bindparam("now", type_=HOLDS.c.expires_at.type)
_ACCOUNT_ID: BindParameter[str] = bindparam("account_id")
_KEY_ID: BindParameter[str] = bindparam("api_key_id")
_RATES = (
    "input_microcents_per_million",
    "output_microcents_per_million",
    "cache_read_microcents_per_million",
)


def _latest_rate(source: Any, column: str, *match: ColumnElement[bool]) -> Any:
    """A rate of the newest version of ``source`` in force at :now (a scalar subquery)."""
    return (
        select(source.c[column])
        .where(*match, source.c.effective_at <= _NOW)
        .order_by(source.c.effective_at.desc())
        .limit(1)
        .scalar_subquery()
    )


# The hot path's first statement: the client's key, its account (row-locked: FOR NO KEY UPDATE
# OF accounts, so rows referencing the account can still be inserted meanwhile), the model and
# the price in force now, in one round trip. The price is catalog.service.price_in_force's rule
# (the account's override in force, unless that version ends the override, else the list price);
# tests/ledger/test_resolution.py holds the two to the same answers.
_RESOLVE = (
    select(
        _KEYS.c.id.label("api_key_id"),
        _KEYS.c.account_id,
        _KEYS.c.monthly_spend_limit_microcents,
        _ACCOUNTS.c.billing,
        _ACCOUNTS.c.balance_microcents,
        _MODELS.c.id.label("model_id"),
        _MODELS.c.context_length,
        _MODELS.c.max_output_tokens,
        _MODELS.c.reasoning_headroom_tokens,
        _MODELS.c.deprecation_date,
        *(
            _latest_rate(
                _ACCOUNT_RATES,
                rate,
                _ACCOUNT_RATES.c.account_id == _ACCOUNTS.c.id,
                _ACCOUNT_RATES.c.model_id == _MODELS.c.id,
            ).label(f"override_{rate}")
            for rate in _RATES
        ),
        *(
            _latest_rate(_LIST_PRICES, rate, _LIST_PRICES.c.model_id == _MODELS.c.id).label(
                f"list_{rate}"
            )
            for rate in _RATES
        ),
    )
    .select_from(
        _KEYS.join(_ACCOUNTS, _ACCOUNTS.c.id == _KEYS.c.account_id).outerjoin(
            _MODELS, _MODELS.c.id_key == bindparam("model_key")
        )
    )
    .where(_KEYS.c.secret_hash == bindparam("secret_hash"), _KEYS.c.revoked_at.is_(None))
    .with_for_update(of=_ACCOUNTS, key_share=True)
)


@cache
def _decision_state(prepaid: bool, limited: bool, idempotent: bool) -> Select[Any]:
    """What the decision reads once the account is locked (so each later statement sees every
    hold committed before the lock was granted), in one statement with only the parts needed:
    the account's holds in force, the key's holds and its charges this calendar month (UTC, from
    the daily per-key rollups the ingest transaction maintains), a hold with this request id."""
    columns: list[Any] = []
    if prepaid:
        columns.append(held_by_account(_ACCOUNT_ID, _NOW).label("held"))
    if prepaid and limited:
        columns.append(
            select(func.coalesce(func.sum(HOLDS.c.estimate_microcents), 0))
            .where(
                HOLDS.c.account_id == _ACCOUNT_ID, HOLDS.c.api_key_id == _KEY_ID, is_active(_NOW)
            )
            .scalar_subquery()
            .label("key_held")
        )
        start = bindparam("month_start", type_=_ROLLUPS.c.bucket_start.type)
        end = bindparam("month_end", type_=_ROLLUPS.c.bucket_start.type)
        columns.append(
            select(func.coalesce(func.sum(_ROLLUPS.c.cost_microcents), 0))
            .where(
                _ROLLUPS.c.account_id == _ACCOUNT_ID,
                _ROLLUPS.c.bucket_width == "1d",
                _ROLLUPS.c.grouping == "key",
                _ROLLUPS.c.bucket_start >= start,
                _ROLLUPS.c.bucket_start < end,
                _ROLLUPS.c.api_key_id == _KEY_ID,
            )
            .scalar_subquery()
            .label("month_spent")
        )
    if idempotent:
        columns.append(
            select(HOLDS.c.id)
            .where(HOLDS.c.account_id == _ACCOUNT_ID, HOLDS.c.request_id == bindparam("request_id"))
            .scalar_subquery()
            .label("existing_id")
        )
    return select(*columns)


_BY_REQUEST_ID = select(HOLDS).where(
    HOLDS.c.account_id == _ACCOUNT_ID, HOLDS.c.request_id == bindparam("request_id")
)
_INSERT = insert(HOLDS)


@dataclass(frozen=True, slots=True)
class _Resolved:
    """The key, its account (locked) and the model with its price in force."""

    key: KeyPrincipal
    spend_limit: int | None
    balance: int
    row: Any  # the model and rate columns of _RESOLVE


def authorize(
    session: Session, request: AuthorizationCreate, now: datetime, ttl_seconds: int
) -> dict[str, Any]:
    """Place a hold of the request's maximum cost, or refuse it (401, 404, 400, 402, 409)."""
    try:
        body, result = _authorize(session, request, now, ttl_seconds)
    except MeteringError as error:
        AUTHORIZATIONS.inc(error.code)
        raise
    AUTHORIZATIONS.inc(result)
    return body


def _authorize(
    session: Session, request: AuthorizationCreate, now: datetime, ttl_seconds: int
) -> tuple[dict[str, Any], str]:
    resolved = _resolve(session, request, now)
    key = resolved.key
    print_ = _fingerprint(key, request)
    try:
        estimate, model_id = _estimate(resolved.row, request, now)
    except MeteringError:
        # A retry of a request authorized before (say) the model's retirement still gets the
        # original authorization: idempotency wins over re-validation.
        replayed = _replay(session, key.account_id, request.request_id, print_, now)
        if replayed is None:
            raise
        return replayed, "replayed"

    prepaid = key.billing == "prepaid"
    limited = resolved.spend_limit is not None
    idempotent = request.request_id is not None
    if prepaid or idempotent:
        month_start = start_of_month(now)
        state = (
            session.connection()
            .execute(
                _decision_state(prepaid, limited, idempotent),
                {
                    "account_id": key.account_id,
                    "api_key_id": key.api_key_id,
                    "now": now,
                    "month_start": month_start,
                    "month_end": _next_month(month_start),
                    "request_id": request.request_id,
                },
            )
            .one()
        )
        if idempotent and state.existing_id is not None:
            replayed = _replay(session, key.account_id, request.request_id, print_, now)
            assert replayed is not None
            return replayed, "replayed"
        if prepaid:
            _check_credit(
                estimate,
                available=resolved.balance - int(state.held),
                spend_limit=resolved.spend_limit,
                key_committed=int(state.month_spent) + int(state.key_held) if limited else 0,
            )

    values = {
        "id": new_id("auth"),
        "account_id": key.account_id,
        "api_key_id": key.api_key_id,
        "request_id": request.request_id,
        "request_fingerprint": print_,
        "model_id": model_id,
        "api": request.api,
        "prompt_tokens": request.prompt_tokens,
        "requested_max_tokens": request.max_tokens,
        "n": request.n,
        "reasoning": request.reasoning,
        "max_tokens": estimate.max_tokens,
        "estimate_microcents": estimate.total_microcents,
        "status": "active",
        "created_at": now,
        "expires_at": now + timedelta(seconds=ttl_seconds),
        "closed_at": None,
        "usage_event_id": None,
    }
    session.connection().execute(_INSERT, values)
    return hold_body(values, now), "granted"


def _resolve(session: Session, request: AuthorizationCreate, now: datetime) -> _Resolved:
    """401 for a missing, unknown or revoked client key (``param`` "api_key", never a hint of
    which); otherwise the key with its account locked, and the model's columns (null when the
    model does not exist)."""
    if not request.api_key:
        raise AuthenticationFailed("no API key given", code="missing_api_key", param="api_key")
    row = (
        session.connection()
        .execute(
            _RESOLVE,
            {
                "secret_hash": hash_secret(request.api_key),
                "model_key": request.model.lower(),
                "now": now,
            },
        )
        .first()
    )
    if row is None:
        raise AuthenticationFailed("invalid API key", code="invalid_api_key", param="api_key")
    key = KeyPrincipal(api_key_id=row.api_key_id, account_id=row.account_id, billing=row.billing)
    return _Resolved(key, row.monthly_spend_limit_microcents, row.balance_microcents, row)


def _fingerprint(key: KeyPrincipal, request: AuthorizationCreate) -> str:
    """The request as billing sees it: the key by id, the model case-folded, defaults applied."""
    return fingerprint(
        {
            "api_key_id": key.api_key_id,
            "model": request.model.lower(),
            "api": request.api,
            "prompt_tokens": request.prompt_tokens,
            "max_tokens": request.max_tokens,
            "n": request.n,
            "reasoning": request.reasoning,
        }
    )


def _estimate(row: Any, request: AuthorizationCreate, now: datetime) -> tuple[Estimate, str]:
    """The maximum cost at the account's rates in force now, and the model's catalog id."""
    if row.model_id is None:
        raise NotFound(
            f"model {request.model!r} does not exist", code="model_not_found", param="model"
        )
    model = CatalogModel(
        id=row.model_id,
        context_length=row.context_length,
        max_output_tokens=row.max_output_tokens,
        reasoning_headroom_tokens=row.reasoning_headroom_tokens,
        deprecation_date=row.deprecation_date,
    )
    if is_retired(model, now):
        assert model.deprecation_date is not None
        raise NotFound(
            f"model {model.id!r} was retired on {model.deprecation_date.isoformat()}",
            code="model_not_found",
            param="model",
        )
    rates = _rates_in_force(row)
    if rates is None:
        # A model nobody can be billed for cannot be served: the same answer as an unknown one.
        raise NotFound(
            f"model {model.id!r} has no price in force", code="model_not_found", param="model"
        )
    try:
        estimate = estimate_cost(
            EstimateRequest(
                api=request.api,
                prompt_tokens=request.prompt_tokens,
                max_tokens=request.max_tokens,
                n=request.n,
                reasoning=request.reasoning,
            ),
            limits_of(model),
            rates,
        )
    except EstimateError as error:
        extra = dict(error.extra)
        if "context_length_limit" in extra:
            extra["model"] = model.id
        raise InvalidRequest(str(error), code=error.code, param=error.param, **extra) from None
    return estimate, model.id


def _rates_in_force(row: Any) -> Rates | None:
    """The override's rates unless there is none in force or it ends the override (all null),
    else the list price's; None when neither is in force."""
    for source in ("override", "list"):
        values = [getattr(row, f"{source}_{rate}") for rate in _RATES]
        if values[0] is not None:
            return Rates(*values)
    return None


def _check_credit(
    estimate: Estimate, *, available: int, spend_limit: int | None, key_committed: int
) -> None:
    required = estimate.total_microcents
    if required > available:
        raise InsufficientCredits(
            "the credit balance is too low for this request's maximum cost; add credits, or "
            "set a smaller max_tokens",
            code="insufficient_credits",
            credits_available_cents=cents(available),
            credits_required_cents_estimate=cents(required),
        )
    if spend_limit is not None and key_committed + required > spend_limit:
        raise InsufficientCredits(
            "this API key's monthly spend limit would be exceeded by this request's maximum cost",
            code="member_spend_limit",
            monthly_spend_limit_cents=cents(spend_limit),
            credits_required_cents_estimate=cents(required),
        )


def _replay(
    session: Session, account_id: str, request_id: str | None, print_: str, now: datetime
) -> dict[str, Any] | None:
    """The authorization already made for ``request_id`` as it now stands, None if there is
    none; 409 when it was made for a different request."""
    if request_id is None:
        return None
    row = session.execute(
        _BY_REQUEST_ID, {"account_id": account_id, "request_id": request_id}
    ).first()
    if row is None:
        return None
    if row.request_fingerprint != print_:
        raise Conflict(
            f"request_id {request_id!r} was already authorized for a different request",
            code="idempotency_conflict",
            param="request_id",
        )
    return hold_body(row._mapping, now)


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

# What the gateway's view of a hold needs, and no more (the hot path pays per column).
_BODY_COLUMNS = [
    HOLDS.c[name]
    for name in (
        "id",
        "status",
        "request_id",
        "account_id",
        "api_key_id",
        "model_id",
        "max_tokens",
        "estimate_microcents",
        "expires_at",
    )
]
_VOID = (
    update(HOLDS)
    .where(HOLDS.c.id == bindparam("hold_id"), is_active(_NOW))
    .values(status="voided", closed_at=_NOW)
    .returning(*_BODY_COLUMNS)
)
_BY_ID = select(*_BODY_COLUMNS).where(HOLDS.c.id == bindparam("hold_id"))


def void(session: Session, hold_id: str, now: datetime) -> dict[str, Any]:
    """Release a hold whose request was rejected before generation (it will not be charged).

    A hold no longer active (settled, voided, expired) is returned as it stands."""
    row = session.connection().execute(_VOID, {"hold_id": hold_id, "now": now}).first()
    if row is not None:
        VOIDS.inc("voided")
        return hold_body(row._mapping, now)
    row = session.connection().execute(_BY_ID, {"hold_id": hold_id}).first()
    if row is None:
        raise NotFound(f"no authorization {hold_id}", param="authorization_id")
    VOIDS.inc("unchanged")
    return hold_body(row._mapping, now)


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
    scheduler: nothing depends on it, since an active hold stops counting at its expiry."""
    result = session.execute(
        update(HOLDS)
        .where(HOLDS.c.status == "active", HOLDS.c.expires_at <= now)
        .values(status="expired")
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
