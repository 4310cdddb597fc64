"""Admin routes for accounts and their API keys."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import and_, or_, select

from metering.accounts import projects, service
from metering.accounts.deps import AccountKeyDep
from metering.accounts.schemas import (
    AccountCreate,
    AccountUpdate,
    ApiKeyCreate,
    ApiKeyUpdate,
    ModelAccess,
)
from metering.audit.deps import AuditDep
from metering.kit.money import parse_cents
from metering.kit.pagination import PageParams, decode_cursor, page
from metering.kit.timeutil import format_timestamp, parse_timestamp
from metering.models import Account, ApiKey
from metering.web.deps import AdminDep, NowDep, SessionDep
from metering.web.jsonio import MeteringRoute

admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: accounts"]
)
router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["api keys"])


def _keys_page(session: Any, account_id: str, limit: int, after: str | None) -> list[ApiKey]:
    """A page of the account's keys (revoked ones included), oldest first."""
    return projects.page_of(session, ApiKey, account_id, limit, after)


@router.get("/api-keys")
def list_own_api_keys(
    key: AccountKeyDep, session: SessionDep, now: NowDep, paging: PageParams
) -> dict[str, Any]:
    """Your account's API keys (never a secret), each with its spend in its current window."""
    limit, after = paging
    rows = _keys_page(session, key.account_id, limit, after)
    bodies = {body["id"]: body for body in service.own_key_bodies(session, rows, now)}
    return page(
        rows, limit, lambda k: bodies[k.id], lambda k: (format_timestamp(k.created_at), k.id)
    )


@admin_router.post("/accounts", status_code=201)
def create_account(
    body: AccountCreate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Create an account (prepaid: spends credit; unbilled: usage recorded, never charged)."""
    account = service.create_account(session, body.name, body.billing, now)
    changes = {"name": account.name, "billing": account.billing}
    audit.record(session, now, "account.create", "account", account.id, account.id, changes)
    return service.account_body(session, account)


@admin_router.get("/accounts")
def list_accounts(session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """List accounts, oldest first."""
    limit, after = paging
    query = select(Account).order_by(Account.created_at, Account.id).limit(limit + 1)
    if after:
        created, last_id = decode_cursor(after, 2)
        created_at = parse_timestamp(created, "after")
        query = query.where(
            or_(
                Account.created_at > created_at,
                and_(Account.created_at == created_at, Account.id > str(last_id)),
            )
        )
    rows = session.execute(query).scalars().all()
    return page(
        rows,
        limit,
        lambda a: service.account_body(session, a),
        lambda a: (format_timestamp(a.created_at), a.id),
    )


@admin_router.get("/accounts/{account_id}")
def get_account(account_id: str, session: SessionDep) -> dict[str, Any]:
    """One account."""
    return service.account_body(session, service.get_account(session, account_id))


@admin_router.patch("/accounts/{account_id}")
def update_account(
    account_id: str, body: AccountUpdate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Rename an account, change its limit on requests in flight (null removes it) or its
    low-balance threshold (null clears it). A threshold set above the balance fires nothing
    until the balance is at or above it again."""
    account = service.get_account(session, account_id, lock=True)
    before = service.account_body(session, account)
    if "name" in body.model_fields_set:
        account.name = body.name
    if "max_concurrent_requests" in body.model_fields_set:
        account.max_concurrent_requests = body.max_concurrent_requests
    if "low_balance_threshold_cents" in body.model_fields_set:
        raw = body.low_balance_threshold_cents
        account.low_balance_threshold_microcents = (
            None if raw is None else parse_cents(raw, "low_balance_threshold_cents")
        )
    session.flush()
    after = service.account_body(session, account)
    changes = {
        field: after[field]
        for field in ("name", "max_concurrent_requests", "low_balance_threshold_cents")
        if after[field] != before[field]
    }
    if changes:
        audit.record(session, now, "account.update", "account", account.id, account.id, changes)
    return after


@admin_router.put("/accounts/{account_id}/model-access")
def put_model_access(
    account_id: str, body: ModelAccess, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Set the models the account may use: null = every catalog model (hidden ones served but
    not listed), a list = exactly those (hidden ones included). Answers the account."""
    account = service.get_account(session, account_id)
    before = service.account_models(session, account)
    service.set_account_models(session, account, body.models)
    after = service.account_body(session, account)
    if after["model_access"] != before:
        changes = {"model_access": after["model_access"]}
        audit.record(
            session, now, "model_access.update", "account", account.id, account.id, changes
        )
    return after


@admin_router.post("/accounts/{account_id}/api-keys", status_code=201)
def create_api_key(
    account_id: str, body: ApiKeyCreate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Create an API key in a project (default: the account's ``Default``), owned by a member
    or by no one (a service key); its secret is in this response only (only a hash is
    stored)."""
    limit = service.spend_limit_of(body)
    account = service.get_account(session, account_id)
    project_id, member_id = projects.key_owners(
        session, account.id, body.project_id, body.member_id
    )
    key, secret = service.create_api_key(
        session,
        account,
        body.name,
        limit.amount,
        now,
        window=limit.window or "month",
        project_id=project_id,
        member_id=member_id,
    )
    if body.allowed_models is not None:
        service.set_key_models(session, key, body.allowed_models)
    (shown,) = service.api_key_bodies(session, [key])
    changes = {
        "name": key.name,
        **{field: shown[field] for field in _KEY_FIELDS if field != "name"},
        "project_id": key.project_id,
        "member_id": key.member_id,
        "key": secret,  # the audit log redacts it
    }
    audit.record(session, now, "api_key.create", "api_key", key.id, account.id, changes)
    return {**shown, "key": secret}


@admin_router.get("/accounts/{account_id}/api-keys")
def list_api_keys(account_id: str, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """List an account's API keys (revoked ones included), oldest first."""
    limit, after = paging
    service.get_account(session, account_id)
    rows = _keys_page(session, account_id, limit, after)
    bodies = {body["id"]: body for body in service.api_key_bodies(session, rows)}
    return page(
        rows, limit, lambda k: bodies[k.id], lambda k: (format_timestamp(k.created_at), k.id)
    )


# What a key's audit events record of it.
_KEY_FIELDS = ("name", "spend_limit_cents", "spend_limit_window", "allowed_models")


@admin_router.patch("/api-keys/{key_id}")
def update_api_key(
    key_id: str, body: ApiKeyUpdate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Rename a key, change its spend limit or window (null removes the limit), or its model
    list (null: every model of its account)."""
    key = service.get_api_key(session, key_id)
    (before,) = service.api_key_bodies(session, [key])
    limit = service.spend_limit_of(body)
    if "name" in body.model_fields_set:
        key.name = body.name
    service.apply_spend_limit(key, limit)
    if "allowed_models" in body.model_fields_set:
        service.set_key_models(session, key, body.allowed_models)
    session.flush()
    (after,) = service.api_key_bodies(session, [key])
    changes = {field: after[field] for field in _KEY_FIELDS if after[field] != before[field]}
    if changes:
        audit.record(session, now, "api_key.update", "api_key", key.id, key.account_id, changes)
    return after


@admin_router.delete("/api-keys/{key_id}")
def revoke_api_key(
    key_id: str, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Revoke a key: it is refused (401) from now on. Revoking twice is harmless."""
    key = service.get_api_key(session, key_id)
    if key.revoked_at is None:
        key.revoked_at = now
        session.flush()
        changes = {"revoked_at": now}
        audit.record(session, now, "api_key.revoke", "api_key", key.id, key.account_id, changes)
    (shown,) = service.api_key_bodies(session, [key])
    return shown
