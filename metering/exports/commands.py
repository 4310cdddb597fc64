"""``metering export``: export UTC days by hand (backfills, or a re-run after a fix)."""

from __future__ import annotations

import sys
from datetime import date, timedelta

from metering.db import Database
from metering.exports.service import EXPORTED, FAILED, Exporter, first_due_cutoff
from metering.kit.clock import SystemClock
from metering.settings import Settings

MAX_DAYS = 3660


def days_between(first: date, last: date) -> list[date]:
    return [first + timedelta(days=offset) for offset in range((last - first).days + 1)]


def export(
    settings: Settings,
    day: date | None,
    first: date | None,
    last: date | None,
    account_id: str | None,
) -> int:
    """Export each day (every account, or one); 0 when all succeeded, 1 when one failed, 2 for
    a bad request (no day, a reversed range, a day that has not ended yet)."""
    if day is not None:
        days = [day]
    elif first is not None and last is not None:
        if last < first:
            print("--to must not be before --from", file=sys.stderr)
            return 2
        days = days_between(first, last)
        if len(days) > MAX_DAYS:
            print(f"at most {MAX_DAYS} days at once", file=sys.stderr)
            return 2
    else:
        print("give --date D, or --from D1 --to D2", file=sys.stderr)
        return 2
    clock = SystemClock()
    # Only complete days are exported: a day that is still running would be a partial export.
    ended_before = first_due_cutoff(clock.now(), timedelta(0)).date()
    if days[-1] >= ended_before:
        print(
            f"{days[-1]} has not ended yet (UTC); the last day to export is "
            f"{ended_before - timedelta(days=1)}",
            file=sys.stderr,
        )
        return 2
    database = Database.from_url(settings.effective_database_url, pool_size=2)
    exporter = Exporter(database, settings.export_dir, clock)
    failed = exported = 0
    try:
        for each in days:
            result = exporter.export_day(each, account_id=account_id, trigger="manual", wait=True)
            print(result.describe(), file=sys.stderr if result.outcome == FAILED else sys.stdout)
            failed += result.outcome == FAILED
            exported += result.outcome == EXPORTED
    finally:
        database.dispose()
    target = settings.export_dir.resolve()
    print(
        f"{exported} of {len(days)} days exported to {target}"
        + (f", {failed} failed" if failed else "")
    )
    return 1 if failed else 0
