"""One usage event on the event loop, in two statements (PostgreSQL).

A request of one event is the gateway's most frequent shape. When that event is billable now
and new, it is recorded in two autocommit statements on the request's own event loop: the
lookup (the batch path's statement), then ``metering_record_usage`` (migration 0009), which
inserts it and, only if it was new, settles its charge and adds it to its rollups, as one
transaction. The checks, the pricing and the rollup rows are the batch path's own functions.

Anything else (an event not billable now, a request_id already taken) answers None, and the
caller takes the general path (``service.record_events``), which classifies it: nothing was
written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from metering.db import Database
from metering.usage import repository, rollups, service
from metering.usage.events import is_keyed, parse_event

_RECORD = "SELECT metering_record_usage(%(now)s, %(event)s::json, %(billed)s, %(rollups)s::json)"


async def record_one(database: Database, raw: object, now: datetime) -> service.BatchOutcome | None:
    """The outcome of recording ``raw``, or None when it needs the general path."""
    if not is_keyed(raw):
        return None
    assert isinstance(raw, Mapping)
    event = parse_event(0, raw, now)
    if event.problem is not None:
        return None
    async with database.async_driver_autocommit() as connection:
        params = repository.lookup_params(*service.lookup_keys([event]))
        cursor = await connection.execute(repository.PG_LOOKUP, params)
        keys, book = repository.read_lookup(await cursor.fetchall())
        if not service.price_events([event], keys, book):
            return None
        cursor = await connection.execute(
            _RECORD,
            {
                "now": now,
                "event": repository.events_json([event]),
                "billed": event.billed,
                # last_event_id is the new id, set by the function.
                "rollups": rollups.upsert_json([(0, event)]),
            },
        )
        row = await cursor.fetchone()
    if row is None or row[0] is None:
        return None
    result = service.Result(0, event.request_id, service.RECORDED, event.charge_values())
    return service.BatchOutcome([result])
