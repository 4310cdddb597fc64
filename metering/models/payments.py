"""Payments (Stripe): what customers pay, their Stripe customer and card, and the Stripe events
already processed. Every table is account data (``account_id``), sharded by account on Citus."""

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
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, UTCDateTime
from metering.states.payments import (
    KIND_CHECK,
    PENDING_ROWS,
    RECHARGE_IN_FLIGHT,
    REFUND_SOURCE_CHECK,
    REFUND_STATUS_CHECK,
    STATUS_CHECK,
)


class Payment(Base):
    """One payment. Written ``pending`` before Stripe is called; its id is the idempotency key of
    every Stripe call that creates or confirms its PaymentIntent, and the PaymentIntent's
    ``metadata.payment_id``. Moves only under the account's row lock (metering.payments.flows),
    its grant in the same transaction that marks it ``succeeded``."""

    __tablename__ = "payments"
    __table_args__ = (
        CheckConstraint(STATUS_CHECK, name="status"),
        CheckConstraint(KIND_CHECK, name="kind"),
        CheckConstraint("amount_cents > 0", name="amount_positive"),
        CheckConstraint(
            "refunded_cents >= 0 AND refunded_cents <= amount_cents", name="refunded_within"
        ),
        Index("ix_payments_account_id_created_at", "account_id", "created_at"),
        # An operator's top-up is idempotent on its key (per account).
        Index(
            "uq_payments_account_id_idempotency_key",
            "account_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        # The scheduler's reconciliation reads the payments still pending.
        Index(
            "ix_payments_pending",
            "created_at",
            sqlite_where=text(PENDING_ROWS),
            postgresql_where=text(PENDING_ROWS),
        ),
        Index("ix_payments_stripe_payment_intent_id", "stripe_payment_intent_id"),
        # At most one auto-recharge in flight per account, whatever replicas race.
        Index(
            "uq_payments_recharge_in_flight",
            "account_id",
            unique=True,
            sqlite_where=text(RECHARGE_IN_FLIGHT),
            postgresql_where=text(RECHARGE_IN_FLIGHT),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # pay_…
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(16))
    amount_cents: Mapped[int] = mapped_column(BigInteger)  # whole cents: Stripe charges cents
    status: Mapped[str] = mapped_column(String(16))
    refunded_cents: Mapped[int] = mapped_column(BigInteger, server_default="0")
    grant_id: Mapped[str | None] = mapped_column(String(32))
    failure_code: Mapped[str | None] = mapped_column(String(64))
    failure_message: Mapped[str | None] = mapped_column(Text)
    receipt_url: Mapped[str | None] = mapped_column(Text)
    stripe_payment_intent_id: Mapped[str | None] = mapped_column(String(255))
    # An operator's off-session top-up: its idempotency key and request's fingerprint.
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_fingerprint: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    succeeded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class PaymentRefund(Base):
    """A refund of a payment: an operator's (written ``pending`` before Stripe is called, its id
    Stripe's idempotency key and ``metadata.refund_id``) or one made in Stripe's dashboard
    (written when its ``charge.refunded`` arrives). Its effect (a ``refund`` ledger entry, the
    grant's remainder, the payment's ``refunded_cents``) is written once, in the transaction
    that makes it ``succeeded`` (metering.payments.refunds)."""

    __tablename__ = "payment_refunds"
    __table_args__ = (
        CheckConstraint(REFUND_STATUS_CHECK, name="status"),
        CheckConstraint(REFUND_SOURCE_CHECK, name="source"),
        CheckConstraint("amount_cents > 0", name="amount_positive"),
        Index("ix_payment_refunds_account_id_payment_id", "account_id", "payment_id"),
        # An operator's refund is idempotent on its key (per account).
        Index(
            "uq_payment_refunds_account_id_idempotency_key",
            "account_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        # Each Stripe refund is applied once, whichever way it is learnt.
        Index(
            "uq_payment_refunds_account_id_stripe_refund_id",
            "account_id",
            "stripe_refund_id",
            unique=True,
            sqlite_where=text("stripe_refund_id IS NOT NULL"),
            postgresql_where=text("stripe_refund_id IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # refund_…
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    payment_id: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)  # ours only: Stripe is never sent it
    stripe_refund_id: Mapped[str | None] = mapped_column(String(255))
    # An operator's refund made with a key: the key and the request's fingerprint.
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_fingerprint: Mapped[str | None] = mapped_column(String(64))
    # Once succeeded: its ledger entry, and the part its grant no longer held (a deficit).
    entry_id: Mapped[int | None] = mapped_column(BigInteger)
    deficit_microcents: Mapped[int] = mapped_column(BigInteger, server_default="0")
    failure_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    succeeded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class PaymentProfile(Base):
    """An account's side of Stripe: its Stripe customer (made on first need) and its saved card
    (at most one; shown as brand, last 4, expiry, never more)."""

    __tablename__ = "payment_profiles"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    stripe_customer_id: Mapped[str | None] = mapped_column(String(255))
    card_payment_method_id: Mapped[str | None] = mapped_column(String(255))
    card_brand: Mapped[str | None] = mapped_column(String(32))
    card_last4: Mapped[str | None] = mapped_column(String(4))
    card_exp_month: Mapped[int | None] = mapped_column(Integer)
    card_exp_year: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class StripeEvent(Base):
    """A Stripe event already processed (each once, whatever Stripe resends), under the account
    its object names (so the lookup routes to that account's shard)."""

    __tablename__ = "stripe_events"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)  # evt_…
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    type: Mapped[str] = mapped_column(String(64))
    processed_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AutoRecharge(Base):
    """An account's auto-recharge settings (``PUT /admin/v1/accounts/{id}/auto-recharge``, the
    portal's form) and what the monthly limit's event already said. Whether a recharge is due
    is on the account (``recharge_due_at``); failures and the month's recharges are read from
    the payments themselves."""

    __tablename__ = "auto_recharges"
    __table_args__ = (
        CheckConstraint("threshold_cents >= 0", name="threshold_nonnegative"),
        CheckConstraint("amount_cents > 0", name="amount_positive"),
        CheckConstraint("monthly_limit_cents >= amount_cents", name="limit_within"),
    )

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean)
    threshold_cents: Mapped[int] = mapped_column(BigInteger)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    monthly_limit_cents: Mapped[int] = mapped_column(BigInteger)
    # The UTC month (YYYY-MM) whose ``auto_recharge.limit_reached`` was written (once a month).
    limit_noticed_month: Mapped[str | None] = mapped_column(String(7))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
