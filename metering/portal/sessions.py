"""Sign-in links (single use, 15 minutes) and server-side sessions (12 hours).

A link's token and a session's secret are 256 random bits; only their SHA-256 is stored. A
link is spent by one conditional UPDATE, so two clicks (or two processes) can never both sign
in with it. A session is found by its secret's hash and is over at ``expires_at`` or once
signed out (``ended_at``), and one signed in with an API key is over once the key is revoked:
every process sees the same, nothing is kept in memory.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from metering.accounts.service import get_account
from metering.kit.errors import InvalidRequest
from metering.kit.ids import new_id
from metering.models import Account, ApiKey, Member, PortalSession, PortalSignInToken, table
from metering.portal.roles import Permission, Role, SessionKind, kind_of, permissions_of
from metering.runtime import EMBEDDED_BASE_URL
from metering.settings import Settings

LINK_LIFETIME = timedelta(minutes=15)
SESSION_LIFETIME = timedelta(hours=12)
SIGN_IN_PATH = "/billing/sign-in/"

TOKENS = table(PortalSignInToken)
SESSIONS = table(PortalSession)
ACCOUNTS = table(Account)
MEMBERS = table(Member)
KEYS = table(ApiKey)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def public_base_url(settings: Settings) -> str:
    """Where the sign-in links point: the service's public address (the embedded server's own
    by default)."""
    return settings.public_base_url or EMBEDDED_BASE_URL


@dataclass(frozen=True, slots=True)
class SignInLink:
    url: str
    account_id: str
    expires_at: datetime


def create_link(
    session: Session,
    account_id: str,
    base_url: str,
    now: datetime,
    member_id: str | None = None,
) -> SignInLink:
    """A new single-use sign-in link for ``account_id`` (404 when there is no such account),
    as its member ``member_id`` (a member of the account, not removed; else 400) or, without
    one, as the account's owner."""
    get_account(session, account_id)
    if member_id is not None and not _member_is_current(session, account_id, member_id):
        raise InvalidRequest(
            f"the account has no member {member_id} (or it was removed)", param="member_id"
        )
    token = secrets.token_urlsafe(32)
    expires_at = now + LINK_LIFETIME
    session.execute(
        insert(TOKENS).values(
            token_hash=_hash(token),
            account_id=account_id,
            created_at=now,
            expires_at=expires_at,
            used_at=None,
            member_id=member_id,
        )
    )
    return SignInLink(f"{base_url.rstrip('/')}{SIGN_IN_PATH}{token}", account_id, expires_at)


def link_is_usable(session: Session, token: str, now: datetime) -> bool:
    """Whether the link would sign in now (for the confirmation page; spending decides)."""
    row = session.execute(
        select(TOKENS.c.account_id).where(
            TOKENS.c.token_hash == _hash(token),
            TOKENS.c.used_at.is_(None),
            TOKENS.c.expires_at > now,
        )
    ).first()
    return row is not None


def spend_link(session: Session, token: str, now: datetime) -> tuple[str, str | None] | None:
    """The account the link signs into and the member it signs in as (None: the owner),
    marking it used; None for a link that is unknown, expired or already used (no hint
    which)."""
    row = session.execute(
        update(TOKENS)
        .where(
            TOKENS.c.token_hash == _hash(token),
            TOKENS.c.used_at.is_(None),
            TOKENS.c.expires_at > now,
        )
        .values(used_at=now)
        .returning(TOKENS.c.account_id, TOKENS.c.member_id)
    ).first()
    return None if row is None else (row.account_id, row.member_id)


def _member_is_current(session: Session, account_id: str, member_id: str) -> bool:
    return (
        session.execute(
            select(MEMBERS.c.id).where(
                MEMBERS.c.account_id == account_id,
                MEMBERS.c.id == member_id,
                MEMBERS.c.removed_at.is_(None),
            )
        ).first()
        is not None
    )


