"""The customer portal's sign-in links and its server-side sessions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String
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
