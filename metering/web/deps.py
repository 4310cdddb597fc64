"""Request-scoped dependencies: the unit of work, the clock, settings and credentials."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from metering.accounts.keys import KeyPrincipal, resolve_key
from metering.db import Database
from metering.kit.clock import Clock
from metering.kit.errors import AuthenticationFailed
from metering.settings import Settings


def get_database(request: Request) -> Database:
    database: Database = request.app.state.database
    return database


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_clock(request: Request) -> Clock:
    clock: Clock = request.app.state.clock
    return clock


def _session(request: Request) -> Iterator[Session]:
    """The request's unit of work: a read-only transaction for a GET; otherwise a write
    transaction committed here, after the endpoint returns and before the response is sent (so
    a failed commit is an error response, never a lost write), rolled back on error."""
    database = get_database(request)
    if request.method in ("GET", "HEAD"):
        with database.reading() as session:
            yield session
        return
    with database.unit_of_work() as session:
        yield session
        session.commit()


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency in the
# thread pool, and each hop there costs about as much CPU as a database round trip.


async def _now_dependency(request: Request) -> datetime:
    return get_clock(request).now()


# scope="function": the commit runs when the endpoint returns, not after the response is sent.
SessionDep = Annotated[Session, Depends(_session, scope="function")]
NowDep = Annotated[datetime, Depends(_now_dependency)]


def presented_credential(request: Request) -> str | None:
    """``Authorization: Bearer <x>`` or ``x-api-key: <x>``."""
    return credential_of(request.headers.get("authorization"), request.headers.get("x-api-key"))


def credential_of(authorization: str | None, x_api_key: str | None) -> str | None:
    """The credential in those two headers' values, if any."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return x_api_key.strip() if x_api_key and x_api_key.strip() else None


def token_matches(credential: str, tokens: list[str]) -> bool:
    # Compare against every token so timing does not reveal which one (if any) matched.
    presented = credential.encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(presented, token.encode())
    return matched


def _require_token(request: Request, tokens: list[str]) -> None:
    credential = presented_credential(request)
    if credential is None:
        raise AuthenticationFailed(
            "no credential: send Authorization: Bearer <token>", code="missing_api_key"
        )
    if not token_matches(credential, tokens):
        raise AuthenticationFailed("invalid credential", code="invalid_api_key")


async def require_admin(request: Request) -> None:
    _require_token(request, get_settings(request).admin_tokens)


async def require_gateway(request: Request) -> None:
    _require_token(request, get_settings(request).gateway_tokens)


def account_key(request: Request, session: SessionDep) -> KeyPrincipal:
    return resolve_key(session, presented_credential(request), param=None)


def optional_account_key(request: Request, session: SessionDep) -> KeyPrincipal | None:
    """The caller's key, or None when no credential header was sent at all. A header that is
    there but holds no usable key (``Bearer`` with nothing after it, another scheme) is an
    invalid key, not an anonymous caller: the client meant to send one."""
    credential = presented_credential(request)
    if credential is not None:
        return resolve_key(session, credential, param=None)
    if "authorization" in request.headers or "x-api-key" in request.headers:
        raise AuthenticationFailed(
            "the credential sent is no API key: send Authorization: Bearer <key>",
            code="invalid_api_key",
        )
    return None


AccountKeyDep = Annotated[KeyPrincipal, Depends(account_key)]
OptionalAccountKeyDep = Annotated[KeyPrincipal | None, Depends(optional_account_key)]
AdminDep = Depends(require_admin)
GatewayDep = Depends(require_gateway)
