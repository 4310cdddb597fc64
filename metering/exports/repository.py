"""The queries exports run: a day's '1d' key_model rollup rows (never the raw events), what
each ended day holds now, and the export state rows.

Exports are the one cross-account reader: a day's export covers every account with usage that
day, so these queries filter by day (and by account where one is asked for), not always by
account."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, and_, cast, func, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from metering import citus
from metering.db import is_cluster
from metering.exports import rollforward
from metering.exports.files import AccountDay, Line, ordered
from metering.kit.timeutil import start_of_day
from metering.models import (
    Account,
    ApiKey,
    CreditRollforward,
    ExportDay,
    LedgerEntry,
    UsageRollup,
    table,
)
from metering.states.exports import ExportStatus

ROLLUPS = table(UsageRollup)
KEYS = table(ApiKey)
ACCOUNTS = table(Account)
DAYS = table(ExportDay)
ROLLFORWARD = table(CreditRollforward)
ENTRIES = table(LedgerEntry)


@dataclass(frozen=True, slots=True)
class DayMark:
    """What a day's rollups hold: the newest event counted (ingest order) and the number of
    requests. Both only grow; ``requests`` also catches a late event whose id is lower than
    one already counted (ids are taken in insert order, commits land in any order)."""

    newest_event_id: int
    requests: int


# The day rows of one grouping, written as constants: the condition of the partial index
# ix_usage_rollups_day_key_model, which a prepared statement's generic plan could not match
# with the values as parameters.
_DAY_ROWS = (
    ROLLUPS.c.bucket_width == literal_column("'1d'"),
    ROLLUPS.c.grouping == literal_column("'key_model'"),
)


def account_days(session: Session, day: date, account_id: str | None = None) -> list[AccountDay]:
    """Every account's usage of ``day`` (or one account's), one line per api key × model."""
    r = ROLLUPS.c
    conditions = [*_DAY_ROWS, r.bucket_start == start_of_day(day)]
    if account_id is not None:
        conditions.append(r.account_id == account_id)
    statement = (
        select(
            r.account_id,
            ACCOUNTS.c.billing,
            r.api_key_id,
            KEYS.c.name,
            r.model_id,
            r.requests,
            r.input_tokens,
            r.cache_read_tokens,
            r.output_tokens,
            r.reasoning_tokens,
            r.cost_microcents,
            r.last_event_id,
            KEYS.c.project_id,
            KEYS.c.member_id,
        )
        .join(ACCOUNTS, ACCOUNTS.c.id == r.account_id)
        .outerjoin(KEYS, and_(KEYS.c.id == r.api_key_id, KEYS.c.account_id == r.account_id))
        .where(*conditions)
    )
    by_account: dict[str, tuple[bool, list[Line]]] = {}
    for row in session.execute(statement):
        entry = by_account.setdefault(row.account_id, (row.billing != "unbilled", []))
        entry[1].append(
            Line(
                api_key_id=row.api_key_id,
                api_key_name=row.name or "",
                model=row.model_id,
                requests=int(row.requests),
                input_tokens=int(row.input_tokens),
                cache_read_tokens=int(row.cache_read_tokens),
                output_tokens=int(row.output_tokens),
                reasoning_tokens=int(row.reasoning_tokens),
                cost_microcents=int(row.cost_microcents),
                last_event_id=int(row.last_event_id),
                project_id=row.project_id,
                member_id=row.member_id,
            )
        )
    return [
        AccountDay(day, account, billed, ordered(lines))
        for account, (billed, lines) in sorted(by_account.items())
    ]


def mark_of(account_days_: Sequence[AccountDay]) -> DayMark:
    return DayMark(
        newest_event_id=max((a.newest_event_id for a in account_days_), default=0),
        requests=sum(a.requests for a in account_days_),
    )


def ended_day_marks(session: Session, before: datetime) -> dict[date, DayMark]:
    """Every day that starts before ``before`` and has usage, with what it holds now."""
    r = ROLLUPS.c
    statement = (
        select(
            r.bucket_start,
            cast(func.max(r.last_event_id), BigInteger),
            # PostgreSQL's SUM(bigint) is numeric; the cast keeps it a Python int.
            cast(func.sum(r.requests), BigInteger),
        )
        .where(*_DAY_ROWS, r.bucket_start < before)
        .group_by(r.bucket_start)
    )
    return {
        start.date(): DayMark(int(newest), int(requests))
        for start, newest, requests in session.execute(statement)
    }


def _exported(row: Any) -> DayMark | None:
    if row.newest_event_id is None or row.requests is None:
        return None
    return DayMark(int(row.newest_event_id), int(row.requests))


def exported_marks(session: Session) -> dict[date, DayMark | None]:
    """Each day's last successful whole-day export (None: never exported successfully)."""
    statement = select(DAYS.c.export_date, DAYS.c.newest_event_id, DAYS.c.requests)
    return {row.export_date: _exported(row) for row in session.execute(statement)}


