"""The credit ledger (append-only) and credit holds placed by pre-flight authorizations."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, BigIntPK, UTCDateTime
from metering.states.holds import ACTIVE_ROWS, RELEASED_ROWS, STATUS_CHECK, UNNOTICED_ROWS

ENTRY_KINDS = "kind IN ('grant', 'adjustment', 'charge', 'expiry', 'void', 'refund')"
ENTRY_SIGNS = (
    "(kind = 'grant' AND amount_microcents > 0) OR (kind = 'adjustment' AND "
    "amount_microcents <> 0) OR (kind = 'charge' AND amount_microcents <= 0) OR "
    "(kind IN ('expiry', 'void', 'refund') AND amount_microcents < 0)"
)


class LedgerEntry(Base):
    """One movement of an account's balance. Never updated or deleted; corrections are new
    entries. ``accounts.balance_microcents`` always equals the sum of an account's entries."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint(ENTRY_KINDS, name="kind"),
        CheckConstraint(ENTRY_SIGNS, name="amount_sign"),
        # Grants and adjustments share one idempotency namespace per account. Charges have no
        # key and stay out of the index: one per usage event, on the hot path.
        Index(
            "uq_ledger_entries_account_id_idempotency_key",
            "account_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        Index("ix_ledger_entries_account_id_id", "account_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(16))
    amount_microcents: Mapped[int] = mapped_column(BigInteger)  # signed: charges are negative
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    # SHA-256 of the request's normalised body: the same key with another body is a conflict.
    request_fingerprint: Mapped[str | None] = mapped_column(String(64))
    note: Mapped[str | None] = mapped_column(Text)  # a grant's note, an adjustment's reason
    # For charges: the usage event that caused it (not indexed: nothing looks entries up by it).
    usage_event_id: Mapped[int | None] = mapped_column(BigInteger)
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The grant a grant, positive adjustment, expiry, void or refund entry is about.
    grant_id: Mapped[str | None] = mapped_column(String(32))
    # When it counts: an expiry's is its grant's expires_at; null means created_at.
    effective_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Authorization(Base):
    """A credit hold of the estimated maximum cost of one LLM request.

    It counts against ``available`` while status is 'active' and ``expires_at`` is in the
    future: expiry needs no sweeper (a periodic tidy-up may set status 'expired').

    ``counted``: the estimate is included in ``accounts.held_microcents`` (prepaid accounts'
    holds, from the moment they are placed). Releasing a hold (void, settlement, tidy-up) only
    changes its status; the account's next check-and-hold stops counting it, under the
    account's lock, so releases never wait for that lock. An active hold of a prepaid account
    is always counted: it stops being counted only once released or past its expiry (it then
    becomes 'expired')."""

    __tablename__ = "authorizations"
    __table_args__ = (
        CheckConstraint(STATUS_CHECK, name="status"),
        CheckConstraint("estimate_microcents >= 0", name="estimate_non_negative"),
        UniqueConstraint("account_id", "request_id"),
        Index(
            "ix_authorizations_active_account",
            "account_id",
            "expires_at",
            sqlite_where=text(ACTIVE_ROWS),
            postgresql_where=text(ACTIVE_ROWS),
        ),
        Index(
            "ix_authorizations_active_key",
            "api_key_id",
            "expires_at",
            sqlite_where=text(ACTIVE_ROWS),
            postgresql_where=text(ACTIVE_ROWS),
        ),
        Index("ix_authorizations_status_expires_at", "status", "expires_at"),
        # Expired holds whose expired_unused event is still to be written (the tidy-up's).
        Index(
            "ix_authorizations_unnoticed_expiry",
            "id",
            sqlite_where=text(UNNOTICED_ROWS),
            postgresql_where=text(UNNOTICED_ROWS),
        ),
        # Released holds still counted: what the next check-and-hold of the account collects.
        Index(
            "ix_authorizations_released",
            "account_id",
            sqlite_where=text(RELEASED_ROWS),
            postgresql_where=text(RELEASED_ROWS),
        ),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # auth_… (holds.new_hold_id)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    request_id: Mapped[str | None] = mapped_column(String(64))
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id"))
    api: Mapped[str] = mapped_column(String(20))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    requested_max_tokens: Mapped[int | None] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    reasoning: Mapped[bool] = mapped_column(Boolean)
    max_tokens: Mapped[int] = mapped_column(Integer)  # the effective output limit
    estimate_microcents: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # settled or voided
    usage_event_id: Mapped[int | None] = mapped_column(BigInteger)  # the event that settled it
    counted: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Its ``authorization.expired_unused`` event is written (by the scheduler's tidy-up).
    unused_noticed: Mapped[bool] = mapped_column(Boolean, server_default="0")
