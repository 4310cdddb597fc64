"""The audit log: every change an operator (or the CLI) made, append-only."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from metering.models.base import Base, BigIntPK, UTCDateTime


class AuditEvent(Base):
    """One change, written in the transaction that made it. Never updated or deleted: the
    migration adds triggers that refuse both, on either backend."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_account_id_seq", "account_id", "seq"),
        Index("ix_audit_events_at", "at"),
    )

    # The order of appending: the list is newest first by it (many events share an instant).
    seq: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)  # aud_…
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    actor: Mapped[str] = mapped_column(String(100))  # a token's name, or "cli"
    action: Mapped[str] = mapped_column(String(64))  # <resource>.<verb>
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(200))
    # Null for changes that belong to no account (the catalog, the quarantine).
    account_id: Mapped[str | None] = mapped_column(String(32))
    request_id: Mapped[str | None] = mapped_column(String(32))  # null for the CLI
    changes: Mapped[str] = mapped_column(Text)  # JSON object, secrets redacted
