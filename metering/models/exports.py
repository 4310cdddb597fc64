"""Daily usage exports: each day's export state (also the lock row two schedulers contend for)
and the record of every export run."""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import BigInteger, CheckConstraint, Date, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, BigIntPK, UTCDateTime
from metering.states.exports import DAY_STATUS_CHECK, RUN_STATUS_CHECK


class ExportDay(Base):
    """One UTC day's export state. A run locks this row (``FOR UPDATE SKIP LOCKED`` on
    PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` serialises) for its whole transaction, so two
    schedulers never export the same day at once.

    ``newest_event_id`` and ``requests`` are what the last successful whole-day export included;
    a day whose rollups now show other values received late events and is exported again."""

    __tablename__ = "export_days"
    __table_args__ = (CheckConstraint(DAY_STATUS_CHECK, name="status"),)

    export_date: Mapped[date] = mapped_column(Date, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    newest_event_id: Mapped[int | None] = mapped_column(BigInteger)
    requests: Mapped[int | None] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    exported_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # When the day's credit roll-forward (credits.csv/.parquet) was last written.
    credits_exported_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ExportRun(Base):
    """One export attempt, successful or not (append-only): what ran, where, when, and why it
    failed."""

    __tablename__ = "export_runs"
    __table_args__ = (
        CheckConstraint(RUN_STATUS_CHECK, name="status"),
        CheckConstraint("trigger IN ('scheduled', 'manual')", name="trigger"),
        Index("ix_export_runs_export_date_id", "export_date", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    export_date: Mapped[date] = mapped_column(Date)
    account_id: Mapped[str | None] = mapped_column(String(32))  # null: every account of the day
    trigger: Mapped[str] = mapped_column(String(16))
    runner: Mapped[str] = mapped_column(String(200))  # host:pid
    status: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime)
    newest_event_id: Mapped[int | None] = mapped_column(BigInteger)
    requests: Mapped[int | None] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
