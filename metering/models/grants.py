"""Credit grants (docs/api.md#credit-ledger): prepaid credit held in grants, each with its own
remainder, and the record of which grants (or the deficit) paid each debit."""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import (
    ACCOUNT_ROW,
    GRANT_PRIORITY,
    POSITIVE_MICROCENTS,
    Base,
    UTCDateTime,
    checked,
    names,
    one_of,
)
from metering.states.grants import ACTIVE_ROWS, STORED

# ACTIVE_ROWS: rows a debit may still be paid from are among these (the live test adds "a
# remainder, not expired at now"). Not on the remainder itself: every debit moves it, and a
# column an index's predicate reads makes each such update of the grant a non-HOT one in
# PostgreSQL (a new entry in every index of the table, and dead ones to skip until a vacuum),
# one per debit.
# Grants with an expiry whose credit.grant_expiring is still to be written or skipped.
UNNOTICED_EXPIRY_ROWS = "expires_at IS NOT NULL AND NOT expiring_noticed"
ALLOCATION_KINDS = ("spend", "deficit", "payoff", "refund")

CATEGORIES = ("paid", "promotional", "adjustment")


class CreditGrant(Base):
    """One grant. ``remaining_microcents`` moves only under the account's row lock, together
    with the ledger entry or the allocation that moves it. ``status`` as stored is ``active``,
    ``expired`` (its forfeit is written) or ``voided``; ``depleted`` and an expiry not yet
    written are read from the remainder and the clock (metering.states.grants)."""

    __tablename__ = "credit_grants"
    __table_args__ = (
        CheckConstraint(
            "remaining_microcents >= 0 AND remaining_microcents <= amount_microcents",
            name="remaining_within_amount",
        ),
        # The grants' list, newest first (metering.kit.pagination.newest_first_by_time).
        Index(
            "ix_credit_grants_account_id_created_at_entry_id",
            "account_id",
            "created_at",
            "entry_id",
        ),
        Index(
            "ix_credit_grants_active",
            "account_id",
            "expires_at",
            sqlite_where=text(ACTIVE_ROWS),
            postgresql_where=text(ACTIVE_ROWS),
        ),
        Index(
            "ix_credit_grants_expiring_unnoticed",
            "expires_at",
            sqlite_where=text(UNNOTICED_EXPIRY_ROWS),
            postgresql_where=text(UNNOTICED_EXPIRY_ROWS),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # grant_…
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    # The ledger entry that created it (a grant or a positive adjustment): its creation order.
    entry_id: Mapped[int] = mapped_column(BigInteger, unique=True)
    category: Mapped[str] = mapped_column(one_of("grant_category", CATEGORIES, 16))
    priority: Mapped[int] = mapped_column(checked(GRANT_PRIORITY))
    amount_microcents: Mapped[int] = mapped_column(checked(POSITIVE_MICROCENTS))
    remaining_microcents: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(one_of("grant_status", STORED, 16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(Text)
    # Its credit.grant_expiring is written (or was not due: no remainder, voided, expired).
    expiring_noticed: Mapped[bool] = mapped_column(Boolean, server_default="0")


class CreditAllocationDay(Base):
    """What paid the debits of one account on one UTC day, per kind and grant: ``spend`` (a grant
    paid part of a charge or negative adjustment), ``deficit`` (no live grant could: the deficit
    grew; ``grant_id`` is ``''``, so that the key is unique and ``ON CONFLICT`` finds the row),
    ``payoff`` (a new grant paid off part of the deficit) or ``refund`` (the part of a refund of
    the grant ``grant_id`` that the grant no longer held: the deficit grew by it). Each debit
    adds its parts in its own transaction (``INSERT … ON CONFLICT DO UPDATE``): the roll-forward
    reads days, never one row per debit."""

    __tablename__ = "credit_allocation_days"
    __table_args__ = (CheckConstraint("(kind = 'deficit') = (grant_id = '')", name="grant_named"),)

    account_id: Mapped[str] = mapped_column(String(32), primary_key=True, info=names(ACCOUNT_ROW))
    allocation_date: Mapped[date] = mapped_column(Date, primary_key=True)  # the debit's UTC day
    kind: Mapped[str] = mapped_column(
        one_of("allocation_kind", ALLOCATION_KINDS, 16), primary_key=True
    )
    grant_id: Mapped[str] = mapped_column(String(32), primary_key=True)  # '' for ``deficit``
    amount_microcents: Mapped[int] = mapped_column(checked(POSITIVE_MICROCENTS))


class CreditRollforward(Base):
    """One row: the first day of the daily credit roll-forward (the day the baseline migration
    made the schema; earlier days are not written)."""

    __tablename__ = "credit_rollforward"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_date: Mapped[date] = mapped_column(Date)
