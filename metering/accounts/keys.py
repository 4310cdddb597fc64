"""API keys as credentials: the secret's hash, and which key a secret names.

Only a hash of a key's secret is stored (docs/api.md#credentials); a key is live until it is
revoked. Every reader of a key by its secret (the account-key routes, the authorization's
resolution) uses ``live_key`` here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session

from metering.kit.errors import AuthenticationFailed
from metering.models import Account, ApiKey, table

KEYS = table(ApiKey)
ACCOUNTS = table(Account)


def hash_secret(secret: str) -> str:
    """SHA-256 of a key secret; the keys' 256 bits of entropy make a slow hash unnecessary."""
    # surrogatepass: a JSON body can carry a lone surrogate, which is simply no key (401).
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def live_key(keys: Any, secret_hash: Any) -> ColumnElement[bool]:
    """The key (of ``keys``, the table or an alias) whose secret has ``secret_hash`` and that is
    not revoked."""
    return and_(keys.c.secret_hash == secret_hash, keys.c.revoked_at.is_(None))


@dataclass(frozen=True, slots=True)
class KeyPrincipal:
    """An account key that authenticated a request."""

    api_key_id: str
    account_id: str
    billing: str


# Two statements, each of one table: the key by its secret's hash, then its account by id (on
# Citus the keys are on every node and the account on one shard: no read fans out).
_BY_SECRET = select(KEYS.c.id, KEYS.c.account_id)
_BILLING = select(ACCOUNTS.c.billing)


def resolve_key(session: Session, secret: str | None, *, param: str | None) -> KeyPrincipal:
    """The live key behind ``secret``; 401 when missing, unknown or revoked (no hint which).

    ``param`` is ``"api_key"`` for a client's key inside a gateway body, None for the caller's own.
    """
    if not secret:
        raise AuthenticationFailed("no API key given", code="missing_api_key", param=param)
    row = session.execute(_BY_SECRET.where(live_key(KEYS, hash_secret(secret)))).first()
    if row is None:
        raise AuthenticationFailed("invalid API key", code="invalid_api_key", param=param)
    billing = session.execute(_BILLING.where(ACCOUNTS.c.id == row.account_id)).scalar_one()
    return KeyPrincipal(api_key_id=row.id, account_id=row.account_id, billing=billing)
