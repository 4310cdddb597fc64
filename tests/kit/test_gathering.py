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
