"""``metering scheduler``: the process that runs the periodic jobs, on APScheduler 3.

One interval job, the tick (every minute by default), decides what is due from the database
alone, so a restart, a crash or a second replica never misses or repeats work:

* tidy-up: holds past their expiry are marked 'expired' (nothing depends on it: an active hold
  stops counting at its ``expires_at`` anyway), and those that expired unused are announced
  (``authorization.expired_unused``);
* portal: sessions that are over, sign-in links that can no longer be used and sign-in mails
  past their hour are deleted;
* exports: every ended day (``METERING_EXPORT_AFTER_MINUTES`` past its end) whose rollups hold
  more than its last successful export included: never exported, failed, or late events since.

A second job, every second, is the webhook delivery loop (metering.notifications.delivery); a
third, every 2 seconds while payments are on, charges the auto-recharges due
(metering.payments.recharge); a fourth, every second while ``METERING_SMTP_URL`` is set, sends
the portal's sign-in mails (metering.portal.mail).

Replicas coordinate through the database (the day's row lock, see ``metering.exports.service``),
never through process memory.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from metering import citus
from metering.db import Database, Kind
from metering.exports.service import FAILED, DayResult, Exporter
from metering.kit.clock import Clock
from metering.kit.timeutil import format_timestamp
from metering.notifications.addresses import Resolver
from metering.notifications.delivery import Deliverer, PassReport
from metering.settings import Settings

log = logging.getLogger("metering.scheduler")

DEFAULT_INTERVAL_SECONDS = 60.0
EXPIRY_BATCH = 100  # accounts per transaction when the scheduler writes due grant expiries
WEBHOOK_INTERVAL_SECONDS = 1.0  # due messages are looked for every second
RECHARGE_INTERVAL_SECONDS = 2.0  # due auto-recharges are looked for every 2 seconds
MAIL_INTERVAL_SECONDS = 1.0  # the portal's sign-in mails are looked for every second


@dataclass
class TickReport:
    at: datetime
    expired_holds: int | None = None  # None: the tidy-up failed (logged)
    expiry_accounts: int | None = None  # accounts whose due grant expiries were written
    expiring_grants: int | None = None  # credit.grant_expiring events written
    portal_deleted: tuple[int, int] | None = None  # (portal sessions, sign-in links) deleted
    mails_deleted: int | None = None  # sign-in mails past their hour, deleted
    payments_moved: int | None = None  # pending payments Stripe's answer moved (payments on)
    exports: list[DayResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.outcome != FAILED for r in self.exports)


T = TypeVar("T")


def _guarded(report: TickReport | None, job: str, failure: str, work: Callable[[], T]) -> T | None:
    """One job: its result, or None when it raised (logged as ``failure`` with its traceback,
    and noted in the tick's report under ``job``), so a failing job never stops the others;
    each is retried on the next tick (or delivery pass)."""
    try:
        return work()
    except Exception as exc:
        log.exception("%s", failure)
        if report is not None:
            report.errors.append(f"{job}: {type(exc).__name__}: {exc}")
        return None


class Scheduler:
    """The jobs of one tick; the clock is injectable so tests can move time."""

    def __init__(
        self,
        database: Database,
        settings: Settings,
        clock: Clock,
        *,
        heartbeat: Path | None = None,
        runner: str | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.database = database
        self.clock = clock
        self.after = timedelta(minutes=settings.export_after_minutes)
        self.grant_notice = timedelta(days=settings.grant_notice_days)
        self.exporter = Exporter(database, settings.export_dir, clock, runner)
        self.heartbeat = heartbeat
        self.settings = settings
        self.deliverer: Deliverer | None = None
        if settings.secret_key:
            self.deliverer = Deliverer(database, settings, clock, resolver=resolver)
        else:
            log.error("METERING_SECRET_KEY is not set: webhooks are not delivered")

    def deliver(self) -> PassReport | None:
        """One pass of the webhook delivery loop (every second)."""
        if self.deliverer is None:
            return None
        failure = "webhook delivery pass failed (retried in a second)"
        return _guarded(None, "webhooks", failure, self.deliverer.run_once)

    def recharge(self) -> int | None:
        """One pass of the auto-recharge loop (every 2 seconds while payments are on)."""
        if not self.settings.payments_on:
            return None
        from metering.payments.recharge import Recharger

        recharger = Recharger(self.database, self.settings, self.clock)
        failure = "auto-recharge pass failed (retried in 2 seconds)"
        return _guarded(None, "auto-recharge", failure, recharger.run_once)

    def mail(self) -> int | None:
        """One pass of the sign-in mails (every second while METERING_SMTP_URL is set): how
        many were sent."""
        if not self.settings.mail_on:
            return None
        from metering.portal.mail import Mailer

        mailer = Mailer(self.database, self.settings, self.clock)
        failure = "sign-in mail pass failed (retried in a second)"
        return _guarded(None, "mail", failure, mailer.run_once)

    def close(self) -> None:
        if self.deliverer is not None:
            self.deliverer.close()

    def tick(self) -> TickReport:
        now = self.clock.now()
        report = TickReport(now)
        report.expired_holds = self._expire_holds(now, report)
        # Before any export: every grant expiry due by now (so by the end of each day due for
        # export) is a ledger entry by then.
        report.expiry_accounts = self._write_expiries(now, report)
        report.expiring_grants = self._notice_expiring(now, report)
        report.portal_deleted = self._tidy_portal(now, report)
        report.mails_deleted = self._tidy_mails(now, report)
        report.payments_moved = self._reconcile_payments(report)
        due = _guarded(
            report,
            "due days",
            "could not find the days due for export",
            lambda: self.exporter.due_days(now, self.after),
        )
        for day in due or []:
            # A failed export is recorded as such (a result); this is a failure that could not
            # even be recorded (database down).
            result = _guarded(
                report,
                str(day),
                f"export of {day} failed and could not be recorded",
                partial(self.exporter.export_day, day, trigger="scheduled", wait=False),
            )
            if result is None:
                continue
            report.exports.append(result)
            if result.outcome == FAILED:
                log.error("%s (retried on the next tick)", result.describe())
            else:
                log.info("%s", result.describe())
        self._beat(now)
        return report

    def _reconcile_payments(self, report: TickReport) -> int | None:
        """Payments and operators' refunds pending for 5 minutes or more, asked of Stripe
        (metering.payments.flows, metering.payments.refunds)."""
        if not self.settings.payments_on:
            return None
        from metering.payments import refunds
        from metering.payments.flows import Payments

        def work() -> int:
            payments = Payments(self.database, self.settings, self.clock)
            moved = payments.reconcile() + refunds.reconcile(payments)
            if moved:
                log.info("reconciled %d pending payments and refunds with Stripe", moved)
            return moved

        return _guarded(report, "payments", "reconciling pending payments failed", work)

    def _expire_holds(self, now: datetime, report: TickReport) -> int | None:
        from metering.ledger.authorizations import (
            expire_holds,
            notice_expired_unused,
            tidy_up_accounts,
        )

        def work() -> int:
            accounts = citus.per_account(
                self.database, lambda session: tidy_up_accounts(session, now)
            )
            expired = 0
            for account in accounts:
                with self.database.unit_of_work() as session:
                    expired += expire_holds(session, now, account)
                    notice_expired_unused(session, now, account_id=account)
                    session.commit()
            if expired:
                log.info("marked %d expired holds", expired)
            return expired

        return _guarded(report, "expire holds", "tidy-up of expired holds failed", work)

    def _write_expiries(self, now: datetime, report: TickReport) -> int | None:
        from metering.ledger.credit_grants import accounts_with_due_expiries
        from metering.ledger.spending import spend

        def work() -> int:
            with self.database.reading() as session:
                accounts = accounts_with_due_expiries(session, now)
            # On a cluster, one account per transaction (each on its own shard).
            batch_size = 1 if self.database.kind is Kind.CITUS else EXPIRY_BATCH
            for start in range(0, len(accounts), batch_size):
                batch = accounts[start : start + batch_size]
                with self.database.unit_of_work() as session:
                    spend(session, dict.fromkeys(batch, 0), now)
                    session.commit()
            if accounts:
                log.info("wrote due grant expiries of %d accounts", len(accounts))
            return len(accounts)

        return _guarded(report, "grant expiries", "writing due grant expiries failed", work)

    def _notice_expiring(self, now: datetime, report: TickReport) -> int | None:
        from metering.ledger.credit_grants import expiring_accounts, notice_expiring

        def work() -> int:
            notice = self.grant_notice
            accounts = citus.per_account(
                self.database, lambda session: expiring_accounts(session, now, notice)
            )
            written = 0
            for account in accounts:
                with self.database.unit_of_work() as session:
                    written += notice_expiring(session, now, notice, account_id=account)
                    session.commit()
            return written

        failure = "writing credit.grant_expiring events failed"
        return _guarded(report, "expiring grants", failure, work)

    def _tidy_portal(self, now: datetime, report: TickReport) -> tuple[int, int] | None:
        from metering.portal.sessions import delete_finished

        def work() -> tuple[int, int]:
            with self.database.unit_of_work() as session:
                deleted = delete_finished(session, now)
                session.commit()
            return deleted

        failure = "deleting finished portal sessions and links failed"
        return _guarded(report, "portal sessions", failure, work)

    def _tidy_mails(self, now: datetime, report: TickReport) -> int | None:
        from metering.portal.mail import delete_finished

        def work() -> int:
            with self.database.unit_of_work() as session:
                deleted = delete_finished(session, now)
                session.commit()
            return deleted

        return _guarded(report, "portal mails", "deleting finished sign-in mails failed", work)

    def _beat(self, now: datetime) -> None:
        """The heartbeat file a container healthcheck reads: rewritten after every tick."""
        if self.heartbeat is None:
            return
        try:
            self.heartbeat.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.heartbeat.parent, prefix=".heartbeat.")
            with os.fdopen(fd, "w") as handle:
                handle.write(format_timestamp(now) + "\n")
            os.replace(temp, self.heartbeat)
        except OSError:
            log.exception("could not write the heartbeat file %s", self.heartbeat)


def _add_tick(apscheduler: Any, scheduler: Scheduler, interval_seconds: float) -> None:
    grace = max(1, int(interval_seconds))
    _every(apscheduler, scheduler.tick, interval_seconds, "tick", "exports and tidy-up", grace)
    _every(apscheduler, scheduler.deliver, WEBHOOK_INTERVAL_SECONDS, "webhooks", "webhook delivery")
    if scheduler.settings.payments_on:
        _every(
            apscheduler, scheduler.recharge, RECHARGE_INTERVAL_SECONDS, "recharges", "auto-recharge"
        )
    if scheduler.settings.mail_on:
        _every(apscheduler, scheduler.mail, MAIL_INTERVAL_SECONDS, "mail", "sign-in mails")


def _every(
    apscheduler: Any, job: Callable[[], object], seconds: float, id: str, name: str, grace: int = 5
) -> None:
    """``job`` every ``seconds`` (the first run at once), one run at a time; a run late by more
    than ``grace`` seconds is skipped, and missed runs are coalesced into one."""
    from apscheduler.triggers.interval import IntervalTrigger

    apscheduler.add_job(
        job,
        IntervalTrigger(seconds=seconds, timezone=UTC),
        id=id,
        name=name,
        next_run_time=datetime.now(UTC),
        max_instances=1,  # a slow run delays the next one; it never runs twice at once
        coalesce=True,
        misfire_grace_time=grace,
    )


def run(scheduler: Scheduler, interval_seconds: float = DEFAULT_INTERVAL_SECONDS) -> None:
    """Block, ticking every ``interval_seconds`` (the first tick at once) until SIGTERM/SIGINT."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    blocking = BlockingScheduler(timezone=UTC)
    _add_tick(blocking, scheduler, interval_seconds)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping after the current tick", signum)
        # wait: the jobs running (a tick, a delivery pass that has sent and is recording) finish
        # and commit first, so a stop never leaves sent messages recorded as pending.
        blocking.shutdown(wait=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("scheduler started: a tick every %ss", interval_seconds)
    blocking.start()


class EmbeddedScheduler:
    """The scheduler's jobs inside ``metering serve`` on the embedded database
    (docs/operations.md#scheduler-and-exports): one thread in the command's own process, which is
    the server with one worker and the workers' supervisor with several, so the jobs run once
    whatever ``--workers`` says."""

    def __init__(self, settings: Settings, interval_seconds: float) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        from metering.kit.clock import SystemClock

        logging.getLogger("apscheduler").setLevel(logging.WARNING)  # not a line per tick
        from metering.runtime import with_secret_key

        settings = with_secret_key(settings)  # the embedded default's generated secret key
        self.database = Database.from_url(settings.effective_database_url, pool_size=2)
        self.background = BackgroundScheduler(timezone=UTC, daemon=True)
        self.scheduler = Scheduler(self.database, settings, SystemClock())
        _add_tick(self.background, self.scheduler, interval_seconds)
        self.interval_seconds = interval_seconds

    def start(self) -> None:
        self.background.start()
        log.info("scheduler started in the server process: a tick every %ss", self.interval_seconds)

    def stop(self) -> None:
        self.background.shutdown(wait=True)
        self.scheduler.close()
        self.database.dispose()


def command(settings: Settings, interval_seconds: float, once: bool, heartbeat: Path | None) -> int:
    """``metering scheduler``: tick forever (or ``--once``, exiting 1 when something failed)."""
    from metering.kit.clock import SystemClock
    from metering.runtime import configure_logging

    configure_logging(settings.log_level)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # not a line per tick
    from metering.runtime import with_secret_key

    settings = with_secret_key(settings)  # the embedded default's generated secret key
    database = Database.from_url(settings.effective_database_url, pool_size=2)
    scheduler = None
    try:
        scheduler = Scheduler(database, settings, SystemClock(), heartbeat=heartbeat)
        if once:
            ok = scheduler.tick().ok
            scheduler.recharge()
            scheduler.deliver()
            scheduler.mail()
            return 0 if ok else 1
        run(scheduler, interval_seconds)
    finally:
        if scheduler is not None:
            scheduler.close()
        database.dispose()
    return 0