@dataclass(frozen=True, slots=True)
class PortalUser:
    """A signed-in session: whose account it shows, and what it may do there."""

    session_id: str
    account_id: str
    account_name: str
    billing: str
    expires_at: datetime
    permissions: frozenset[Permission]
    member_id: str | None = None  # a member's session: whose keys are "own keys"

    @property
    def actor(self) -> str:
        """Who the audit log names for this session's changes."""
        return f"portal:{self.member_id or self.account_id}"

    def can(self, permission: Permission) -> bool:
        return permission in self.permissions


def start_session(session: Session, account_id: str, method: str, now: datetime) -> str:
    """A new session for ``account_id``; returns its secret (for the cookie, never stored)."""
    secret = secrets.token_urlsafe(32)
    session.execute(
        insert(SESSIONS).values(
            secret_hash=_hash(secret),
            id=new_id("psess"),
            account_id=account_id,
            method=method,
            created_at=now,
            expires_at=now + SESSION_LIFETIME,
            ended_at=None,
        )
    )
    return secret


def user_of(session: Session, secret: str, now: datetime) -> PortalUser | None:
    """The live session whose secret this is, or None (unknown, expired or signed out)."""
    row = session.execute(
        select(
            SESSIONS.c.id,
            SESSIONS.c.account_id,
            SESSIONS.c.expires_at,
            SESSIONS.c.method,
            ACCOUNTS.c.name,
            ACCOUNTS.c.billing,
        )
        .join(ACCOUNTS, ACCOUNTS.c.id == SESSIONS.c.account_id)
        .where(
            SESSIONS.c.secret_hash == _hash(secret),
            SESSIONS.c.ended_at.is_(None),
            SESSIONS.c.expires_at > now,
        )
    ).first()
    if row is None:
        return None
    kind, subject = kind_of(row.method)
    if kind is SessionKind.API_KEY and not _key_is_live(session, row.account_id, subject):
        return None  # signed in with a key since revoked: over with the key
    if kind is not SessionKind.MEMBER:
        return PortalUser(
            row.id, row.account_id, row.name, row.billing, row.expires_at, permissions_of(kind)
        )
    # A member's permissions are its role now: a role changed, or the member removed (its
    # session over), applies at the next request.
    role = session.execute(
        select(MEMBERS.c.role).where(
            MEMBERS.c.account_id == row.account_id,
            MEMBERS.c.id == subject,
            MEMBERS.c.removed_at.is_(None),
        )
    ).scalar_one_or_none()
    if role is None:
        return None
    return PortalUser(
        row.id,
        row.account_id,
        row.name,
        row.billing,
        row.expires_at,
        permissions_of(kind, Role(role)),
        member_id=subject,
    )


def _key_is_live(session: Session, account_id: str, key_id: str | None) -> bool:
    live = select(KEYS.c.id).where(
        KEYS.c.account_id == account_id, KEYS.c.id == key_id, KEYS.c.revoked_at.is_(None)
    )
    return session.execute(live).first() is not None


def end_session(session: Session, secret: str, now: datetime) -> None:
    session.execute(
        update(SESSIONS)
        .where(SESSIONS.c.secret_hash == _hash(secret), SESSIONS.c.ended_at.is_(None))
        .values(ended_at=now)
    )


def delete_finished(session: Session, now: datetime) -> tuple[int, int]:
    """Sessions that are over (expired or signed out) and links that can no longer sign in
    (used or expired), deleted: nothing reads them again, and a spent or expired link that is
    gone is refused like any unknown one. Returns (sessions, links) deleted."""
    sessions = session.execute(
        delete(SESSIONS).where(SESSIONS.c.ended_at.isnot(None) | (SESSIONS.c.expires_at <= now))
    )
    links = session.execute(
        delete(TOKENS).where(TOKENS.c.used_at.isnot(None) | (TOKENS.c.expires_at <= now))
    )
    return int(sessions.rowcount), int(links.rowcount)  # type: ignore[attr-defined]
