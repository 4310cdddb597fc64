"""Several schedulers against one database never export the same day at once and never skip
one: a day being exported is skipped by the others (PostgreSQL row lock, SKIP LOCKED), and a
day another scheduler has just exported is not exported again. Threads on both backends, then
two real ``metering scheduler`` processes on PostgreSQL."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from metering.exports import files
from metering.kit.clock import FrozenClock
from metering.models import ExportDay, ExportRun
from metering.scheduler import Scheduler, TickReport
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, SECRET_KEY, Api, running_api
from tests.exports.helpers import (
    DAY,
    Tenant,
    expected_rows,
    manifest,
    midnight,
    read_csv,
    runs,
    send,
    sha256,
    tenant,
)
from tests.threads import Workers, workers

DAYS = [DAY - timedelta(days=offset) for offset in range(6)]
AFTER = midnight(DAY) + timedelta(days=1, hours=1)


def make_scheduler(api: Api, export_dir: Path, runner: str) -> Scheduler:
    settings = api.settings.model_copy(update={"export_dir": export_dir, "export_after_minutes": 0})
    return Scheduler(api.database, settings, FrozenClock(AFTER), runner=runner)


def usage_on_days(api: Api, accounts: int = 2) -> list[Tenant]:
    tenants = [tenant(api) for _ in range(accounts)]
    for t in tenants:
        for day in DAYS:
            for hour, key in ((3, t.keys[0]), (17, t.keys[1])):
                model = sorted(t.models)[hour % 2]
                send(api, t, key, model, midnight(day) + timedelta(hours=hour), 100 + hour, 7, 9)
    return tenants


def outcomes(report: TickReport) -> dict[date, str]:
    return {r.day: r.outcome for r in report.exports}


def all_runs(api: Api) -> list[ExportRun]:
    with api.database.unit_of_work() as session:
        return list(session.execute(select(ExportRun).order_by(ExportRun.id)).scalars())


def assert_no_overlap(found: list[ExportRun]) -> None:
    """Runs of the same day never overlap in time: each started after the previous finished."""
    by_day: dict[date, list[ExportRun]] = {}
    for run in found:
        by_day.setdefault(run.export_date, []).append(run)
    for day_runs in by_day.values():
        day_runs.sort(key=lambda r: r.started_at)
        for earlier, later in itertools.pairwise(day_runs):
            assert later.started_at >= earlier.finished_at, (earlier, later)


def assert_files_match(api: Api, export_dir: Path, tenants: list[Tenant]) -> None:
    for day in DAYS:
        directory = export_dir / day.isoformat()
        body = manifest(directory)
        assert len(body["files"]) == 2 * len(tenants)
        for entry in body["files"]:
            assert entry["sha256"] == sha256(directory / entry["file"])
        for t in tenants:
            assert read_csv(directory / f"{t.account_id}.csv")[1:] == expected_rows(t, day)


def test_concurrent_ticks_export_each_day_once(fresh_api: Api, tmp_path: Path) -> None:
    api = fresh_api
    tenants = usage_on_days(api)
    export_dir = tmp_path / "exports"
    schedulers = [make_scheduler(api, export_dir, f"s{n}") for n in range(2)]
    barrier = threading.Barrier(len(schedulers))
    reports: list[TickReport] = []

    def tick(jobs: Scheduler) -> None:
        barrier.wait(10)
        reports.append(jobs.tick())

    with workers(60) as pool:
        for jobs in schedulers:
            pool.start(tick, jobs)
    assert len(reports) == 2 and all(r.ok for r in reports)
    exported = Counter(
        d for r in reports for d, outcome in outcomes(r).items() if outcome == "exported"
    )
    assert exported == Counter(DAYS)  # each day exactly once, between the two
    found = all_runs(api)
    assert Counter(r.export_date for r in found) == Counter(DAYS)
    assert_no_overlap(found)
    assert_files_match(api, export_dir, tenants)
    assert all(outcomes(jobs.tick()) == {} for jobs in schedulers)


@pytest.mark.pg_only
def test_a_day_being_exported_is_skipped_not_exported_twice(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one scheduler holds a day (its export paused mid-way), another skips that day;
    once the first commits, the day is not due any more."""
    with running_api("postgresql", pg_url, tmp_path) as api:
        t = tenant(api)
        send(api, t, t.keys[0], sorted(t.models)[0], midnight(DAY) + timedelta(hours=2))
        export_dir = tmp_path / "exports"
        first, second = (make_scheduler(api, export_dir, name) for name in ("first", "second"))
        inside, release = threading.Event(), threading.Event()
        write = files.write_atomic

        def paused_write(path: Path, content: bytes) -> bool:
            if threading.current_thread().name == "first":
                inside.set()
                assert release.wait(30)
            return write(path, content)

        monkeypatch.setattr(files, "write_atomic", paused_write)
        reports: list[TickReport] = []
        pool = Workers()
        pool.start(lambda: reports.append(first.tick()), name="first")
        try:
            assert inside.wait(30)
            assert outcomes(second.tick()) == {DAY: "busy"}
            assert runs(api, DAY) == []
        finally:
            release.set()
            pool.join(30)
        assert outcomes(reports[0]) == {DAY: "exported"}
        assert outcomes(second.tick()) == {}
        assert [(r.runner, r.status) for r in runs(api, DAY)] == [("first", "succeeded")]


