"""Accounts and their API keys."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, UTCDateTime


class Account(Base):
    __tablename__ = "accounts"
    __table_args__ = (CheckConstraint("billing IN ('prepaid', 'unbilled')", name="billing"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    billing: Mapped[str] = mapped_column(String(16))
    # grants + adjustments − charges; moved only together with a ledger entry, in one transaction.
    balance_microcents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The sum of the estimates of the account's holds with ``counted`` set: what the check-and-
    # hold compares with the balance, in O(1). Moved only under the account's row lock, by the
    # check-and-hold itself, which first stops counting the holds released since (see
    # metering.ledger.placement). ``GET /v1/credits`` sums the holds in force instead.
    held_microcents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # §11: ``credit.balance_low`` fires when a transaction takes the balance below it.
    low_balance_threshold_microcents: Mapped[int | None] = mapped_column(BigInteger)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)  # hex SHA-256 of the secret
    monthly_spend_limit_microcents: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
