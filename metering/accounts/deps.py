"""The account key a request presents, as a route's dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from metering.accounts.keys import KeyPrincipal, resolve_key
from metering.kit.errors import AuthenticationFailed
from metering.web.deps import SessionDep, presented_credential


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
