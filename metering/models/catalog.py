"""Models of the catalog, their effective-dated list prices and account rate overrides."""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, UTCDateTime


class CatalogModel(Base):
    __tablename__ = "catalog_models"
    __table_args__ = (
        CheckConstraint("context_length > 0", name="context_length_positive"),
        CheckConstraint(
            "max_output_tokens IS NULL OR max_output_tokens > 0", name="max_output_positive"
        ),
        CheckConstraint("reasoning_headroom_tokens >= 0", name="headroom_non_negative"),
    )

    id: Mapped[str] = mapped_column(String(100), primary_key=True)  # catalog spelling
    id_key: Mapped[str] = mapped_column(String(100), unique=True)  # lower-case, for lookups
    display_name: Mapped[str] = mapped_column(String(200))
    owned_by: Mapped[str] = mapped_column(String(100))
    context_length: Mapped[int] = mapped_column(Integer)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer)
    reasoning_headroom_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    hidden: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    deprecation_date: Mapped[date | None] = mapped_column(Date)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # As ``accounts.resolution_generation``, for what a resolution reads of the model: its row
    # and its list prices.
    resolution_generation: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


# The rates of a price (integer microcents per million tokens), in the order of
# metering.pricing.Rates: a priced component is one more name here and a column below.
RATE_COLUMNS = (
    "input_microcents_per_million",
    "output_microcents_per_million",
    "cache_read_microcents_per_million",
)
_RATES_NON_NEGATIVE = " AND ".join(f"{name} >= 0" for name in RATE_COLUMNS)


class PriceVersion(Base):
    """A list price in force on [effective_at, the next version's effective_at)."""

    __tablename__ = "price_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "effective_at"),
        CheckConstraint(_RATES_NON_NEGATIVE, name="rates_non_negative"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # price_…
    model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id"))
    effective_at: Mapped[datetime] = mapped_column(UTCDateTime)
    input_microcents_per_million: Mapped[int] = mapped_column(BigInteger)
    output_microcents_per_million: Mapped[int] = mapped_column(BigInteger)
    cache_read_microcents_per_million: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AccountRate(Base):
    """An account's override of list prices for one model; all-null rates end the override."""

    __tablename__ = "account_rates"
    __table_args__ = (
        UniqueConstraint("account_id", "model_id", "effective_at"),
        CheckConstraint(
            "("
            + " AND ".join(f"{name} IS NULL" for name in RATE_COLUMNS)
            + ") OR ("
            + " AND ".join(f"{name} IS NOT NULL" for name in RATE_COLUMNS)
            + ")",
            name="all_or_none",
        ),
        CheckConstraint(
            "input_microcents_per_million IS NULL OR (" + _RATES_NON_NEGATIVE + ")",
            name="rates_non_negative",
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # rate_…
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id"))
    effective_at: Mapped[datetime] = mapped_column(UTCDateTime)
    input_microcents_per_million: Mapped[int | None] = mapped_column(BigInteger)
    output_microcents_per_million: Mapped[int | None] = mapped_column(BigInteger)
    cache_read_microcents_per_million: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
