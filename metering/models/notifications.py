"""Webhook endpoints, the outbox of events, and their deliveries (docs/api.md#webhooks)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, BigIntPK, UTCDateTime
from metering.states.deliveries import PENDING_ROWS


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # None: an operator's endpoint for every account's events and the operator-only ones.
    account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[str] = mapped_column(Text)  # a JSON array of type names
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    description: Mapped[str | None] = mapped_column(String(500))
    # Signing secrets, encrypted (metering.notifications.secrets), never in clear.
    secret_sealed: Mapped[str] = mapped_column(Text)
    # After a rotation, the previous secret also signs until ``previous_until``.
    previous_secret_sealed: Mapped[str | None] = mapped_column(Text)
    previous_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# The account of an event (and its deliveries) of no account: an operator-wide event
# (``export.completed``, ``usage.quarantined`` of keys of no account, an operator endpoint's
# ``webhook.test``). The column is a shard key on Citus, which is never NULL: such events are
# stored under ``''`` and shown with ``account_id`` null (metering.notifications.outbox).
NO_ACCOUNT = ""


class WebhookEvent(Base):
    """The outbox: one row per event, written in the transaction that causes it (on Citus on
    the account's shard, as the rest of that transaction)."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        # The fan-out takes them in the order they were made: by time, then id (on Citus a
        # worker numbers the events of the calls delegated to it in a range of its own).
        Index(
            "ix_webhook_events_undispatched",
            "created_at",
            "id",
            postgresql_where=text("NOT dispatched"),
            sqlite_where=text("NOT dispatched"),
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    public_id: Mapped[str] = mapped_column(String(40), unique=True)  # evt_…
    account_id: Mapped[str] = mapped_column(String(32), index=True)  # NO_ACCOUNT: none
    type: Mapped[str] = mapped_column(String(64))
    # The event's data as JSON; amounts as integer ``*_microcents`` (rendered with ``*_cents``).
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Its deliveries were made for the endpoints that match it (by the delivery loop).
    dispatched: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class WebhookDelivery(Base):
    """One event to one endpoint: its attempts and outcome."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text(PENDING_ROWS),
            sqlite_where=text(PENDING_ROWS),
        ),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "id"),
        Index("uq_webhook_deliveries_event_endpoint", "event_id", "endpoint_id", unique=True),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("webhook_events.id"))
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id"))
    account_id: Mapped[str] = mapped_column(String(32))  # its event's
    # pending → delivered | failed (retries exhausted) | dropped (endpoint deleted):
    # metering.states.deliveries
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(500))
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SpendLimitNotice(Base):
    """A spend-limit threshold reached in one window (``spend_limit.threshold_reached``): a
    project's, a member's or a key's (``limit_scope``; ``scope_id`` its id), written with its
    event in the transaction whose charges reached it: its key makes the event fire once per
    project, member or key, window and percent, whatever the concurrency
    (metering.notifications.spend_limits). The ids' prefixes (``proj_``, ``mem_``, ``key_``)
    keep the scopes apart."""

    __tablename__ = "spend_limit_notices"
    __table_args__ = (
        PrimaryKeyConstraint(
            "account_id", "scope_id", "spend_limit_window", "window_starts_at", "percent"
        ),
        CheckConstraint("percent IN (80, 100)", name="percent"),
        CheckConstraint("limit_scope IN ('project', 'member', 'key')", name="limit_scope"),
    )

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    limit_scope: Mapped[str] = mapped_column(String(8))  # project, member, key
    scope_id: Mapped[str] = mapped_column(String(32))  # the project's, member's or key's id
    # The key whose charge reached it (for a key's limit, that key).
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    spend_limit_window: Mapped[str] = mapped_column(String(8))  # day, week, month
    window_starts_at: Mapped[datetime] = mapped_column(UTCDateTime)
    percent: Mapped[int] = mapped_column(Integer)
    # The limit, and the scope's charges in the window, when it was reached.
    limit_microcents: Mapped[int] = mapped_column(BigInteger)
    spent_microcents: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
