"""SQLite's group commit (metering/db.py, ``_Group``): units of work written as steps that
arrive while a writer's turn is taken run together, each in its own savepoint, with one commit.
Each is decided as if alone: one that fails is rolled back alone, a refusal keeps its writes, and
every caller gets its own answer."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text

from metering.db import Database, Steps
from metering.kit.errors import InvalidRequest
from tests.threads import Workers

N = 40


def _steps(name: str, outcome: str) -> Steps[str]:
    """Insert a row named ``name``, then end as ``outcome`` says: return, refuse (a
    ``MeteringError``: the row is kept, as alone) or fail (rolled back)."""
    yield lambda connection: connection.execute(
        text("INSERT INTO t (name) VALUES (:name)"), {"name": name}
    )
    if outcome == "refuse":
        raise InvalidRequest(f"{name} refused")
    if outcome == "fail":
        raise RuntimeError(f"{name} failed")
    count = yield lambda connection: connection.execute(
        text("SELECT count(*) FROM t WHERE name = :name"), {"name": name}
    ).scalar_one()
    return f"{name}:{count}"


def _adapter(connection: Connection) -> Connection:
    return connection


def test_a_group_decides_each_unit_of_work_as_if_alone(tmp_path: Path) -> None:
    database = Database.from_url(f"sqlite:///{tmp_path / 'group.db'}")
    try:
        with database.unit_of_work() as session:
            session.execute(text("CREATE TABLE t (name TEXT UNIQUE)"))
            session.commit()
        outcomes = ["ok", "refuse", "fail"] * (N // 3) + ["ok"] * (N % 3)
        groups: list[int] = []

        # Hold the writer's turn while every unit of work arrives, so that they queue and run
        # as groups (each caller a request's task on the event loop, as the routes call it).
        turn = database.unit_of_work()
        turn.__enter__()

        async def calls() -> list[Any]:
            steps = [_steps(f"n{index}", outcome) for index, outcome in enumerate(outcomes)]
            return await asyncio.gather(
                *(database.run(s, postgresql=_adapter, sqlite=_adapter) for s in steps),
                return_exceptions=True,
            )

        answers: list[Any] = []
        callers = Workers()
        callers.start(lambda: answers.extend(asyncio.run(calls())))
        while True:  # every unit of work has arrived (the first one's group waits for the turn)
            group = database._group
            if group is not None and len(group._queue) >= N - 1:
                break
            threading.Event().wait(0.01)
        groups.append(len(group._queue))
        turn.__exit__(None, None, None)
        callers.join(30)
        results = dict(enumerate(answers))

        for index, outcome in enumerate(outcomes):
            if outcome == "ok":
                assert results[index] == f"n{index}:1"
            elif outcome == "refuse":
                assert isinstance(results[index], InvalidRequest)
            else:
                assert isinstance(results[index], RuntimeError)
        with database.reading() as session:
            stored = set(session.execute(text("SELECT name FROM t")).scalars())
        assert stored == {f"n{i}" for i, o in enumerate(outcomes) if o != "fail"}
        assert groups and groups[0] >= N - 1
    finally:
        database.dispose()


def test_a_failed_commit_fails_every_unit_of_work_of_its_group(tmp_path: Path) -> None:
    """A deferred constraint broken by the units of work fails only at the commit: every caller
    of the group gets the error, and nothing of it is stored."""
    database = Database.from_url(f"sqlite:///{tmp_path / 'group.db'}")
    try:
        with database.unit_of_work() as session:
            session.execute(text("CREATE TABLE parent (id INTEGER PRIMARY KEY)"))
            session.execute(
                text(
                    "CREATE TABLE child (parent_id INTEGER REFERENCES parent (id) "
                    "DEFERRABLE INITIALLY DEFERRED)"
                )
            )
            session.commit()

        def orphan() -> Steps[None]:
            yield lambda connection: connection.execute(
                text("INSERT INTO child (parent_id) VALUES (42)")
            )

        async def both() -> list[Any]:
            calls = [database.run(orphan(), postgresql=_adapter, sqlite=_adapter) for _ in "ab"]
            return await asyncio.gather(*calls, return_exceptions=True)

        answers = asyncio.run(both())
        assert all(isinstance(a, Exception) for a in answers), answers
        with database.reading() as session:
            assert session.execute(text("SELECT count(*) FROM child")).scalar_one() == 0
    finally:
        database.dispose()
