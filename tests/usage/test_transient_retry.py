"""A batch the database refuses for a transient reason (a deadlock, a serialization failure, a
lock not available) is tried again whole, never recorded in parts (metering.db.retry_transient,
metering.usage.isolation): a deadlock forced on a batch through the real app is retried and the
batch recorded exactly once; overlapping batches sent at once from several threads end exact;
a refusal that lasts ends in 503 ``database_unavailable`` after the bounded attempts."""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from metering import db
from metering.kit.errors import DatabaseUnavailable
from metering.models import LedgerEntry, UsageEvent
from metering.usage.verify import verify
from tests import oracle
from tests.conftest import NOW, Api, running_api, server_database
from tests.factories import (
    GLM_RATES,
    Key,
    chat_usage,
    create_account,
    create_key,
    grant,
    priced_model,
    usage_event,
)
from tests.threads import Workers, workers
from tests.usage.helpers import balance

AT = NOW - timedelta(minutes=10)
GRANT_CENTS = 1_000_000  # ten thousand dollars: never runs out here


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def pg_fresh(needs_postgresql: None, tmp_path: Path) -> Iterator[Api]:
    """The real app on a PostgreSQL database of its own (its backends are the only ones). Not
    on Citus: there a batch writes each account in a transaction of its own, so it never holds
    one account's lock while it waits for another's — no cycle for a deadlock (the wait itself
    is tests/test_citus.py's)."""
    with (
        server_database("postgresql", tmp_path) as url,
        running_api("postgresql", url, tmp_path) as api,
    ):
        yield api


def _event(key: Key, model: str, request_id: str, n: int) -> dict[str, Any]:
    """Cache reads of 2n tokens at 17.75 µ¢ each: every odd n's ends in half a microcent."""
    usage = chat_usage(1000 + n, 100 + n % 7, cached=2 * n)
    return usage_event(key, model, AT, usage, request_id=request_id)


def _waiting_on_a_lock(api: Api, but: int, within: float = 10.0) -> None:
    """Until a backend of the app's database other than ``but`` waits for a row lock."""
    database = make_url(api.url).database
    deadline = time.monotonic() + within
    with psycopg.connect(libpq(api.url), autocommit=True) as watcher:
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s"
                " AND wait_event_type = 'Lock'",
                (database, but),
            ).fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the batch never waited for the lock")


def _exact(api: Api, accounts: dict[str, int], sent: list[dict[str, Any]], keys: list[Key]) -> None:
    """Every event once, each charged what the price oracle says (its tokens at GLM-5.3's
    rates, every model's here), each prepaid account's balance its grants less those charges,
    one charge entry per event, and ``metering verify`` clean."""
    account_of = {key.id: key.account_id for key in keys}
    distinct = {event["request_id"]: event for event in sent}.values()
    with api.database.reading() as session:
        events = session.execute(select(func.count()).select_from(UsageEvent)).scalar_one()
        assert events == len(distinct)
        for account_id, granted in accounts.items():
            mine = [e for e in distinct if account_of[e["api_key_id"]] == account_id]
            due = oracle.total(mine, GLM_RATES)
            charged = session.execute(
                select(func.coalesce(func.sum(UsageEvent.total_microcents), 0)).where(
                    UsageEvent.account_id == account_id
                )
            ).scalar_one()
            entries = session.execute(
                select(
                    func.count(), func.coalesce(func.sum(LedgerEntry.amount_microcents), 0)
                ).where(LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge")
            ).one()
            per_account = session.execute(
                select(func.count()).where(UsageEvent.account_id == account_id)
            ).scalar_one()
            assert charged == due > 0
            assert tuple(entries) == (per_account, -due) == (len(mine), -due)
            assert balance(api, account_id) == granted - due
    with api.database.unit_of_work() as session:
        assert verify(session, api.clock.now()).mismatches == []


def test_a_deadlocked_batch_is_retried_whole_and_recorded_once(
    pg_fresh: Api, caplog: pytest.LogCaptureFixture
) -> None:
    api = pg_fresh
    model = priced_model(api, NOW - timedelta(days=1))
    accounts = sorted(create_account(api) for _ in range(2))
    for account_id in accounts:
        grant(api, account_id, GRANT_CENTS)
    first, second = sorted(accounts, key=lambda a: a.encode())  # the batch's lock order
    keys = {a: create_key(api, a) for a in accounts}
    events = [_event(keys[a], model, f"dl-{a}-{n}", n) for n in range(4) for a in accounts]
    caplog.set_level(logging.INFO, logger="metering")

    with psycopg.connect(libpq(api.url)) as blocker:
        # This session waits long before it looks for a deadlock: the batch's backend (the
        # server's default, 1 s) finds it first and is the victim.
        blocker.execute("SET deadlock_timeout = '60s'")
        blocker.execute("SELECT id FROM accounts WHERE id = %s FOR NO KEY UPDATE", (second,))
        answers: list[Any] = []
        sender = Workers()
        sender.start(
            lambda: answers.append(api.gateway("POST", "/v1/usage/events", json={"events": events}))
        )
        _waiting_on_a_lock(api, but=blocker.info.backend_pid)  # holds ``first``, waits
        # The cycle: the batch's victim attempt is rolled back, which lets this lock through.
        blocker.execute("SELECT id FROM accounts WHERE id = %s FOR NO KEY UPDATE", (first,))
        blocker.rollback()
        sender.join(20)

    (answer,) = answers
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["recorded"], body["duplicates"], body["quarantined"]) == (8, 0, 0)
    retried = [r.getMessage() for r in caplog.records if "usage batch refused" in r.getMessage()]
    assert len(retried) == 1 and "attempt 1 of" in retried[0]
    assert "deadlock detected" in retried[0]
    assert not [r for r in caplog.records if "recorded again in parts" in r.getMessage()]
    _exact(api, {a: GRANT_CENTS * 10**6 for a in accounts}, events, list(keys.values()))

    # The gateway's retry of the same batch changes nothing.
    again = api.gateway("POST", "/v1/usage/events", json={"events": events}).json()
    assert (again["recorded"], again["duplicates"]) == (0, 8)
    _exact(api, {a: GRANT_CENTS * 10**6 for a in accounts}, events, list(keys.values()))


