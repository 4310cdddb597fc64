"""The scheduler's tick on SQLite and PostgreSQL with an injected clock: a day is exported once
it has ended (plus the configured delay), once; late events export it again; a failed run is
recorded and retried on the next tick; expired holds are tidied up."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import update

from metering.kit.clock import FrozenClock
from metering.models import ExportDay
from metering.scheduler import Scheduler
from tests.conftest import NOW, Api
from tests.exports.helpers import (
    DAY,
    day_state,
    expected_rows,
    manifest,
    midnight,
    read_csv,
    runs,
    send,
    sha256,
    tenant,
)

START = midnight(DAY)
END = START + timedelta(days=1)
BEFORE = DAY - timedelta(days=1)


def scheduler(api: Api, export_dir: Path, at: datetime) -> tuple[Scheduler, FrozenClock]:
    clock = FrozenClock(at)
    settings = api.settings.model_copy(
        update={"export_dir": export_dir, "export_after_minutes": 15}
    )
    return Scheduler(api.database, settings, clock, runner="test"), clock


def exported(report: object) -> list[tuple[object, str]]:
    return [(r.day, r.outcome) for r in report.exports]  # type: ignore[attr-defined]


def test_each_ended_day_is_exported_once_and_again_after_late_events(
    fresh_api: Api, tmp_path: Path
) -> None:
    api = fresh_api
    t = tenant(api)
    prod, ci = t.keys
    glm, odd = sorted(t.models)
    send(api, t, prod, glm, midnight(BEFORE) + timedelta(hours=6), 100, 0, 10)
    send(api, t, prod, glm, START + timedelta(hours=1), 2000, 500, 300, 100)
    send(api, t, ci, odd, END - timedelta(seconds=1), 10, 0, 1)
    send(api, t, ci, odd, END, 10, 0, 1)  # today: never exported before it ends
    jobs, clock = scheduler(api, tmp_path / "exports", END + timedelta(minutes=14))

    # 14 minutes after the day ended: only the day before is due.
    assert exported(jobs.tick()) == [(BEFORE, "exported")]
    clock.set(END + timedelta(minutes=15))
    assert exported(jobs.tick()) == [(DAY, "exported")]
    assert exported(jobs.tick()) == []  # nothing new: nothing to do
    directory = tmp_path / "exports" / DAY.isoformat()
    first = manifest(directory)
    before_mtime = (tmp_path / "exports" / BEFORE.isoformat() / f"{t.account_id}.csv").stat()

    # A late event for the day (a gateway's spool replayed hours later).
    clock.set(END + timedelta(hours=3))
    send(api, t, prod, odd, START + timedelta(hours=20), 777, 77, 7, 0)
    assert exported(jobs.tick()) == [(DAY, "exported")]
    assert read_csv(directory / f"{t.account_id}.csv")[1:] == expected_rows(t, DAY)
    second = manifest(directory)
    assert second["newest_event_id"] > first["newest_event_id"]
    for entry in second["files"]:
        assert entry["sha256"] == sha256(directory / entry["file"])
    assert [(r.status, r.trigger) for r in runs(api, DAY)] == [("succeeded", "scheduled")] * 2
    assert len(runs(api, BEFORE)) == 1
    after_mtime = (tmp_path / "exports" / BEFORE.isoformat() / f"{t.account_id}.csv").stat()
    assert after_mtime.st_mtime_ns == before_mtime.st_mtime_ns
    assert exported(jobs.tick()) == []
    state = day_state(api, DAY)
    assert state is not None and (state.status, state.attempts) == ("succeeded", 2)


def test_a_late_event_below_the_newest_id_seen_is_caught_by_the_request_count(
    fresh_api: Api, tmp_path: Path
) -> None:
    """Event ids are taken in insert order but commits land in any order: an export can see
    id 101 before id 100 commits. The day's request count still tells it is stale."""
    api = fresh_api
    t = tenant(api)
    send(api, t, t.keys[0], sorted(t.models)[0], START + timedelta(hours=1))
    jobs, _ = scheduler(api, tmp_path / "exports", END + timedelta(hours=1))
    assert exported(jobs.tick()) == [(DAY, "exported")]
    with api.database.unit_of_work() as session:  # as if one event had not committed yet
        session.execute(
            update(ExportDay)
            .where(ExportDay.export_date == DAY)
            .values(requests=ExportDay.requests - 1)
        )
        session.commit()
    assert exported(jobs.tick()) == [(DAY, "exported")]
    assert exported(jobs.tick()) == []


