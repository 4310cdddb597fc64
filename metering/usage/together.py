"""Single-event requests that arrive together, recorded together (PostgreSQL).

A gateway that does not batch sends one request per LLM request, each of one event, and many at
once. Recorded one by one, each pays a transaction of its own: the statements of the lean path
(metering.usage.single), their plans' start-up, the commit — most of what a single event costs
the database (docs/performance.md). So they are gathered as the holds are
(metering.kit.gathering): a request that finds none of its process's single events being
recorded is recorded at once, alone, on the lean path; those that arrive meanwhile wait for it to
end, then are recorded together, in one transaction, each request answered with its own event's
result once that transaction has committed, as if it had been a batch of one (index 0).

Together is the lean kind of transaction first (``single.record_gathered``: one lookup, one
call of ``metering_record_gathered``); an event whose request id was taken is then recorded
alone (the general path classifies it); a group that transaction cannot take (an event not
billable now, one request id twice) goes the batch path as one batch; and should the group fail
as a whole (an error no event of it would meet alone), each of its events is recorded again
alone, so that no request fails for another's event. Nothing here is needed to be right: the
database decides, by the event's dedup key, whatever transaction an event meets.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import NamedTuple

from metering.kit.errors import DatabaseUnavailable
from metering.kit.gathering import Gathering
from metering.metrics import REGISTRY
from metering.usage import service

GATHERED_TOTAL = REGISTRY.counter(
    "metering_usage_events_gathered_total",
    "Single-event requests recorded with others that arrived with them, by the transaction "
    "that took them: gathered (one lean transaction) or batch (the batch path's).",
    ("transaction",),
)

# One event's recording on its own; several events' in one transaction of the lean kind (each
# one's result, None for one it did not record; None for all when it recorded none), and as a
# batch (metering.usage.service: their results by index).
Alone = Callable[[object, datetime], Awaitable[service.BatchOutcome]]
Gathered = Callable[[Sequence[object], datetime], Awaitable[Sequence[service.Result | None] | None]]
Batch = Callable[[Sequence[object], datetime], Awaitable[service.BatchOutcome]]


class _Arrived(NamedTuple):
    raw: object
    now: datetime


# The most events one transaction takes: far more than a process has requests in flight.
LIMIT = 100


def gathering(wait_seconds: float) -> Gathering[_Arrived, service.BatchOutcome]:
    """Where one app's single events are gathered. After a transaction, the next waits for the
    requests it answered to be followed by their clients' next, at most as long as it took and
    never more than ``wait_seconds`` (``METERING_USAGE_GATHER_WAIT_MS``; 0: it never waits;
    metering.kit.gathering): without it, a process's clients take turns in two groups, one event
    in four recorded alone under the ingest benchmark's load. A single event's answer is a
    report of what was used, which no user waits on."""
    return Gathering(limit=LIMIT, hold_back=wait_seconds)


@dataclass(frozen=True, slots=True, eq=False)
class Paths:
    """The three ways of recording, of one database (metering.usage.endpoints gives the real
    ones), and where their events are gathered."""

    alone: Alone
    gathered: Gathered
    batch: Batch
    gathered_in: Gathering[_Arrived, service.BatchOutcome] = field(
        default_factory=lambda: gathering(0.0)
    )


async def record(raw: object, now: datetime, paths: Paths) -> service.BatchOutcome:
    """The outcome of recording one single-event request's event, alone or with the others
    that arrive while one is being recorded."""
    return await paths.gathered_in.record(_Arrived(raw, now), partial(_record, paths))


async def _record(
    paths: Paths, arrived: list[_Arrived]
) -> list[service.BatchOutcome | BaseException]:
    if len(arrived) == 1:
        return [await paths.alone(arrived[0].raw, arrived[0].now)]
    # The group's transaction is recorded now, at its newest request's time.
    now = max(each.now for each in arrived)
    raws = [each.raw for each in arrived]
    results: Sequence[service.Result | None]
    try:
        found = await paths.gathered(raws, now)
        taken_by = "gathered"
        if found is None:
            outcome = await paths.batch(raws, now)
            found = [dataclasses.replace(result, index=0) for result in outcome.results]
            taken_by = "batch"
        results = found
        GATHERED_TOTAL.inc(taken_by, amount=sum(result is not None for result in results))
    except DatabaseUnavailable:
        raise  # every request's answer (503)
    except Exception:
        # Not a refusal of one event (those are singled out in the batch): each alone, so that
        # the error is only the request's whose event meets it.
        results = [None] * len(arrived)
    # Each one not recorded (its request id taken, or the error above), alone.
    alone = iter(
        await asyncio.gather(
            *(
                paths.alone(each.raw, each.now)
                for each, result in zip(arrived, results, strict=True)
                if result is None
            ),
            return_exceptions=True,
        )
    )
    return [
        service.BatchOutcome([result]) if result is not None else next(alone) for result in results
    ]
