"""Exporting a UTC day: which days are due, and one day's export as one unit of work that
holds the day's lock from the first read to the recorded result.

A run: lock the day's ``export_days`` row (PostgreSQL ``FOR UPDATE SKIP LOCKED``: a second
scheduler skips the day instead of exporting it at the same time; SQLite's ``BEGIN IMMEDIATE``
serialises), read the day's '1d' key_model rollups, write each account's CSV and Parquet file
and then the manifest (each atomically), record the run and what it included, commit. A failure
rolls back to a savepoint, and the attempt is recorded with its error in the same transaction,
still under the lock; the day stays due, so the next tick retries it. Files are written before
the commit: a crash in between leaves correct files and a day still due, whose re-export writes
the same bytes.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from metering.db import Database
from metering.exports import files, repository, rollforward
from metering.exports.repository import DayMark
from metering.kit.clock import Clock
from metering.kit.timeutil import floor_day, start_of_day
from metering.models import ExportDay, ExportRun, table
from metering.notifications import outbox
from metering.states import exports as export_states
from metering.states.exports import ExportStatus

log = logging.getLogger("metering.exports")

DAYS = table(ExportDay)
RUNS = table(ExportRun)
MAX_ERROR_LENGTH = 2000
_ONE_DAY = timedelta(days=1)

EXPORTED, UNCHANGED, BUSY, EMPTY, FAILED = "exported", "unchanged", "busy", "empty", "failed"


@dataclass(frozen=True, slots=True)
class DayResult:
    day: date
    outcome: str  # exported | unchanged (nothing new since the last export) | busy | empty | failed
    accounts: int = 0
    files: int = 0
    mark: DayMark | None = None
    error: str | None = None

    def describe(self) -> str:
        if self.outcome == EXPORTED and self.mark is not None:
            return (
                f"{self.day}: exported {self.accounts} accounts, {self.files} files, "
                f"{self.mark.requests} requests, newest event {self.mark.newest_event_id}"
            )
        if self.outcome == FAILED:
            return f"{self.day}: failed: {self.error}"
        return {
            UNCHANGED: f"{self.day}: nothing new since its last export",
            BUSY: f"{self.day}: being exported by another run",
            EMPTY: f"{self.day}: no usage to export",
        }.get(self.outcome, f"{self.day}: {self.outcome}")


def runner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def first_due_cutoff(now: datetime, after: timedelta) -> datetime:
    """Days starting before this instant ended at least ``after`` ago."""
    return floor_day(now - after)


class Exporter:
    def __init__(
        self, database: Database, export_dir: Path, clock: Clock, runner: str | None = None
    ) -> None:
        self.database = database
        self.export_dir = export_dir
        self.clock = clock
        self.runner = runner or runner_name()

    def directory(self, day: date) -> Path:
        return self.export_dir / day.isoformat()

    def due_days(self, now: datetime, after: timedelta) -> list[date]:
        """Ended days (``after`` past their end) with usage that no successful export has
        included in full: never exported, last run failed, or late events since."""
        cutoff = first_due_cutoff(now, after)
        with self.database.reading() as session:
            current = repository.ended_day_marks(session, cutoff)
            exported = repository.exported_marks(session)
            credits = repository.credit_days_due(session, cutoff)
        usage = {day for day, mark in current.items() if exported.get(day) != mark}
        return sorted(usage | set(credits))

    def export_day(
        self,
        day: date,
        *,
        account_id: str | None = None,
        trigger: str = "manual",
        wait: bool = True,
    ) -> DayResult:
        """Export ``day`` (every account, or only ``account_id``). ``trigger="scheduled"`` skips
        a day with nothing new since its last export; ``wait=False`` skips a day another run
        holds (a scheduler tick), ``wait=True`` waits for it (the CLI)."""
        with self.database.unit_of_work() as session:
            repository.ensure_day_rows(session, [day])
            session.commit()
        with self.database.unit_of_work() as session:
            if not repository.lock_day(session, day, wait=wait):
                return DayResult(day, BUSY)
            started = self.clock.now()
            try:
                with session.begin_nested():
                    result = self._export_locked(session, day, account_id, trigger, started)
            except Exception as exc:
                log.exception("export of %s failed", day)
                error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH]
                self._record_failure(session, day, account_id, trigger, started, error)
                result = DayResult(day, FAILED, error=error)
            session.commit()
            return result

    def _export_locked(
        self,
        session: Session,
        day: date,
        account_id: str | None,
        trigger: str,
        started: datetime,
    ) -> DayResult:
        account_days = repository.account_days(session, day, account_id)
        mark = repository.mark_of(account_days)
        whole_day = account_id is None
        credits_due = day in repository.credit_days_due(session, start_of_day(day + _ONE_DAY))
        usage_due = repository.exported_mark(session, day) != mark
        if trigger == "scheduled" and not usage_due and not credits_due:
            return DayResult(day, UNCHANGED, mark=mark)  # another scheduler did it meanwhile
        credits = repository.credits_on(session, day)
        if not account_days and credits is None:
            return DayResult(day, EMPTY)

        directory = self.directory(day)
        directory.mkdir(parents=True, exist_ok=True)
        files.remove_stale_temp_files(directory)
        entries: list[dict[str, Any]] = []
        if not whole_day:
            # One account by hand: the other accounts' entries stay as the manifest has them.
            entries = [
                entry
                for entry in files.read_manifest_entries(directory)
                if entry.get("account_id") != account_id
            ]
        written = 0
        if credits is not None:
            # The roll-forward is always rewritten whole (also for one account by hand).
            entries = [e for e in entries if e.get("kind") != "credit_rollforward"]
            for name, file_format, content in (
                (rollforward.CSV_NAME, "csv", rollforward.csv_bytes(credits)),
                (rollforward.PARQUET_NAME, "parquet", rollforward.parquet_bytes(credits)),
            ):
                files.write_atomic(directory / name, content)
                entries.append(rollforward.manifest_entry(name, file_format, content, credits))
                written += 1
        for account_day in account_days:
            for rendered in files.render(account_day):
                files.write_atomic(directory / rendered.name, rendered.content)
                entries.append(rendered.manifest_entry())
                written += 1
        # Last, so a manifest never lists a file that is not there yet.
        manifest = files.manifest_bytes(day, entries, self.clock.now())
        files.write_atomic(directory / files.MANIFEST, manifest)
        finished = self.clock.now()
        if credits is not None:
            repository.mark_credits_exported(session, day, finished)
        if whole_day and account_days:
            session.execute(
                update(DAYS)
                .where(DAYS.c.export_date == day)
                .values(
                    status=export_states.target("export"),
                    newest_event_id=mark.newest_event_id,
                    requests=mark.requests,
                    attempts=DAYS.c.attempts + 1,
                    last_error=None,
                    last_attempt_at=started,
                    exported_at=finished,
                )
            )
        self._record_run(
            session,
            day,
            account_id,
            trigger,
            started,
            finished,
            status=ExportStatus.SUCCEEDED,
            mark=mark,
            written=written,
            error=None,
        )
        outbox.emit_export_completed(session, day, manifest, finished)
        return DayResult(day, EXPORTED, len(account_days), written, mark)

    def _record_failure(
        self,
        session: Session,
        day: date,
        account_id: str | None,
        trigger: str,
        started: datetime,
        error: str,
    ) -> None:
        if account_id is None:
            session.execute(
                update(DAYS)
                .where(DAYS.c.export_date == day)
                .values(
                    status=export_states.target("fail"),
                    attempts=DAYS.c.attempts + 1,
                    last_error=error,
                    last_attempt_at=started,
                )
            )
        finished = self.clock.now()
        self._record_run(
            session,
            day,
            account_id,
            trigger,
            started,
            finished,
            status=ExportStatus.FAILED,
            mark=None,
            written=0,
            error=error,
        )

    def _record_run(
        self,
        session: Session,
        day: date,
        account_id: str | None,
        trigger: str,
        started: datetime,
        finished: datetime,
        status: ExportStatus,
        mark: DayMark | None,
        written: int,
        error: str | None,
    ) -> None:
        session.execute(
            insert(RUNS).values(
                export_date=day,
                account_id=account_id,
                trigger=trigger,
                runner=self.runner[:200],
                status=status.value,
                started_at=started,
                finished_at=finished,
                newest_event_id=None if mark is None else mark.newest_event_id,
                requests=None if mark is None else mark.requests,
                files=written,
                error=error,
            )
        )
