"""Creating accounts and keys; a key's secret exists only in the response that creates it."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.accounts.keys import hash_secret
from metering.kit.errors import NotFound
from metering.kit.ids import new_id
from metering.kit.money import cents
from metering.kit.timeutil import format_timestamp
from metering.models import Account, ApiKey

KEY_SECRET_PREFIX = "mk_"
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
    session.add(account)
    session.flush()
    return account


def create_api_key(
    session: Session, account: Account, name: str, limit_microcents: int | None, now: datetime
) -> tuple[ApiKey, str]:
    secret = new_key_secret()
    key = ApiKey(
        id=new_id("key"),
        account_id=account.id,
        name=name,
        prefix=secret[:DISPLAY_PREFIX_LENGTH],
        secret_hash=hash_secret(secret),
        monthly_spend_limit_microcents=limit_microcents,
        created_at=now,
    )
    session.add(key)
    session.flush()
    return key, secret


def account_body(account: Account) -> dict[str, Any]:
    threshold = account.low_balance_threshold_microcents
    return {
        "id": account.id,
        "object": "account",
        "name": account.name,
        "billing": account.billing,
        "created_at": format_timestamp(account.created_at),
        "low_balance_threshold_cents": None if threshold is None else cents(threshold),
        "low_balance_threshold_microcents": threshold,
    }


def api_key_body(key: ApiKey) -> dict[str, Any]:
    limit = key.monthly_spend_limit_microcents
    return {
        "id": key.id,
        "object": "api_key",
        "account_id": key.account_id,
        "name": key.name,
        "prefix": key.prefix,
        "monthly_spend_limit_cents": None if limit is None else cents(limit),
        "monthly_spend_limit_microcents": limit,
        "created_at": format_timestamp(key.created_at),
        "revoked_at": format_timestamp(key.revoked_at) if key.revoked_at else None,
    }