def _scheduler_process(database_url: str, export_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": database_url,
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_EXPORT_DIR": str(export_dir),
            "METERING_EXPORT_AFTER_MINUTES": "0",
            "METERING_LOG_LEVEL": "INFO",
        }
    )
    command = [sys.executable, "-m", "metering.cli", "scheduler", "--interval", "0.2"]
    return subprocess.Popen(
        command,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for(
    condition: Callable[[], bool], what: str, logs: list[Path], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    text = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
    pytest.fail(f"timed out waiting for {what}; scheduler logs:\n{text}")


def _day_requests(api: Api) -> dict[date, Any]:
    with api.database.unit_of_work() as session:
        return dict(
            session.execute(
                select(ExportDay.export_date, ExportDay.requests).where(
                    ExportDay.status == "succeeded"
                )
            ).all()
        )


@pytest.mark.pg_only
def test_two_scheduler_processes_export_each_day_exactly_once(pg_url: str, tmp_path: Path) -> None:
    with running_api("postgresql", pg_url, tmp_path) as api:
        tenants = usage_on_days(api, accounts=3)
        export_dir = tmp_path / "exports"
        logs = [tmp_path / f"scheduler{n}.log" for n in range(2)]
        processes = [_scheduler_process(pg_url, export_dir, log) for log in logs]
        try:
            _wait_for(lambda: set(_day_requests(api)) >= set(DAYS), "every day exported", logs)
            # Late events for two days, while both schedulers keep ticking.
            late_days = (DAYS[1], DAYS[4])
            seen = _day_requests(api)
            for day in late_days:
                t = tenants[0]
                send(api, t, t.keys[1], sorted(t.models)[0], midnight(day) + timedelta(hours=23))
            _wait_for(
                lambda: all(_day_requests(api)[d] == seen[d] + 1 for d in late_days),
                "the late days exported again",
                logs,
            )
            time.sleep(1)  # several more ticks of both: nothing else may happen
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            for process in processes:
                process.wait(20)
        found = all_runs(api)
        assert {r.status for r in found} == {"succeeded"}
        expected_counts = Counter({day: 2 if day in late_days else 1 for day in DAYS})
        assert Counter(r.export_date for r in found) == expected_counts
        assert {r.runner.rsplit(":", 1)[1] for r in found} <= {str(p.pid) for p in processes}
        assert_no_overlap(found)
        assert_files_match(api, export_dir, tenants)
        for process in processes:
            assert process.returncode == 0, [log.read_text() for log in logs]
