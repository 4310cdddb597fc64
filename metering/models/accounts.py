"""Accounts and their API keys."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    PrimaryKeyConstraint,
    String,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import CONCURRENCY_LIMIT, Base, UTCDateTime, checked, one_of

BILLINGS = ("prepaid", "unbilled")


class Account(Base):
    __tablename__ = "accounts"
    __table_args__ = (
        # The scheduler's auto-recharge loop reads the accounts a recharge is due for.
        Index(
            "ix_accounts_recharge_due_at",
            "recharge_due_at",
            sqlite_where=text("recharge_due_at IS NOT NULL"),
            postgresql_where=text("recharge_due_at IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    billing: Mapped[str] = mapped_column(one_of("account_billing", BILLINGS, 16))
    # grants + adjustments − charges; moved only together with a ledger entry, in one transaction.
    balance_microcents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The sum of the estimates of the account's holds with ``counted`` set: what the check-and-
    # hold compares with the balance, in O(1). Moved only under the account's row lock, by the
    # check-and-hold itself, which first stops counting the holds released since (see
    # metering.ledger.placement). ``GET /v1/credits`` sums the holds in force instead.
    held_microcents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # How many holds ``held_microcents`` counts: the account's requests in flight, kept beside
    # it by the same check-and-hold (metering.accounts.access).
    held_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Null = no limit on requests in flight.
    max_concurrent_requests: Mapped[int | None] = mapped_column(checked(CONCURRENCY_LIMIT))
    # False = every catalog model; true = exactly the models of ``account_models``.
    restricts_models: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Set once a project or a member of the account is given a spend limit (never cleared): the
    # ingest then reads their limits for the spend-limit thresholds, in a statement of its own,
    # so an account without such limits pays nothing for them (metering.usage.repository).
    scope_limits: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Set once a project of the account is given a model list (never cleared). With neither
    # mark, the account's projects and members change nothing its keys resolve to, and the
    # check-and-hold confirms a remembered resolution without them (metering.ledger.resolution).
    project_models: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Moved on one PostgreSQL server by the database itself (triggers) whenever anything of the
    # account that a key's resolution reads changes: a remembered resolution read at this value
    # still holds while it is unchanged (metering.ledger.resolution).
    resolution_generation: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # What charges ran beyond the live grants: balance = Σ remainders − deficit.
    deficit_microcents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # No grant of the account with a remainder expires before this instant (null: none
    # expires), so the check-and-hold looks for expired remainders only once it has passed.
    next_expiry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # ``credit.balance_low`` fires when a transaction takes the balance below it.
    low_balance_threshold_microcents: Mapped[int | None] = mapped_column(BigInteger)
    # Auto-recharge's threshold while it is enabled (null: off; its settings are the account's
    # ``auto_recharges`` row), beside the balance so that the debit that takes the balance below
    # it marks the recharge due (``recharge_due_at``) in its own statement (metering.payments
    # .recharge); the scheduler clears the mark once the balance is back at the threshold.
    recharge_threshold_microcents: Mapped[int | None] = mapped_column(BigInteger)
    recharge_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint(
            "spend_limit_window IN ('day', 'week', 'month')", name="spend_limit_window"
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)  # hex SHA-256 of the secret
    # The key's spend limit (per ``spend_limit_window``; the column keeps its first name).
    monthly_spend_limit_microcents: Mapped[int | None] = mapped_column(BigInteger)
    spend_limit_window: Mapped[str] = mapped_column(
        String(8), default="month", server_default="month"
    )
    # False = every model of its account; true = the models of ``api_key_models`` (∩ the
    # account's).
    restricts_models: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The project and the member (null: a service key) the key belongs to, fixed for its life
    # so that what it spent is never attributed anew. Every key has a project (the migration
    # that made the column put the older keys in their account's ``Default`` project); the
    # column is nullable only because SQLite cannot add a NOT NULL column without a default.
    # No foreign keys: the service writes a project and a member it has just read in the same
    # transaction, and neither is ever deleted (on Citus a reference table could not refer to
    # them anyway: they are account data, and the keys are on every node).
    project_id: Mapped[str | None] = mapped_column(String(32), index=True)
    member_id: Mapped[str | None] = mapped_column(String(32), index=True)


class Project(Base):
    """A group of an account's keys with its own models and spend limit; every account has
    one named ``Default``, made with it."""

    __tablename__ = "projects"
    __table_args__ = (
        CheckConstraint(
            "spend_limit_window IN ('day', 'week', 'month')", name="spend_limit_window"
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    spend_limit_microcents: Mapped[int | None] = mapped_column(BigInteger)
    spend_limit_window: Mapped[str] = mapped_column(
        String(8), default="month", server_default="month"
    )
    # false = every model of its account; true = the models of ``project_models`` (∩ the
    # account's).
    restricts_models: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ProjectModel(Base):
    """A model a project that restricts its models names."""

    __tablename__ = "project_models"
    __table_args__ = (PrimaryKeyConstraint("project_id", "model_id"),)

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id"))


class Member(Base):
    """A person of an account: signs in to the portal with a role, owns keys, may be limited."""

    __tablename__ = "members"
    __table_args__ = (
        CheckConstraint("role IN ('viewer', 'developer', 'admin')", name="role"),
        CheckConstraint(
            "spend_limit_window IN ('day', 'week', 'month')", name="spend_limit_window"
        ),
        # An address names one member of an account at a time (of any case: ``email_key``).
        Index(
            "uq_members_account_id_email_key",
            "account_id",
            "email_key",
            unique=True,
            sqlite_where=text("removed_at IS NULL"),
            postgresql_where=text("removed_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    email: Mapped[str] = mapped_column(String(320))
    # The address in lower case (indexed alone too: the sign-in page finds its members by it).
    email_key: Mapped[str] = mapped_column(String(320), index=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    spend_limit_microcents: Mapped[int | None] = mapped_column(BigInteger)
    spend_limit_window: Mapped[str] = mapped_column(
        String(8), default="month", server_default="month"
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AccountModel(Base):
    """A model an account that restricts its models may use (private models included)."""

    __tablename__ = "account_models"
    __table_args__ = (PrimaryKeyConstraint("account_id", "model_id"),)

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id"))


class ApiKeyModel(Base):
    """A model a key that restricts its models names (it grants it only while its account
    sees the model too)."""

    __tablename__ = "api_key_models"
    __table_args__ = (PrimaryKeyConstraint("api_key_id", "model_id"),)

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id"))
