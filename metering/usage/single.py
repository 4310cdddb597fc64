"""One usage event on the event loop, in two statements (PostgreSQL).

A request of one event is the gateway's most frequent shape. When that event is billable now
and new, it is recorded in two autocommit statements on the request's own event loop: the
lookup (the batch path's statement; then, only for an account with project or member spend
limits, their limits: metering.usage.repository ``with_scopes``), then the program
``RECORD_USAGE`` (metering.usage.recording), which inserts it and, only if it was new, settles
its charge and adds it to its rollups, as one transaction. The checks, the pricing and the
rollup rows are the batch path's own functions.

On a Citus cluster (docs/citus.md#what-runs-on-a-cluster), three: the key's account (``api_keys``, a
reference table), then that account's lookup of the event's pair (``LOOKUP_OF_ACCOUNT``, the
lookup read one table at a time: metering.usage.lookup_apart), then ``RECORD_USAGE_OF_ACCOUNT``;
the coordinator delegates each call whole to the worker holding the account (a call outside a
transaction block): the event's transaction is that worker's alone.

Several events that arrived together at one process (metering.usage.together, PostgreSQL):
the same lookup for all of them, then the program ``RECORD_GATHERED`` (``record_gathered``).

Anything else (an event not billable now, a request_id already taken, an event the database
refuses) answers None, and the
caller takes the general path (``service.record_events``), which classifies it: nothing was
written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import psycopg

from metering.db import Database, Steps
from metering.notifications import spend_limits
from metering.programs import POSTGRESQL
from metering.usage import recording, repository, rollups, service
from metering.usage.events import Event, is_keyed, parse_event
from metering.usage.lookup_apart import KEY_ID, LOOKUP_OF_ACCOUNT, MODEL_KEY


async def record_one(
    database: Database, raw: object, now: datetime, cluster: bool = False
) -> service.BatchOutcome | None:
    """The outcome of recording ``raw``, or None when it needs the general path. ``cluster``:
    the database is a Citus coordinator."""
    if not is_keyed(raw):
        return None
    assert isinstance(raw, Mapping)
    event = parse_event(0, raw, now)
    if event.problem is not None:
        return None
    statements = _OneAccount if cluster else _Statements
    return await database.run(_steps(event, now), postgresql=statements, sqlite=None)


async def record_gathered(
    database: Database, raws: Sequence[object], now: datetime
) -> list[service.Result | None] | None:
    """Several single events that arrived together (metering.usage.together), as one
    transaction on a PostgreSQL server: each one's result (index 0) when it was recorded, None
    for each whose request id was taken (the caller asks the general path about it: nothing of
    it was written); None for all when any needs the general path before (not billable now, two
    of one request id) or when the database refused them (nothing was written)."""
    if not all(is_keyed(raw) for raw in raws):
        return None
    events = [parse_event(0, cast(Mapping[str, Any], raw), now) for raw in raws]
    if any(event.problem is not None for event in events):
        return None
    if len({event.request_id for event in events}) < len(events):
        return None
    new = await database.run(_gathered(events, now), postgresql=_Statements, sqlite=None)
    if new is None:
        return None
    return [
        service.Result(0, event.request_id, service.RECORDED, event.charge_values())
        if event.request_id in new
        else None
        for event in events
    ]


def _priced(events: list[Event]) -> Steps[bool]:
    """The events' keys, models and prices looked up (their project and member limits too,
    for accounts that have any), and the events priced: whether all of them are billable now."""
    pairs = service.lookup_pairs(events)
    rows = yield lambda db: db.lookup(pairs)
    keys, book = repository.read_lookup(rows)
    limited = repository.scope_pairs(keys, pairs)
    if limited:
        # An account with project or member limits: theirs, by a statement of its own.
        found = yield lambda db: db.scope_limits(limited, keys[limited[0][0]].account_id)
        keys = repository.with_scopes(keys, found)
    return len(service.price_events(events, keys, book)) == len(events)


def _steps(event: Event, now: datetime) -> Steps[service.BatchOutcome | None]:
    if not (yield from _priced([event])):
        return None
    new_id = yield lambda db: db.record(event, now)
    if new_id is None:
        return None
    result = service.Result(0, event.request_id, service.RECORDED, event.charge_values())
    return service.BatchOutcome([result])


def _gathered(events: list[Event], now: datetime) -> Steps[set[str] | None]:
    if not (yield from _priced(events)):
        return None
    return (yield lambda db: db.record_gathered(events, now))


class _Statements:
    """The two statements, on an autocommit connection: each its own transaction."""

    RECORD = recording.RECORD_USAGE.call_sql
    RECORD_GATHERED = recording.RECORD_GATHERED.call_sql

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection

    async def lookup(self, pairs: list[tuple[str, str]]) -> list[Any]:
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.PG_LOOKUP, params)
        return await cursor.fetchall()

    async def scope_limits(self, pairs: list[tuple[str, str]], account_id: str) -> list[Any]:
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.PG_SCOPE_LIMITS, params)
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
        cursor = await self._connection.execute(self.RECORD, self._params(event, now))
        row = await cursor.fetchone()
        return None if row is None else row[0]

    async def record_gathered(self, events: list[Event], now: datetime) -> set[str] | None:
        """The request ids of those of ``events`` that were new (recorded); None when the
        database refused them (nothing was written, the program being one transaction)."""
        params = {
            "p_now": now,
            "p_events": repository.ENCODE_EVENTS([event.row() for event in events]),
            "p_gathered": recording.ENCODE_GATHERED(
                [
                    {
                        **rollups.rows([(0, event)])[0],
                        "request_id": event.request_id,
                        "prepaid": event.prepaid,
                    }
                    for event in events
                ]
            ),
            **spend_limits.limit_params(service.spend_limited(events), now, POSTGRESQL),
        }
        try:
            cursor = await self._connection.execute(self.RECORD_GATHERED, params)
            row = await cursor.fetchone()
        except psycopg.DatabaseError:
            return None
        assert row is not None
        return set(row[0] or ())

    def _params(self, event: Event, now: datetime) -> dict[str, Any]:
        return {
            "p_now": now,
            "p_events": repository.ENCODE_EVENTS([event.row()]),
            "p_prepaid": event.prepaid,
            # last_event_id is the new id, set by the program.
            "p_rollups": rollups.ENCODE(rollups.rows([(0, event)])),
            **spend_limits.limit_params(service.spend_limited([event]), now, POSTGRESQL),
        }


class _OneAccount(_Statements):
    """On a Citus cluster: the key's account first, then the lookup of the event's pair read
    apart and the program, of that account alone (each a call delegated to its worker); an
    account's project and member limits by a statement routed to its shard."""

    RECORD = recording.RECORD_USAGE_OF_ACCOUNT.call_sql
    # The event's one pair read one table at a time, a call delegated to the account's worker.
    LOOKUP = LOOKUP_OF_ACCOUNT.call_sql

    async def lookup(self, pairs: list[tuple[str, str]]) -> list[Any]:
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.KEY_ACCOUNTS, params)
        found = await cursor.fetchall()
        if not found:
            return []  # an unknown key: the general path quarantines it
        [(key_id, account_id)] = found
        [(_key, model_key)] = pairs
        params = repository.of_account({KEY_ID.name: key_id, MODEL_KEY.name: model_key}, account_id)
        cursor = await self._connection.execute(self.LOOKUP, params)
        return await cursor.fetchall()

    async def scope_limits(self, pairs: list[tuple[str, str]], account_id: str) -> list[Any]:
        params = repository.of_account(repository.lookup_params(pairs, POSTGRESQL), account_id)
        cursor = await self._connection.execute(repository.CITUS_SCOPE_LIMITS, params)
        return await cursor.fetchall()

    def _params(self, event: Event, now: datetime) -> dict[str, Any]:
        assert event.account_id is not None
        return repository.of_account(super()._params(event, now), event.account_id)