def ensure_day_rows(session: Session, days: Sequence[date]) -> None:
    """The state rows the export runs lock (created once, in a short transaction of their own,
    so that creating them never waits for a running export)."""
    if not days:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(DAYS).on_conflict_do_nothing(index_elements=["export_date"])
    pending = ExportStatus.PENDING.value
    session.execute(statement, [{"export_date": d, "status": pending} for d in sorted(days)])


def lock_day(session: Session, day: date, *, wait: bool) -> bool:
    """Take the day's row lock for this transaction; False when another run holds it and
    ``wait`` is False. (SQLite has no row locks: its BEGIN IMMEDIATE already serialises.)
    On a Citus cluster, where ``export_days`` is a reference table, the day's advisory lock on
    the coordinator instead (``citus.lock``)."""
    if is_cluster(session):
        return citus.lock(session, citus.EXPORT_DAY_LOCK, day.toordinal(), wait=wait)
    statement = (
        select(DAYS.c.export_date)
        .where(DAYS.c.export_date == day)
        .with_for_update(skip_locked=not wait)
    )
    return session.execute(statement).first() is not None


def exported_mark(session: Session, day: date) -> DayMark | None:
    """What the day's last successful whole-day export included (None: never exported)."""
    row = session.execute(
        select(DAYS.c.newest_event_id, DAYS.c.requests).where(DAYS.c.export_date == day)
    ).first()
    return None if row is None else _exported(row)


def credit_days_due(session: Session, before: datetime) -> list[date]:
    """Days from the roll-forward's start that ended before ``before`` and need their credit
    roll-forward: never written, or an expiry dated in the day or before it written since (a
    late change: it moves that day's figures and the opening of every day after it)."""
    start = session.execute(select(ROLLFORWARD.c.start_date)).scalar()
    if start is None:
        return []
    written = {
        row.export_date: row.credits_exported_at
        for row in session.execute(
            select(DAYS.c.export_date, DAYS.c.credits_exported_at).where(
                DAYS.c.export_date >= start
            )
        )
    }
    late: dict[date, datetime] = {}
    oldest = min((at for at in written.values() if at is not None), default=None)
    if oldest is not None:
        for effective_at, created_at in session.execute(
            select(ENTRIES.c.effective_at, ENTRIES.c.created_at).where(
                ENTRIES.c.kind == "expiry", ENTRIES.c.created_at > oldest
            )
        ):
            day = effective_at.date()
            late[day] = max(late.get(day, created_at), created_at)
    due = []
    day = start
    # The latest late expiry dated on or before each day (its own day's and every earlier one's).
    latest: datetime | None = max((at for d, at in late.items() if d < start), default=None)
    while start_of_day(day) + timedelta(days=1) <= before:
        here = late.get(day)
        if here is not None and (latest is None or here > latest):
            latest = here
        if rollforward.is_due(start, day, written.get(day), latest):
            due.append(day)
        day += timedelta(days=1)
    return due


def mark_credits_exported(session: Session, day: date, at: datetime) -> None:
    session.execute(update(DAYS).where(DAYS.c.export_date == day).values(credits_exported_at=at))


def credits_on(session: Session, day: date) -> list[rollforward.Row] | None:
    """The day's roll-forward rows, or None before the roll-forward's start."""
    start = session.execute(select(ROLLFORWARD.c.start_date)).scalar()
    if start is None or day < start:
        return None
    return rollforward.rows_of_day(session, day)