def test_overlapping_batches_from_several_threads_end_exact(fresh_api: Api) -> None:
    """Batches over the same accounts, keys and models, each event sent in two batches by two
    threads, in shuffled orders, all at once: every event recorded once, each 200."""
    api = fresh_api
    models = [priced_model(api, NOW - timedelta(days=1)) for _ in range(2)]
    accounts = [create_account(api) for _ in range(4)]
    for account_id in accounts:
        grant(api, account_id, GRANT_CENTS)
    keys = [create_key(api, a) for a in accounts for _ in range(2)]
    pool = [_event(keys[n % len(keys)], models[n % 2], f"ov-{n}", n) for n in range(600)]
    threads, batches_each, size = 4, 3, 100
    rng = random.Random(7)
    # Each event twice, in two threads' batches.
    sends = [*pool, *pool]
    rng.shuffle(sends)
    plan = [
        [
            sends[(t * batches_each + b) * size : (t * batches_each + b + 1) * size]
            for b in range(batches_each)
        ]
        for t in range(threads)
    ]
    answers: list[Any] = []
    start = threading.Barrier(threads)

    def send(batches: list[list[dict[str, Any]]]) -> None:
        start.wait()
        for batch in batches:
            answer = api.gateway("POST", "/v1/usage/events", json={"events": batch})
            assert answer.status_code == 200, answer.text
            answers.append(answer)

    with workers(60) as senders:
        for batches in plan:
            senders.start(send, batches)
    assert len(answers) == threads * batches_each
    bodies = []
    for answer in answers:
        assert answer.status_code == 200, answer.text
        bodies.append(answer.json())
    assert sum(b["recorded"] for b in bodies) == len(pool)
    assert sum(b["duplicates"] for b in bodies) == len(pool)
    assert sum(b["quarantined"] + b["rejected"] for b in bodies) == 0
    _exact(api, {a: GRANT_CENTS * 10**6 for a in accounts}, pool, keys)


def test_a_lasting_transient_refusal_ends_in_503_after_the_bounded_attempts(
    pg_url: str,
) -> None:
    """A lock that is never released (``NOWAIT``: 55P03, lock not available) is refused at
    every attempt: tried ``TRANSIENT_ATTEMPTS`` times, then 503 ``database_unavailable``."""
    with psycopg.connect(libpq(pg_url)) as holder, psycopg.connect(libpq(pg_url)) as other:
        holder.execute("CREATE TABLE IF NOT EXISTS t_lock (id int PRIMARY KEY)")
        holder.execute("INSERT INTO t_lock VALUES (1) ON CONFLICT DO NOTHING")
        holder.commit()
        holder.execute("SELECT id FROM t_lock WHERE id = 1 FOR UPDATE")
        attempts = []

        def work() -> None:
            attempts.append(1)
            try:
                other.execute("SELECT id FROM t_lock WHERE id = 1 FOR UPDATE NOWAIT")
            finally:
                other.rollback()

        with pytest.raises(DatabaseUnavailable) as raised:
            db.retry_transient(work, "test")
        assert len(attempts) == db.TRANSIENT_ATTEMPTS
        assert raised.value.status == 503
        assert raised.value.code == "database_unavailable"
        assert isinstance(raised.value.__cause__, psycopg.errors.LockNotAvailable)
        holder.rollback()
        assert db.retry_transient(work, "test") is None  # free: the first attempt passes


def test_what_is_transient(tmp_path: Path) -> None:
    """SQLite's "database is locked" is transient; an overflow or a constraint is not."""
    path = tmp_path / "t.db"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("INSERT INTO t VALUES (1)")
    assert db.transient(locked.value)
    holder.execute("ROLLBACK")
    other.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        other.execute("INSERT INTO t VALUES (1)")
    assert not db.transient(duplicate.value)
    with pytest.raises(sqlite3.OperationalError) as overflow:
        other.execute("SELECT sum(x) FROM (SELECT 9223372036854775807 AS x UNION ALL SELECT 1)")
    assert not db.transient(overflow.value)
    holder.close()
    other.close()
