"""Recorded usage events with their charges, quarantined events, and report aggregates."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
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
    Base,
    BigIntPK,
    UTCDateTime,
    names,
    one_of,
)
from metering.pricing import API_NAMES

# What a usage event says of its request (metering.usage.events refuses any other).
OUTCOMES = ("completed", "failed")


class UsageEvent(Base):
    """One billed LLM request and its charge (1:1, so the charge lives on the event row).

    ``id`` is the ingest order. (account_id, request_id) is unique forever: the dedup key.

    No foreign keys, as every table a gateway request writes (``Names``, decision 0024): the
    checks cost half of the insert and share-locked the account row that authorizations wait
    for, once per event."""

    __tablename__ = "usage_events"
    __table_args__ = (
        UniqueConstraint("account_id", "request_id"),
        CheckConstraint(
            "total_microcents = input_microcents + cache_read_microcents + output_microcents",
            name="total_is_sum",
        ),
        # Which charges a price version priced, and when (catalog import's refusal rules).
        Index("ix_usage_events_price_version_id_occurred_at", "price_version_id", "occurred_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(32), info=names(ACCOUNT_ROW))
    request_id: Mapped[str] = mapped_column(String(64))
    api_key_id: Mapped[str] = mapped_column(String(32), info=names(KEY_ROW))
    model_id: Mapped[str] = mapped_column(String(100), info=names(MODEL_ROW))
    api: Mapped[str] = mapped_column(one_of("usage_api", API_NAMES, 20))
    outcome: Mapped[str] = mapped_column(one_of("usage_outcome", OUTCOMES, 10))
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)
    authorization_id: Mapped[str | None] = mapped_column(String(64))
    # Normalised counts (docs/api.md#post-v1usageevents): prompt includes cached, output includes
    # reasoning.
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    reasoning_tokens: Mapped[int] = mapped_column(Integer)
    # The charge: each component rounded half up to a microcent; zero for unbilled accounts.
    input_microcents: Mapped[int] = mapped_column(BigInteger)
    cache_read_microcents: Mapped[int] = mapped_column(BigInteger)
    output_microcents: Mapped[int] = mapped_column(BigInteger)
    total_microcents: Mapped[int] = mapped_column(BigInteger)
    price_version_id: Mapped[str | None] = mapped_column(String(32))


class QuarantinedEvent(Base):
    """A keyed event that cannot be billed now, kept verbatim for an operator (never dropped)."""

    __tablename__ = "quarantined_events"
    __table_args__ = (
        Index("ix_quarantined_events_code_id", "code", "id"),
        Index("ix_quarantined_events_account_id_id", "account_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    # Null when the event's key is unknown (its account cannot be known).
    account_id: Mapped[str | None] = mapped_column(String(32))
    api_key_id: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    code: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    raw_event: Mapped[str] = mapped_column(Text)  # the event as received, canonical JSON
    # SHA-256 of raw_event: the same unbillable event sent again is kept once.
    raw_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)


_DAY_ROWS = "bucket_width = '1d' AND grouping = 'key_model'"
# A rollup row's bucket widths, and the dimensions it keeps (metering.usage.rollups).
ROLLUP_WIDTHS = ("1h", "1d")
ROLLUP_GROUPINGS = ("key_model", "key", "model")


class UsageRollup(Base):
    """Pre-aggregated usage, maintained in the ingest transaction; reports read only these.

    ``bucket_width`` is '1h' or '1d'; ``grouping`` says which dimensions the row keeps:
    'key_model' (both), 'key' (model_id = ''), 'model' (api_key_id = '')."""

    __tablename__ = "usage_rollups"
    __table_args__ = (
        # Which accounts and days have usage, across accounts (the scheduler's due days, a
        # day's export): the primary key starts with the account. Only the day rows of one
        # grouping, and no column an upsert changes, so the rollup updates stay HOT.
        Index(
            "ix_usage_rollups_day_key_model",
            "bucket_start",
            sqlite_where=text(_DAY_ROWS),
            postgresql_where=text(_DAY_ROWS),
        ),
    )

    account_id: Mapped[str] = mapped_column(String(32), primary_key=True, info=names(ACCOUNT_ROW))
    bucket_width: Mapped[str] = mapped_column(
        one_of("rollup_bucket_width", ROLLUP_WIDTHS, 2), primary_key=True
    )
    grouping: Mapped[str] = mapped_column(
        one_of("rollup_grouping", ROLLUP_GROUPINGS, 10), primary_key=True
    )
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)  # cache reads included
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)  # reasoning included
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_microcents: Mapped[int] = mapped_column(BigInteger)
    # The newest usage_events.id counted here: what an export saw, and whether it is stale.
    last_event_id: Mapped[int] = mapped_column(BigInteger)