def test_a_failed_run_is_recorded_and_retried_on_the_next_tick(
    fresh_api: Api, tmp_path: Path
) -> None:
    api = fresh_api
    t = tenant(api)
    send(api, t, t.keys[0], sorted(t.models)[0], START + timedelta(hours=1))
    blocker = tmp_path / "exports"
    blocker.write_text("a file where the export directory should be")
    jobs, clock = scheduler(api, blocker, END + timedelta(hours=1))

    report = jobs.tick()
    assert exported(report) == [(DAY, "failed")] and not report.ok
    state = day_state(api, DAY)
    assert state is not None
    assert (state.status, state.attempts, state.newest_event_id) == ("failed", 1, None)
    assert state.last_error and "exports" in state.last_error
    (failed,) = runs(api, DAY)
    assert (failed.status, failed.error) == ("failed", state.last_error)

    blocker.unlink()
    clock.advance(minutes=1)
    assert exported(jobs.tick()) == [(DAY, "exported")]
    state = day_state(api, DAY)
    assert state is not None
    assert (state.status, state.attempts, state.last_error) == ("succeeded", 2, None)
    assert [r.status for r in runs(api, DAY)] == ["failed", "succeeded"]
    assert read_csv(blocker / DAY.isoformat() / f"{t.account_id}.csv")[1:] == expected_rows(t, DAY)


def test_the_tick_marks_expired_holds(fresh_api: Api, tmp_path: Path) -> None:
    api = fresh_api
    t = tenant(api)
    granted = api.admin(
        "POST",
        f"/admin/v1/accounts/{t.account_id}/grants",
        json={"amount_cents": 1000, "idempotency_key": "g1", "note": "test"},
    )
    assert granted.status_code in (200, 201), granted.text
    hold = api.gateway(
        "POST",
        "/v1/authorizations",
        json={
            "api_key": t.keys[0].secret,
            "model": sorted(t.models)[0],
            "api": "chat_completions",
            "prompt_tokens": 100,
            "max_tokens": 10,
        },
    )
    assert hold.status_code == 200, hold.text
    jobs, clock = scheduler(api, tmp_path / "exports", NOW + timedelta(minutes=30))
    assert jobs.tick().expired_holds == 0
    clock.set(NOW + timedelta(hours=2))
    assert jobs.tick().expired_holds == 1
    listed = api.admin(
        "GET", "/admin/v1/authorizations", params={"account_id": t.account_id, "status": "expired"}
    )
    assert listed.status_code == 200, listed.text
    assert [(h["id"], h["status"]) for h in listed.json()["data"]] == [
        (hold.json()["id"], "expired")
    ]
    assert jobs.tick().expired_holds == 0


def test_the_tick_writes_due_grant_expiries(fresh_api: Api, tmp_path: Path) -> None:
    from sqlalchemy import select

    from metering.kit.timeutil import format_timestamp
    from metering.models import Account, LedgerEntry

    api = fresh_api
    accounts = [tenant(api).account_id for _ in range(2)]
    expires = NOW + timedelta(hours=1)
    for number, account in enumerate(accounts):
        granted = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/grants",
            json={
                "amount_cents": 10 + number,
                "idempotency_key": "promo",
                "category": "promotional",
                "expires_at": format_timestamp(expires),
            },
        )
        assert granted.status_code == 201, granted.text
    jobs, clock = scheduler(api, tmp_path / "exports", expires - timedelta(microseconds=1))
    assert jobs.tick().expiry_accounts == 0
    clock.set(expires)
    assert jobs.tick().expiry_accounts == 2
    with api.database.reading() as session:
        written = session.execute(
            select(LedgerEntry.account_id, LedgerEntry.amount_microcents, LedgerEntry.effective_at)
            .where(LedgerEntry.kind == "expiry")
            .order_by(LedgerEntry.account_id)
        ).all()
        balances = dict(session.execute(select(Account.id, Account.balance_microcents)).all())
    assert sorted(written) == sorted(
        [(accounts[0], -10 * 10**6, expires), (accounts[1], -11 * 10**6, expires)]
    )
    assert {a: balances[a] for a in accounts} == dict.fromkeys(accounts, 0)
    assert jobs.tick().expiry_accounts == 0  # next_expiry_at moved on: nothing due
