"""Request-scoped dependencies: the unit of work, the clock, settings and credentials (an
account key's, ``metering.accounts.deps``; the audit of a request, ``metering.audit.deps``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

import anyio
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from metering.db import Database
from metering.kit.clock import Clock
from metering.kit.errors import AuthenticationFailed, MeteringError
from metering.kit.tokens import Token, matching, parse_tokens
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


async def _session(request: Request) -> AsyncIterator[Session]:
    """The request's unit of work: a read-only transaction for a GET; otherwise a write
    transaction committed here, after the endpoint returns and before the response is sent (so
    a failed commit is an error response, never a lost write), rolled back on error.

    On SQLite a write waits for the writer's turn here, on the event loop: never in the thread
    pool that runs the endpoints, where the request whose turn it is would wait for a thread
    held by the requests waiting for it (metering.db ``_Writers``). The commit and the close
    run in a thread outside that pool's limit, as FastAPI runs a dependency's exit."""
    database = get_database(request)
    if request.method in ("GET", "HEAD"):
        session = database.read_session()
        try:
            yield session
        finally:
            await _apart(session.close)
        return
    async with database.writer_turn():
        session = database.sessionmaker()
        try:
            yield session
        except BaseException:
            await _apart(session.close)
            raise
        await _apart(_commit_and_close, session)


def _commit_and_close(session: Session) -> None:
    try:
        session.commit()
    finally:
        session.close()


async def _apart(work: Callable[..., object], *args: object) -> None:
    """Blocking ``work`` in a worker thread outside the request pool's limit (a fresh limiter
    each time, as FastAPI runs a ``def`` dependency's exit)."""
    await anyio.to_thread.run_sync(work, *args, limiter=anyio.CapacityLimiter(1))


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency in the
# thread pool, and each hop there costs about as much CPU as a database round trip.


async def _now_dependency(request: Request) -> datetime:
    return get_clock(request).now()


# scope="function": the commit runs when the endpoint returns, not after the response is sent.
SessionDep = Annotated[Session, Depends(_session, scope="function")]
NowDep = Annotated[datetime, Depends(_now_dependency)]


def presented_credential(request: Request) -> str | None:
    """An account key: ``Authorization: Bearer <x>`` or ``x-api-key: <x>``."""
    return credential_of(request.headers.get("authorization"), request.headers.get("x-api-key"))


def bearer_of(authorization: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer <x>`` header's value, if any."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None


def credential_of(authorization: str | None, x_api_key: str | None) -> str | None:
    """The credential in those two headers' values, if any (account keys only: tokens are
    accepted only as ``Authorization: Bearer``)."""
    bearer = bearer_of(authorization)
    if bearer is not None:
        return bearer
    return x_api_key.strip() if x_api_key and x_api_key.strip() else None


def token_matches(credential: str, tokens: Sequence[Token]) -> bool:
    return matching(credential, tokens) is not None


@dataclass(frozen=True, slots=True)
class Credentials:
    """The configured tokens of each kind, parsed once per app (see ``metering.kit.tokens``)."""

    gateway: tuple[Token, ...]
    admin: tuple[Token, ...]
    readonly: tuple[Token, ...]
    metrics: tuple[Token, ...]  # empty: /metrics is open

    @classmethod
    def of(cls, settings: Settings) -> Credentials:
        return cls(
            gateway=parse_tokens(settings.gateway_tokens),
            admin=parse_tokens(settings.admin_tokens),
            readonly=parse_tokens(settings.admin_readonly_tokens),
            metrics=parse_tokens([settings.metrics_token] if settings.metrics_token else []),
        )


def get_credentials(request: Request) -> Credentials:
    credentials: Credentials = request.app.state.credentials
    return credentials


# What a read-only operator token may call under /admin/v1/: every GET (docs/api.md#credentials).
READ_METHODS = frozenset({"GET", "HEAD"})


class ReadOnlyToken(MeteringError):
    status = 403
    type = "permission_error"
    default_code = "read_only_token"


def bearer_token(request: Request, tokens: Sequence[Token]) -> Token:
    """The configured token the caller sent as ``Authorization: Bearer`` (the only way tokens
    are accepted: ``x-api-key`` is for account keys); 401 otherwise."""
    credential = bearer_of(request.headers.get("authorization"))
    if credential is None:
        if request.headers.get("x-api-key", "").strip():
            raise AuthenticationFailed(
                "invalid credential: tokens are accepted only as Authorization: Bearer <token>",
                code="invalid_api_key",
            )
        raise AuthenticationFailed(
            "no credential: send Authorization: Bearer <token>", code="missing_api_key"
        )
    token = matching(credential, tokens)
    if token is None:
        raise AuthenticationFailed("invalid credential", code="invalid_api_key")
    return token


def refuse_read_only_change(request: Request) -> None:
    """403 ``read_only_token`` for a read-only operator token on anything but a GET, before
    any validation of the request (called ahead of FastAPI's parsing by ``MeteringRoute``)."""
    if request.method in READ_METHODS:
        return
    credential = bearer_of(request.headers.get("authorization"))
    if credential is not None and matching(credential, get_credentials(request).readonly):
        raise ReadOnlyToken(
            f"this token is read-only: {request.method} is not allowed with it",
            code="read_only_token",
        )


async def require_operator(request: Request) -> None:
    """An admin token, or a read-only one on a GET; the caller's name becomes the actor of
    the audit events the request writes."""
    credentials = get_credentials(request)
    refuse_read_only_change(request)
    tokens = credentials.admin
    if request.method in READ_METHODS:
        tokens = credentials.admin + credentials.readonly
    request.state.actor = bearer_token(request, tokens).name


async def require_gateway(request: Request) -> None:
    bearer_token(request, get_credentials(request).gateway)


def actor_of(request: Request) -> str:
    """The operator who made the request (set by ``require_operator``)."""
    actor: str = request.state.actor
    return actor


AdminDep = Depends(require_operator)
GatewayDep = Depends(require_gateway)
