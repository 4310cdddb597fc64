"""Group commit within one process: what arrives while a call is in flight goes together in the
next call.

The gateway's hot requests (a hold's check-and-hold, a single usage event) each cost a
transaction whose statements, plans and commit cost far more than the one row it writes. While
a process has such a call in flight, the requests of the same kind that arrive wait for it to
end, then go together in the next call: one round trip and one commit for all of them. A
request that finds no call in flight makes its own at once, so a lone request waits for
nothing; without ``hold_back``, no request waits for more than the call in flight and its own.

``hold_back`` (single usage events, whose answer no one waits on to serve a user): the requests
a call has just answered are likely to be followed at once by their clients' next ones. So when
a call ends, the next waits for as many requests as the call took and the ones waiting
together, but no longer than that call took (nor than ``hold_back``). Otherwise a process's
clients split into two groups that take turns, for good (one recorded while the others wait,
then those while the first come back): two transactions where one would do (under the ingest
benchmark's load, one event in four recorded alone). The wait is a timer, never a busy loop:
a request arriving with no call in flight and no wait pending still goes at once.

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


Key = tuple[asyncio.AbstractEventLoop, Hashable]


class Gathering(Generic[Item, Answer]):
    """Items of one kind, gathered per event loop and ``group`` (items of different groups
    never share a call), at most ``limit`` a call; ``hold_back`` (seconds, 0 for none): the
    longest a call waits after the last one for the items that call answered to come back."""

    def __init__(self, limit: int, hold_back: float = 0.0) -> None:
        self.limit = limit
        self.hold_back = hold_back
        self._waiting: dict[Key, list[_Waiting]] = {}
        # A call held back: how many items it waits for, and the timer that ends the wait.
        self._holding: dict[Key, tuple[int, asyncio.TimerHandle]] = {}

    async def record(
        self, item: Item, record: Record[Item, Answer], group: Hashable = None
    ) -> Answer:
        """``item``'s answer: recorded by ``record`` at once when no call of its group is in
        flight nor held back, else with the others that arrive meanwhile, after that call."""
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
            held = self._holding.get(key)
            if held is not None and len(queue) >= held[0]:
                self._hand_over(key)  # as many as it waited for: no need to wait longer
            try:
                answer = await mine.answer
            except asyncio.CancelledError:
                self._pass_on(key, mine)
                raise
            if not isinstance(answer, list):
                return answer
            batch = answer
            items = [waiting.item for waiting in batch]
        started = loop.time()
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
            self._after_call(key, len(items), loop.time() - started)

    def _after_call(self, key: Key, taken: int, took: float) -> None:
        """A call of ``taken`` items that took ``took`` seconds has ended: the next goes now,
        or, held back, once the items waiting and as many more as it took are there (its
        clients' next), or when as long as it took has passed."""
        waiting = [w for w in self._waiting[key] if not w.answer.done()]
        wanted = min(len(waiting) + taken, self.limit)
        if self.hold_back <= 0 or len(waiting) >= wanted or wanted == 1:
            # (One wanted and none waiting: the next would go as it arrives, held back or not.)
            self._hand_over(key)
            return
        self._waiting[key] = waiting  # an empty list holds a lone arrival back too
        timer = asyncio.get_running_loop().call_later(
            min(took, self.hold_back), self._hand_over, key
        )
        self._holding[key] = (wanted, timer)

    def _hand_over(self, key: Key) -> None:
        """The next call goes to the first live waiter, with the others behind it."""
        held = self._holding.pop(key, None)
        if held is not None:
            held[1].cancel()
        waiting = [w for w in self._waiting[key] if not w.answer.done()]
        if not waiting:
            del self._waiting[key]
            return
        batch, self._waiting[key] = waiting[: self.limit], waiting[self.limit :]
        batch[0].answer.set_result(batch)

    def _pass_on(self, key: Key, mine: _Waiting[Item, Answer]) -> None:
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
