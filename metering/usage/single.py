"""One usage event on the event loop, in two statements (PostgreSQL).

A request of one event is the gateway's most frequent shape. When that event is billable now
and new, it is recorded in two autocommit statements on the request's own event loop: the
lookup (the batch path's statement), then the program ``RECORD_USAGE``
(metering.usage.recording), which inserts it and, only if it was new, settles its charge and
adds it to its rollups, as one transaction. The checks, the pricing and the rollup rows are
the batch path's own functions.

Anything else (an event not billable now, a request_id already taken, an event the database
refuses) answers None, and the
caller takes the general path (``service.record_events``), which classifies it: nothing was
written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg

from metering.db import Database, Steps
from metering.kit.programs import POSTGRESQL
from metering.notifications import spend_limits
from metering.usage import recording, repository, rollups, service
from metering.usage.events import Event, is_keyed, parse_event

_RECORD = recording.RECORD_USAGE.call_sql


async def record_one(database: Database, raw: object, now: datetime) -> service.BatchOutcome | None:
    """The outcome of recording ``raw``, or None when it needs the general path."""
    if not is_keyed(raw):
        return None
    assert isinstance(raw, Mapping)
    event = parse_event(0, raw, now)
    if event.problem is not None:
        return None
    return await database.run(_steps(event, now), postgresql=_Statements, sqlite=None)


def _steps(event: Event, now: datetime) -> Steps[service.BatchOutcome | None]:
    rows = yield lambda db: db.lookup(service.lookup_pairs([event]))
    keys, book = repository.read_lookup(rows)
    if not service.price_events([event], keys, book):
        return None
    new_id = yield lambda db: db.record(event, now)
    if new_id is None:
        return None
    result = service.Result(0, event.request_id, service.RECORDED, event.charge_values())
    return service.BatchOutcome([result])


class _Statements:
    """The two statements, on an autocommit connection: each its own transaction."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection

    async def lookup(self, pairs: list[tuple[str, str]]) -> list[Any]:
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.PG_LOOKUP, params)
        return await cursor.fetchall()

    async def record(self, event: Event, now: datetime) -> int | None:
        """The new event's id; None when its request id is taken, or when the database refused
        it (a charge beyond the range, metering.kit.ranges): the general path then decides,
        nothing having been written (the program is one transaction)."""
        try:
            return await self._record(event, now)
        except psycopg.DatabaseError:
            return None

    async def _record(self, event: Event, now: datetime) -> int | None:
        cursor = await self._connection.execute(
            _RECORD,
            {
                "p_now": now,
                "p_events": repository.ENCODE_EVENTS([event.row()]),
                "p_prepaid": event.prepaid,
                # last_event_id is the new id, set by the program.
                "p_rollups": rollups.ENCODE(rollups.rows([(0, event)])),
                **spend_limits.limit_params(service.spend_limited([event]), now, POSTGRESQL),
            },
        )
        row = await cursor.fetchone()
        return None if row is None else row[0]
