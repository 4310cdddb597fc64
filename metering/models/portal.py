"""The customer portal's sign-in links and its server-side sessions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, UTCDateTime


class PortalSignInToken(Base):
    """A sign-in link's token, single use: only its SHA-256 is stored; ``used_at`` is set by the
    one statement that spends it."""

    __tablename__ = "portal_sign_in_tokens"
    __table_args__ = (Index("ix_portal_sign_in_tokens_account_id", "account_id"),)

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The member the link signs in as (null: the account's owner, every permission).
    member_id: Mapped[str | None] = mapped_column(String(32))


class PortalSession(Base):
    """A signed-in browser. The cookie holds the session's secret (signed); only its SHA-256 is
    stored. Signing out sets ``ended_at``: the cookie is then worthless everywhere."""

    __tablename__ = "portal_sessions"
    __table_args__ = (Index("ix_portal_sessions_account_id", "account_id"),)

    secret_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)  # psess_…, safe to show and log
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    # How it began: "link" (a portal link) or "api_key:<key_…>".
    method: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class PortalMail(Base):
    """The portal's outbox of sign-in mails: written by the request that asks for one (the
    sign-in page's form, an admin adding a member), sent later by the scheduler, which makes the
    links then (so no link's token is ever stored but as its hash).

    ``kind`` ``sign_in``: the address asked for a link on the sign-in page (``address`` in lower
    case; no account: the scheduler finds the members it names); ``member_added``: the member
    ``member_id`` of ``account_id`` was added. The sign-in rows of the last hour are how many
    links an address was sent (at most 5 an hour): kept an hour after they are sent.
    """

    __tablename__ = "portal_mails"
    __table_args__ = (
        CheckConstraint("kind IN ('sign_in', 'member_added')", name="kind"),
        CheckConstraint("outcome IN ('sent', 'no_member', 'failed')", name="outcome"),
        Index("ix_portal_mails_address_created_at", "address", "created_at"),
        Index("ix_portal_mails_next_attempt_at", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    address: Mapped[str] = mapped_column(String(320))
    account_id: Mapped[str | None] = mapped_column(String(32))
    member_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When the scheduler may (next) take it; null once it has an outcome.
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str | None] = mapped_column(String(16))
    last_error: Mapped[str | None] = mapped_column(String(500))
