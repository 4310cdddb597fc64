"""Group commit within one process: what arrives while a call is in flight goes together in the
next call.

The gateway's hot requests (a hold's check-and-hold, a single usage event) each cost a
transaction whose statements, plans and commit cost far more than the one row it writes. While
a process has such a call in flight, the requests of the same kind that arrive wait for it to
end, then go together in the next call: one round trip and one commit for all of them. There is
no timer: a request that finds no call in flight makes its own at once, so a lone request waits
for nothing, and no request waits for more than the call in flight and its own.

Only the grouping lives in process memory; every decision is the database's (each item is
still decided as if alone), so any number of processes may serve, each grouping its own. The
first live waiter makes the next call for the others, with its own ``record``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")
# Records items together: each one's answer, in order, or the error to raise for it alone.
Record = Callable[[list[Item]], Awaitable[Sequence["Answer | BaseException"]]]


@dataclass(slots=True)
class _Waiting(Generic[Item, Answer]):
    item: Item
    # Set to the item's answer once recorded, or to a group (this one first) for it to record.
    answer: asyncio.Future[Answer | list[_Waiting[Item, Answer]]]


class Gathering(Generic[Item, Answer]):
    """Items of one kind, gathered per event loop and ``group`` (items of different groups
    never share a call), at most ``limit`` a call."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._waiting: dict[tuple[asyncio.AbstractEventLoop, Hashable], list[_Waiting]] = {}

    async def record(
        self, item: Item, record: Record[Item, Answer], group: Hashable = None
    ) -> Answer:
        """``item``'s answer: recorded by ``record`` at once when no call of its group is in
        flight, else with the others that arrive meanwhile, after that call."""
        loop = asyncio.get_running_loop()
        key = (loop, group)
        queue = self._waiting.get(key)
        if queue is None:  # no call in flight: this one's, at once
            self._waiting[key] = []
            batch: list[_Waiting[Item, Answer]] = []
            items = [item]
        else:
            mine: _Waiting[Item, Answer] = _Waiting(item, loop.create_future())
            queue.append(mine)
            try:
                answer = await mine.answer
            except asyncio.CancelledError:
                self._pass_on(key, mine)
                raise
            if not isinstance(answer, list):
                return answer
            batch = answer
            items = [waiting.item for waiting in batch]
        try:
            answers = await record(items)
        except BaseException as error:
            for waiting in batch[1:]:
                if not waiting.answer.done():
                    if isinstance(error, asyncio.CancelledError):
                        waiting.answer.cancel()
                    else:
                        waiting.answer.set_exception(error)
            raise
        else:
            for waiting, other in zip(batch[1:], answers[1:], strict=True):
                if not waiting.answer.done():
                    if isinstance(other, BaseException):
                        waiting.answer.set_exception(other)
                    else:
                        waiting.answer.set_result(other)
            if isinstance(answers[0], BaseException):
                raise answers[0]
            return answers[0]
        finally:
            self._hand_over(key)

    def _hand_over(self, key: tuple[asyncio.AbstractEventLoop, Hashable]) -> None:
        """The next call goes to the first live waiter, with the others behind it."""
        waiting = [w for w in self._waiting[key] if not w.answer.done()]
        if not waiting:
            del self._waiting[key]
            return
        batch, self._waiting[key] = waiting[: self.limit], waiting[self.limit :]
        batch[0].answer.set_result(batch)

    def _pass_on(
        self, key: tuple[asyncio.AbstractEventLoop, Hashable], mine: _Waiting[Item, Answer]
    ) -> None:
        """A waiter cancelled (its client gone): when it had just been handed a group to record,
        the group's next live waiter records it instead, or the next group is handed over."""
        if mine.answer.cancelled() or not mine.answer.done():
            return
        handed = mine.answer.result()
        if not isinstance(handed, list):
            return
        rest = [w for w in handed[1:] if not w.answer.done()]
        if rest:
            rest[0].answer.set_result(rest)
        else:
            self._hand_over(key)
