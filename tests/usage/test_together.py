"""Single-event requests that arrive together are recorded together (``metering.usage.together``,
``metering_record_gathered``): which way a process records them, what the gathered transaction books
(exactly what the same events book one by one), and the real app under concurrent requests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from metering.db import Database
from metering.kit.errors import DatabaseUnavailable
from metering.settings import Settings
from metering.usage import service, single, together
from tests import oracle
from tests.conftest import NOW, Api, run_on_database, running_api
from tests.factories import (
    GLM_RATES,
    chat_usage,
    create_account,
    create_key,
    credits_of,
    grant,
    ingest,
    priced_model,
    usage_event,
)
from tests.security.helpers import assert_books_reconcile

# --- which way a group goes (no database: the three ways of recording are given)


def _result(raw: object) -> service.Result:
    return service.Result(0, str(raw), service.RECORDED)


class _Recorder:
    """The three ways of recording, each noting what it was given; ``release`` ends the lone
    recording under way, so that the test decides who arrives while it runs."""

    def __init__(self, not_new: Sequence[object] = (), gathered: str = "records") -> None:
        self.calls: list[tuple[str, list[object]]] = []
        self.release = asyncio.Event()
        self.not_new = set(not_new)
        self.gathered_does = gathered

    async def alone(self, raw: object, now: datetime) -> service.BatchOutcome:
        self.calls.append(("alone", [raw]))
        if len(self.calls) == 1:
            await self.release.wait()
        return service.BatchOutcome([_result(raw)])

    async def gathered(
        self, raws: Sequence[object], now: datetime
    ) -> list[service.Result | None] | None:
        self.calls.append(("gathered", list(raws)))
        if self.gathered_does == "fails":
            raise RuntimeError("an error no single event meets")
        if self.gathered_does == "unavailable":
            raise DatabaseUnavailable("the database is out of reach")
        if self.gathered_does == "needs the batch path":
            return None
        return [None if raw in self.not_new else _result(raw) for raw in raws]

    async def batch(self, raws: Sequence[object], now: datetime) -> service.BatchOutcome:
        self.calls.append(("batch", list(raws)))
        return service.BatchOutcome(
            [service.Result(i, str(raw), service.DUPLICATE) for i, raw in enumerate(raws)]
        )


def _run(recorder: _Recorder, raws: list[str]) -> list[Any]:
    """The first of ``raws`` arrives alone; the others while it is being recorded. Each
    request's answer (its only result's index, request id and status, or its error)."""
    paths = together.Paths(recorder.alone, recorder.gathered, recorder.batch)

    async def scenario() -> list[Any]:
        first = asyncio.ensure_future(together.record(raws[0], NOW, paths))
        await asyncio.sleep(0)
        others = [asyncio.ensure_future(together.record(raw, NOW, paths)) for raw in raws[1:]]
        await asyncio.sleep(0)
        recorder.release.set()
        answers = await asyncio.gather(first, *others, return_exceptions=True)
        return [
            [(r.index, r.request_id, r.status) for r in answer.results]
            if isinstance(answer, service.BatchOutcome)
            else answer
            for answer in answers
        ]

    return asyncio.run(scenario())


class TestGathering:
    def test_a_lone_request_is_recorded_alone_at_once(self) -> None:
        recorder = _Recorder()
        recorder.release.set()
        assert _run(recorder, ["a"]) == [[(0, "a", "recorded")]]
        assert recorder.calls == [("alone", ["a"])]

    def test_those_arriving_meanwhile_are_recorded_together_each_answered_with_its_own(
        self,
    ) -> None:
        recorder = _Recorder()
        answers = _run(recorder, ["a", "b", "c", "d"])
        assert answers == [[(0, raw, "recorded")] for raw in "abcd"]
        assert recorder.calls == [("alone", ["a"]), ("gathered", ["b", "c", "d"])]

    def test_one_the_group_did_not_record_is_recorded_alone(self) -> None:
        recorder = _Recorder(not_new=["c"])
        answers = _run(recorder, ["a", "b", "c", "d"])
        assert answers == [[(0, raw, "recorded")] for raw in "abcd"]
        assert recorder.calls[-1] == ("alone", ["c"])

    def test_a_group_the_lean_transaction_cannot_take_goes_the_batch_path(self) -> None:
        recorder = _Recorder(gathered="needs the batch path")
        answers = _run(recorder, ["a", "b", "c"])
        # Each answered with its own result, as a batch of one (index 0).
        assert answers == [[(0, "a", "recorded")], [(0, "b", "duplicate")], [(0, "c", "duplicate")]]
        assert recorder.calls[-1] == ("batch", ["b", "c"])

    def test_an_error_of_the_whole_group_is_no_requests_but_its_own_event_s(self) -> None:
        recorder = _Recorder(gathered="fails")
        answers = _run(recorder, ["a", "b", "c"])
        assert answers == [[(0, raw, "recorded")] for raw in "abc"]
        assert recorder.calls[-2:] == [("alone", ["b"]), ("alone", ["c"])]

    def test_the_database_out_of_reach_is_every_waiting_request_s_answer(self) -> None:
        recorder = _Recorder(gathered="unavailable")
        answers = _run(recorder, ["a", "b", "c"])
        assert answers[0] == [(0, "a", "recorded")]
        assert all(isinstance(answer, DatabaseUnavailable) for answer in answers[1:])


# --- the gathered transaction on a real database


@pytest.fixture
def pg_api(plain_pg_url: str, tmp_path: Path) -> Iterator[Api]:
    """A PostgreSQL database of its own (``metering verify`` checks all of it)."""
    with running_api("postgresql", plain_pg_url, tmp_path) as api:
        api.clock.set(NOW)
        yield api


def _gathered(api: Api, events: list[dict[str, Any]]) -> list[service.Result | None] | None:
    database = Database.from_url(api.url, pool_size=1)
    try:
        return run_on_database(database, single.record_gathered(database, events, NOW))
    finally:
        database.dispose()


def _events(key: Any, model: str, prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        usage_event(
            key,
            model,
            NOW - timedelta(minutes=n * 37),
            chat_usage(1000 + 37 * n, 10 + n, cached=13 * n, reasoning=n % 3),
            request_id=f"{prefix}-{n}",
        )
        for n in range(count)
    ]


def _report(api: Api, key: Any) -> tuple[Any, ...]:
    start = (NOW - timedelta(days=2)).date()
    reports = [
        api.as_key(key.secret, "GET", f"/v1/usage?starting_at={start}{query}").json()
        for query in ("", "&bucket_width=1h", "&group_by=model")
    ]
    return tuple((report["totals"], report["data"]) for report in reports)


def _amounts(credits: dict[str, Any]) -> dict[str, Any]:
    """An account's credits but the ids of its grants (two accounts' grants differ by them)."""
    grants = [{k: v for k, v in g.items() if k != "id"} for g in credits["grants"]]
    return {**credits, "grants": grants}


def test_a_group_books_exactly_what_its_events_book_one_by_one(pg_api: Api) -> None:
    model = priced_model(pg_api, NOW - timedelta(days=5))
    other_model = priced_model(pg_api, NOW - timedelta(days=5))
    accounts = [create_account(pg_api) for _ in range(2)] + [create_account(pg_api, "unbilled")]
    gathered_keys = [create_key(pg_api, account) for account in accounts]
    alone_keys = [
        create_key(pg_api, create_account(pg_api, billing))
        for billing in ("prepaid",) * 2 + ("unbilled",)
    ]
    for key in (*gathered_keys[:2], *alone_keys[:2]):
        grant(pg_api, key.account_id, 5)
    group: list[dict[str, Any]] = []
    one_by_one: list[dict[str, Any]] = []
    for n, (gathered_key, alone_key) in enumerate(zip(gathered_keys, alone_keys, strict=True)):
        for key, into in ((gathered_key, group), (alone_key, one_by_one)):
            into += _events(key, model, f"k{n}", 4) + _events(key, other_model, f"o{n}", 2)

    results = _gathered(pg_api, group)
    assert results is not None and all(result is not None for result in results)
    for event in one_by_one:
        assert ingest(pg_api, event)["recorded"] == 1
    for gathered_key, alone_key in zip(gathered_keys, alone_keys, strict=True):
        assert _report(pg_api, gathered_key) == _report(pg_api, alone_key)
        assert _amounts(credits_of(pg_api, gathered_key)) == _amounts(credits_of(pg_api, alone_key))
    # Each charge by the oracle; the prepaid accounts' balances debited by them.
    charged = [result.charge_values for result in results if result is not None]
    assert [c.total_microcents for c in charged[:12] if c is not None] == [
        oracle.event_charge(event, GLM_RATES).total_microcents for event in group[:12]
    ]
    spent = oracle.total(group[:6], GLM_RATES)
    assert credits_of(pg_api, gathered_keys[0])["balance_microcents"] == 5_000_000 - spent
    assert_books_reconcile(pg_api)


def test_an_event_whose_request_id_is_taken_is_left_to_the_general_path(pg_api: Api) -> None:
    model = priced_model(pg_api, NOW - timedelta(days=1))
    key = create_key(pg_api, create_account(pg_api))
    grant(pg_api, key.account_id, 5)
    events = _events(key, model, "taken", 3)
    assert ingest(pg_api, events[1])["recorded"] == 1
    before = credits_of(pg_api, key)

    results = _gathered(pg_api, events)
    assert results is not None
    assert [result is None for result in results] == [False, True, False]
    # Nothing of the taken one was booked again: only the two others' charges.
    after = credits_of(pg_api, key)
    both = oracle.total([events[0], events[2]], GLM_RATES)
    assert before["balance_microcents"] - after["balance_microcents"] == both
    assert _report(pg_api, key)[0][0]["requests"] == 3
    assert_books_reconcile(pg_api)


def test_a_group_that_needs_the_general_path_writes_nothing(pg_api: Api) -> None:
    model = priced_model(pg_api, NOW - timedelta(days=1))
    key = create_key(pg_api, create_account(pg_api))
    events = _events(key, model, "general", 2)
    twice = [events[0], events[1], events[0]]  # one request id twice
    unknown = [events[0], usage_event(key, "no-such-model", NOW, request_id="unknown")]
    unkeyed = [events[0], {"request_id": "no key"}]
    for raws in (twice, unknown, unkeyed):
        assert _gathered(pg_api, raws) is None
    with pg_api.database.reading() as session:
        stored = session.execute(
            text("SELECT count(*) FROM usage_events WHERE account_id = :a"), {"a": key.account_id}
        ).scalar_one()
    assert stored == 0


def _gathered_count(api: Api) -> int:
    """Single events recorded together so far (``metering_usage_events_gathered_total``)."""
    metrics = api.client.get("/metrics").text
    return sum(
        int(float(line.split()[-1]))
        for line in metrics.splitlines()
        if line.startswith("metering_usage_events_gathered_total{")
    )


@pytest.mark.parametrize("wait_ms", [5.0, 0.0])
def test_concurrent_single_event_requests_are_recorded_once_each_and_together(
    plain_pg_url: str, tmp_path: Path, wait_ms: float
) -> None:
    """Eight clients at once, with the wait after a call (``METERING_USAGE_GATHER_WAIT_MS``)
    and without: every event recorded once, each answered with its own charge, the books those
    of the events, and some of them recorded together."""
    with running_api("postgresql", plain_pg_url, tmp_path, usage_gather_wait_ms=wait_ms) as api:
        api.clock.set(NOW)
        _concurrent_requests(api)


def _concurrent_requests(pg_api: Api) -> None:
    model = priced_model(pg_api, NOW - timedelta(days=1))
    keys = [create_key(pg_api, create_account(pg_api)) for _ in range(4)]
    for key in keys:
        grant(pg_api, key.account_id, 100)
    events = [event for key in keys for event in _events(key, model, "c", 24)]
    resent = events[::7]  # some sent twice, as a gateway retries

    def send(event: dict[str, Any]) -> dict[str, Any]:
        return ingest(pg_api, event)

    before = _gathered_count(pg_api)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, events + resent))
    assert _gathered_count(pg_api) > before
    statuses = [answer["data"][0]["status"] for answer in answers]
    assert statuses.count("recorded") == len(events)
    assert statuses.count("duplicate") == len(resent)
    for event, answer in zip(events + resent, answers, strict=True):
        charge = answer["data"][0]["charge"]
        assert charge["total_microcents"] == oracle.event_charge(event, GLM_RATES).total_microcents
    for key in keys:
        spent = oracle.total([e for e in events if e["api_key_id"] == key.id], GLM_RATES)
        assert credits_of(pg_api, key)["balance_microcents"] == 100_000_000 - spent
        assert _report(pg_api, key)[0][0]["requests"] == 24
    assert_books_reconcile(pg_api)


@pytest.mark.parametrize(("wait_ms", "seconds"), [(None, 0.005), (0.0, 0.0), (100, 0.1)])
def test_the_wait_after_a_call_is_the_setting(
    plain_pg_url: str, tmp_path: Path, wait_ms: float | None, seconds: float
) -> None:
    """5 ms unless ``METERING_USAGE_GATHER_WAIT_MS`` says otherwise."""
    settings = {} if wait_ms is None else {"usage_gather_wait_ms": wait_ms}
    with running_api("postgresql", plain_pg_url, tmp_path, **settings) as api:
        api.clock.set(NOW)
        key = create_key(api, create_account(api))
        grant(api, key.account_id, 1)
        model = priced_model(api, NOW - timedelta(days=1))
        ingest(api, _events(key, model, "w", 1)[0])
        paths = api.client.app.state.single_event_paths  # type: ignore[attr-defined]
        assert paths.gathered_in.hold_back == seconds


@pytest.mark.parametrize("wait_ms", ["-1", "100.5", "soon"])
def test_a_wait_out_of_its_range_is_a_configuration_error(
    wait_ms: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METERING_USAGE_GATHER_WAIT_MS", wait_ms)
    with pytest.raises(ValidationError, match="usage_gather_wait_ms"):
        Settings()
