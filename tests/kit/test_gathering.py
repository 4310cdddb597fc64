"""Group commit within one process (``metering.kit.gathering``): a lone item is recorded at once;
those arriving while a call is in flight go together in the next; each gets its own answer or
error; a cancelled waiter strands no one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metering.kit.gathering import Gathering


class Calls:
    """A ``record`` that notes each call's items, holds the first call until ``release``, and
    answers each item ``item * 10`` (an item "bad" with its own error; "all bad" fails the
    call)."""

    def __init__(self) -> None:
        self.items: list[list[Any]] = []
        self.release = asyncio.Event()

    async def record(self, items: list[Any]) -> list[Any]:
        self.items.append(list(items))
        if len(self.items) == 1:
            await self.release.wait()
        if "all bad" in items:
            raise RuntimeError("the call failed")
        return [ValueError(item) if item == "bad" else item * 10 for item in items]


def _arrive(
    items: list[Any], limit: int = 64, cancel: int | None = None
) -> tuple[Calls, list[Any]]:
    """The first item alone, the others while its call is in flight (``cancel``: that one's
    request cancelled as the first call ends); each one's answer or error, and the calls."""

    async def scenario() -> tuple[Calls, list[Any]]:
        calls, gathering = Calls(), Gathering[Any, Any](limit)
        tasks = [asyncio.ensure_future(gathering.record(items[0], calls.record))]
        await asyncio.sleep(0)
        tasks += [asyncio.ensure_future(gathering.record(i, calls.record)) for i in items[1:]]
        await asyncio.sleep(0)
        calls.release.set()
        if cancel is not None:
            await asyncio.sleep(0)  # the first call's answers are set, the next group handed
            tasks[cancel].cancel()
        answers = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        return calls, answers

    return asyncio.run(scenario())


def test_a_lone_item_is_recorded_at_once() -> None:
    calls, answers = _arrive([1])
    assert calls.items == [[1]] and answers == [10]


def test_items_arriving_during_a_call_go_together_in_the_next() -> None:
    calls, answers = _arrive([1, 2, 3, 4])
    assert calls.items == [[1], [2, 3, 4]]
    assert answers == [10, 20, 30, 40]


def test_a_call_takes_at_most_the_limit() -> None:
    calls, answers = _arrive([1, 2, 3, 4, 5, 6], limit=2)
    assert calls.items == [[1], [2, 3], [4, 5], [6]]
    assert answers == [10, 20, 30, 40, 50, 60]


def test_an_item_s_own_error_is_its_request_s_alone() -> None:
    _, answers = _arrive([1, 2, "bad", 4])
    assert answers[:2] == [10, 20] and answers[3] == 40
    assert isinstance(answers[2], ValueError)


def test_a_failed_call_is_every_one_of_its_requests_error_and_the_next_go_on() -> None:
    calls, answers = _arrive([1, 2, "all bad", 4, 5], limit=2)
    assert calls.items == [[1], [2, "all bad"], [4, 5]]
    assert answers[0] == 10 and answers[3:] == [40, 50]
    assert all(isinstance(answer, RuntimeError) for answer in answers[1:3])


@pytest.mark.parametrize("cancelled", [1, 2])
def test_a_cancelled_waiter_strands_no_one(cancelled: int) -> None:
    """Cancelled just as it was handed the next call (1) or behind the one handed it (2): the
    others are recorded all the same."""
    _, answers = _arrive([1, 2, 3, 4], cancel=cancelled)
    assert isinstance(answers[cancelled], asyncio.CancelledError)
    others = [answer for i, answer in enumerate(answers) if i != cancelled]
    assert others == [item * 10 for i, item in enumerate([1, 2, 3, 4]) if i != cancelled]


# -- Held back (single usage events): after a call, the next waits for its items' clients ------


class Timed:
    """A ``record`` whose first call takes ``first`` seconds; notes each call's items."""

    def __init__(self, first: float) -> None:
        self.first = first
        self.items: list[list[Any]] = []

    async def record(self, items: list[Any]) -> list[Any]:
        self.items.append(list(items))
        if len(self.items) == 1:
            await asyncio.sleep(self.first)
        return [item * 10 for item in items]


async def _ticks(n: int = 5) -> None:
    """Let every ready task run, ``n`` times over: no timer can fire meanwhile."""
    for _ in range(n):
        await asyncio.sleep(0)


def _held(first: float, hold_back: float, scenario: Any) -> list[list[Any]]:
    """Item 1 alone (its call taking ``first`` seconds), items 2 and 3 arriving during it;
    then ``scenario(gathering, calls, arrive)`` once that call has ended; the calls made."""

    async def run() -> list[list[Any]]:
        calls, gathering = Timed(first), Gathering[Any, Any](64, hold_back=hold_back)
        tasks = []

        def arrive(item: Any) -> None:
            tasks.append(asyncio.ensure_future(gathering.record(item, calls.record)))

        arrive(1)
        await _ticks()
        arrive(2)
        arrive(3)
        await tasks[0]
        await scenario(gathering, calls, arrive)
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert answers == [item * 10 for call in calls.items for item in call]
        return calls.items

    return asyncio.run(run())


def test_held_back_the_next_call_waits_for_as_many_as_the_last_took_and_those_waiting() -> None:
    async def scenario(gathering: Any, calls: Timed, arrive: Any) -> None:
        await _ticks()
        assert len(calls.items) == 1  # 2 and 3 wait for one more: the first call's client
        arrive(4)
        await _ticks()
        assert len(calls.items) == 2  # at once, long before the wait could end

    assert _held(0.5, 10.0, scenario) == [[1], [2, 3, 4]]


def test_held_back_the_wait_ends_after_as_long_as_the_last_call_took() -> None:
    async def scenario(gathering: Any, calls: Timed, arrive: Any) -> None:
        await _ticks()
        assert len(calls.items) == 1
        await asyncio.sleep(0.5)  # the first call took 0.2 s: the wait is over
        assert len(calls.items) == 2

    assert _held(0.2, 10.0, scenario) == [[1], [2, 3]]


def test_held_back_never_longer_than_hold_back() -> None:
    async def scenario(gathering: Any, calls: Timed, arrive: Any) -> None:
        await asyncio.sleep(0.3)  # the first call took 1 s, but hold_back is 0.05 s
        assert len(calls.items) == 2

    assert _held(1.0, 0.05, scenario) == [[1], [2, 3]]


def test_held_back_a_request_after_the_wait_is_recorded_at_once() -> None:
    async def scenario(gathering: Any, calls: Timed, arrive: Any) -> None:
        await asyncio.sleep(0.3)  # 2 and 3 went after the wait (0.1 s), their call is over
        assert calls.items == [[1], [2, 3]]
        await asyncio.sleep(0.3)  # the wait after their call is over too
        arrive(5)
        await _ticks(1)
        assert calls.items[-1] == [5]  # nothing in flight nor held back: at once

    assert _held(0.1, 10.0, scenario) == [[1], [2, 3], [5]]


def test_without_hold_back_the_next_call_goes_as_the_last_ends() -> None:
    async def scenario(gathering: Any, calls: Timed, arrive: Any) -> None:
        await _ticks()
        assert len(calls.items) == 2

    assert _held(0.2, 0.0, scenario) == [[1], [2, 3]]
