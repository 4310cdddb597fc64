"""Creating accounts and keys; a key's secret exists only in the response that creates it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from metering.accounts.keys import hash_secret
from metering.accounts.spend import key_charges
from metering.accounts.windows import window_bounds
from metering.kit.errors import InvalidRequest, NotFound
from metering.kit.ids import new_id
from metering.kit.money import cents, parse_cents
from metering.kit.timeutil import format_timestamp
from metering.models import (
    Account,
    AccountModel,
    ApiKey,
    ApiKeyModel,
    CatalogModel,
    Project,
    table,
)

KEY_SECRET_PREFIX = "mk_"
DEFAULT_PROJECT = "Default"
DISPLAY_PREFIX_LENGTH = 10


def new_key_secret() -> str:
    """``mk_`` and 256 random bits: recognisable in a leaked-secret scan, unguessable."""
    return KEY_SECRET_PREFIX + secrets.token_urlsafe(32)


def get_account(session: Session, account_id: str, *, lock: bool = False) -> Account:
    query = select(Account).where(Account.id == account_id)
    if lock:
        query = query.with_for_update()
    account = session.execute(query).scalar_one_or_none()
    if account is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    return account


def get_api_key(session: Session, key_id: str) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"no API key {key_id}", param="key_id")
    return key


def create_account(session: Session, name: str, billing: str, now: datetime) -> Account:
    account = Account(id=new_id("acct"), name=name, billing=billing, created_at=now)
    account.balance_microcents = 0
    account.restricts_models = False
    session.add(account)
    session.flush()
    session.add(
        Project(
            id=default_project_id(account.id),
            account_id=account.id,
            name=DEFAULT_PROJECT,
            spend_limit_window="month",
            restricts_models=False,
            created_at=now,
        )
    )
    session.flush()
    return account


def default_project_id(account_id: str) -> str:
    """The id of the account's ``Default`` project, made with it: the account's own id with
    ``proj_`` for ``acct_`` (so the migration that introduced projects could put every older
    key there by one statement of the keys' table)."""
    return "proj_" + account_id.removeprefix("acct_")


def create_api_key(
    session: Session,
    account: Account,
    name: str,
    limit_microcents: int | None,
    now: datetime,
    *,
    window: str = "month",
    project_id: str | None = None,
    member_id: str | None = None,
) -> tuple[ApiKey, str]:
    """A key of the account, in ``project_id`` (default: the account's ``Default``) and owned by
    ``member_id`` (none: a service key), both already checked (metering.accounts.projects)."""
    secret = new_key_secret()
    key = ApiKey(
        id=new_id("key"),
        account_id=account.id,
        name=name,
        prefix=secret[:DISPLAY_PREFIX_LENGTH],
        secret_hash=hash_secret(secret),
        monthly_spend_limit_microcents=limit_microcents,
        spend_limit_window=window,
        restricts_models=False,
        created_at=now,
        project_id=project_id or default_project_id(account.id),
        member_id=member_id,
    )
    session.add(key)
    session.flush()
    return key, secret


def account_body(session: Session, account: Account) -> dict[str, Any]:
    threshold = account.low_balance_threshold_microcents
    return {
        "id": account.id,
        "object": "account",
        "name": account.name,
        "billing": account.billing,
        "created_at": format_timestamp(account.created_at),
        "max_concurrent_requests": account.max_concurrent_requests,
        "model_access": account_models(session, account),
        "low_balance_threshold_cents": None if threshold is None else cents(threshold),
        "low_balance_threshold_microcents": threshold,
    }


def api_key_body(key: ApiKey, allowed_models: list[str] | None) -> dict[str, Any]:
    limit = key.monthly_spend_limit_microcents
    monthly = limit if key.spend_limit_window == "month" else None
    return {
        "id": key.id,
        "object": "api_key",
        "account_id": key.account_id,
        "name": key.name,
        "prefix": key.prefix,
        "project_id": key.project_id,
        "member_id": key.member_id,
        "allowed_models": allowed_models,
        "spend_limit_cents": None if limit is None else cents(limit),
        "spend_limit_microcents": limit,
        "spend_limit_window": key.spend_limit_window,
        # As before spend windows: the limit when its window is the month, else null.
        "monthly_spend_limit_cents": None if monthly is None else cents(monthly),
        "monthly_spend_limit_microcents": monthly,
        "created_at": format_timestamp(key.created_at),
        "revoked_at": format_timestamp(key.revoked_at) if key.revoked_at else None,
    }


def api_key_bodies(session: Session, keys: list[ApiKey]) -> list[dict[str, Any]]:
    lists = key_models(session, keys)
    return [api_key_body(key, lists[key.id]) for key in keys]


# -- model access, requests in flight, spend windows ---------------------------------------------

ACCOUNT_MODELS = table(AccountModel)
KEY_MODELS = table(ApiKeyModel)
MODELS = table(CatalogModel)
# An account's limit on requests in flight (far below the 32-bit column's ceiling).
MAX_CONCURRENT_REQUESTS = 1_000_000
# The most models one list may name.
MAX_LISTED_MODELS = 1000


def catalog_ids(session: Session, names: list[str], param: str) -> list[str]:
    """The catalog ids (catalog spelling, byte order, once each) of model names given in any
    case; an unknown one is 400 naming ``param``."""
    keys = sorted({name.lower() for name in names})
    found = dict(
        session.execute(select(MODELS.c.id_key, MODELS.c.id).where(MODELS.c.id_key.in_(keys))).all()
    )
    unknown = [name for name in names if name.lower() not in found]
    if unknown:
        raise InvalidRequest(f"unknown model {unknown[0]!r}", param=param)
    return sorted(set(found.values()), key=str.encode)


def account_models(session: Session, account: Account) -> list[str] | None:
    """The account's model list (null: every catalog model)."""
    if not account.restricts_models:
        return None
    rows = session.execute(
        select(ACCOUNT_MODELS.c.model_id).where(ACCOUNT_MODELS.c.account_id == account.id)
    ).scalars()
    return sorted(rows, key=str.encode)


def set_account_models(session: Session, account: Account, names: list[str] | None) -> None:
    """Replace the account's model list (null: every catalog model). Its keys' lists stay as
    they are: entries the account no longer sees grant nothing (metering.accounts.access)."""
    ids = None if names is None else catalog_ids(session, names, "models")
    session.execute(delete(ACCOUNT_MODELS).where(ACCOUNT_MODELS.c.account_id == account.id))
    if ids:
        session.execute(
            insert(ACCOUNT_MODELS), [{"account_id": account.id, "model_id": m} for m in ids]
        )
    account.restricts_models = ids is not None
    session.flush()


def key_models(session: Session, keys: list[ApiKey]) -> dict[str, list[str] | None]:
    """Each key's own model list (null: all of its account's), by key id."""
    restricted = [key.id for key in keys if key.restricts_models]
    lists: dict[str, list[str] | None] = {key.id: None for key in keys}
    for key_id in restricted:
        lists[key_id] = []
    if restricted:
        for key_id, model_id in session.execute(
            select(KEY_MODELS.c.api_key_id, KEY_MODELS.c.model_id).where(
                KEY_MODELS.c.api_key_id.in_(restricted)
            )
        ):
            listed = lists[key_id]
            assert listed is not None
            listed.append(model_id)
    for listed in lists.values():
        if listed is not None:
            listed.sort(key=str.encode)
    return lists


def set_key_models(session: Session, key: ApiKey, names: list[str] | None) -> None:
    """Replace the key's model list: null, or models its account sees now (else 400)."""
    ids = None
    if names is not None:
        ids = catalog_ids(session, names, "allowed_models")
        account = get_account(session, key.account_id)
        seen = account_models(session, account)
        outside = [m for m in ids if seen is not None and m not in seen]
        if outside:
            raise InvalidRequest(
                f"the key's account cannot use the model {outside[0]!r}", param="allowed_models"
            )
    session.execute(delete(KEY_MODELS).where(KEY_MODELS.c.api_key_id == key.id))
    if ids:
        session.execute(
            insert(KEY_MODELS),
            [{"account_id": key.account_id, "api_key_id": key.id, "model_id": m} for m in ids],
        )
    key.restricts_models = ids is not None
    session.flush()


@dataclass(frozen=True, slots=True)
class SpendLimit:
    """A key's spend limit as the request set it: ``None`` fields were not given."""

    amount: int | None
    window: str | None
    given: bool  # the amount was given (null included)


def spend_limit_of(body: Any) -> SpendLimit:
    """``spend_limit_cents`` / ``spend_limit_window``, or the older ``monthly_spend_limit_cents``
    (the limit per month); the two forms together are 400."""
    given = body.model_fields_set
    if "monthly_spend_limit_cents" in given:
        if given & {"spend_limit_cents", "spend_limit_window"}:
            raise InvalidRequest(
                "monthly_spend_limit_cents cannot be sent with spend_limit_cents or "
                "spend_limit_window",
                param="monthly_spend_limit_cents",
            )
        raw = body.monthly_spend_limit_cents
        amount = None if raw is None else parse_cents(raw, "monthly_spend_limit_cents")
        return SpendLimit(amount, "month", True)
    raw = body.spend_limit_cents
    amount = None if raw is None else parse_cents(raw, "spend_limit_cents")
    window = body.spend_limit_window if "spend_limit_window" in given else None
    return SpendLimit(amount, window, "spend_limit_cents" in given)


def apply_spend_limit(key: ApiKey, limit: SpendLimit) -> None:
    if limit.given:
        key.monthly_spend_limit_microcents = limit.amount
    if limit.window is not None:
        key.spend_limit_window = limit.window


def own_key_bodies(session: Session, keys: list[ApiKey], now: datetime) -> list[dict[str, Any]]:
    """``GET /v1/api-keys``: each key with its charges in its current spend window (by
    ``occurred_at``, from the daily rollups, as the check-and-hold counts them)."""
    lists = key_models(session, keys)
    bodies = []
    for key in keys:
        start, end = window_bounds(key.spend_limit_window, now)
        spent = int(
            session.execute(select(key_charges(key.account_id, key.id, start, end))).scalar_one()
        )
        limit = key.monthly_spend_limit_microcents
        bodies.append(
            {
                "id": key.id,
                "object": "api_key",
                "name": key.name,
                "created_at": format_timestamp(key.created_at),
                "revoked_at": format_timestamp(key.revoked_at) if key.revoked_at else None,
                "project_id": key.project_id,
                "member_id": key.member_id,
                "allowed_models": lists[key.id],
                "spend_limit_cents": None if limit is None else cents(limit),
                "spend_limit_window": key.spend_limit_window,
                "spent_cents": cents(spent),
                "spent_microcents": spent,
                "window_starts_at": format_timestamp(start),
            }
        )
    return bodies
