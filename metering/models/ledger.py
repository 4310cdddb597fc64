"""The credit ledger (append-only) and credit holds placed by pre-flight authorizations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import (
    ACCOUNT_ROW,
    KEY_ROW,
    MODEL_ROW,
    NON_NEGATIVE_MICROCENTS,
    Base,
    BigIntPK,
    UTCDateTime,
    checked,
    names,
    one_of,
)
from metering.states import listed as listed_as_sql
from metering.states.holds import (
    ACTIVE_ROWS,
    OPEN_ROWS,
    RELEASED_ROWS,
    UNNOTICED_ROWS,
    HoldStatus,
)

# The signs (1, 0, -1) each kind of entry's amount may have: grants add, adjustments change,
# charges never add, expiries, voids and refunds take away. The table's two checks are rendered
# from it: in the long form here (the models, SQLite), in PostgreSQL's compact forms by the
# migrations (0006, 0007), each with the kinds of its time.
ENTRY_SIGNS: dict[str, tuple[int, ...]] = {
    "grant": (1,),
    "adjustment": (1, -1),
    "charge": (0, -1),
    "expiry": (-1,),
    "void": (-1,),
    "refund": (-1,),
}

# An amount's test, by the signs it allows.
_AMOUNT_TESTS = {
    frozenset({1}): "amount_microcents > 0",
    frozenset({0}): "amount_microcents = 0",
    frozenset({-1}): "amount_microcents < 0",
    frozenset({0, 1}): "amount_microcents >= 0",
    frozenset({0, -1}): "amount_microcents <= 0",
    frozenset({1, -1}): "amount_microcents <> 0",
}


def _text_array(values: Iterable[str]) -> str:
    """PostgreSQL's compact list: one ``text[]`` constant, which a statement folds far faster
    than the ``IN (…)`` list of VARCHARs it stands for (docs/performance.md)."""
    return "'{" + ",".join(values) + "}'::text[]"


def kind_check(kinds: Iterable[str], compact: bool = False) -> str:
    """``kind`` is one of ``kinds``: ``kind = 'a'``, ``kind IN ('a', 'b')``, or ``compact``
    (PostgreSQL) ``kind::text = ANY ('{a,b}'::text[])``."""
    listed = tuple(kinds)
    if len(listed) == 1:
        return f"kind = '{listed[0]}'"
    if compact:
        return f"kind::text = ANY ({_text_array(listed)})"
    return listed_as_sql("kind", listed)


def amount_sign_check(
    signs: Mapping[str, tuple[int, ...]], compact: bool = False, compact_kinds: bool = False
) -> str:
    """Each kind's amount has one of its ``signs``, and no other kind is allowed. The long form:
    one alternative per test of the amount, naming its kinds (``compact_kinds``: as
    ``kind_check``'s compact form, the baseline's on PostgreSQL); ``compact`` (PostgreSQL's
    since migration 0006): the kind and the sign of the amount as one text, among the allowed
    pairs (one comparison with one constant)."""
    if compact:
        pairs = [f"{kind}{sign}" for kind, allowed in signs.items() for sign in allowed]
        return f"kind::text || sign(amount_microcents)::text = ANY ({_text_array(pairs)})"
    kinds_of: dict[str, list[str]] = {}
    for kind, allowed in signs.items():
        kinds_of.setdefault(_AMOUNT_TESTS[frozenset(allowed)], []).append(kind)
    return " OR ".join(
        f"({kind_check(kinds, compact_kinds)} AND {test})" for test, kinds in kinds_of.items()
    )


class LedgerEntry(Base):
    """One movement of an account's balance. Never updated or deleted; corrections are new
    entries. ``accounts.balance_microcents`` always equals the sum of an account's entries."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint(amount_sign_check(ENTRY_SIGNS), name="amount_sign"),
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
        # The ledger's list, newest first (metering.kit.pagination.newest_first_by_time).
        Index("ix_ledger_entries_account_id_created_at_id", "account_id", "created_at", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(32), info=names(ACCOUNT_ROW))
    kind: Mapped[str] = mapped_column(one_of("ledger_entry_kind", ENTRY_SIGNS, 16))
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
        # Open holds by status and expiry (the tidy-up, the expired holds' gauge); on SQLite,
        # which cannot use it for one status of the two, every hold's.
        Index(
            "ix_authorizations_status_expires_at",
            "status",
            "expires_at",
            postgresql_where=text(OPEN_ROWS),
        ),
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
    account_id: Mapped[str] = mapped_column(String(32), info=names(ACCOUNT_ROW))
    api_key_id: Mapped[str] = mapped_column(String(32), info=names(KEY_ROW))
    request_id: Mapped[str | None] = mapped_column(String(64))
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    model_id: Mapped[str] = mapped_column(String(100), info=names(MODEL_ROW))
    api: Mapped[str] = mapped_column(String(20))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    requested_max_tokens: Mapped[int | None] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    reasoning: Mapped[bool] = mapped_column(Boolean)
    max_tokens: Mapped[int] = mapped_column(Integer)  # the effective output limit
    estimate_microcents: Mapped[int] = mapped_column(checked(NON_NEGATIVE_MICROCENTS))
    status: Mapped[str] = mapped_column(one_of("hold_status", HoldStatus, 16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # settled or voided
    usage_event_id: Mapped[int | None] = mapped_column(BigInteger)  # the event that settled it
    counted: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Its ``authorization.expired_unused`` event is written (by the scheduler's tidy-up).
    unused_noticed: Mapped[bool] = mapped_column(Boolean, server_default="0")
