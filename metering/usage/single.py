"""One usage event on the event loop, in two statements (PostgreSQL).

A request of one event is the gateway's most frequent shape. When that event is billable now
and new, it is recorded in two autocommit statements on the request's own event loop: the
lookup (the batch path's statement; then, only for an account with project or member spend
limits, their limits: metering.usage.repository ``with_scopes``), then the program
``RECORD_USAGE`` (metering.usage.recording), which inserts it and, only if it was new, settles
its charge and adds it to its rollups, as one transaction. The checks, the pricing and the
rollup rows are the batch path's own functions.

On a Citus cluster (docs/citus.md#what-runs-on-a-cluster), three: the key's account (``api_keys``, a
reference table), then that account's lookup (routed to its shard), then
``RECORD_USAGE_OF_ACCOUNT``, which the coordinator delegates whole to the worker holding the account
(a call outside a transaction block): the event's transaction is that worker's alone.

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
from metering.notifications import spend_limits
from metering.programs import POSTGRESQL
from metering.usage import recording, repository, rollups, service
from metering.usage.events import Event, is_keyed, parse_event


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


def _steps(event: Event, now: datetime) -> Steps[service.BatchOutcome | None]:
    pairs = service.lookup_pairs([event])
    rows = yield lambda db: db.lookup(pairs)
    keys, book = repository.read_lookup(rows)
    limited = repository.scope_pairs(keys, pairs)
    if limited:
        # Its account has project or member limits: theirs, by a statement of its own.
        found = yield lambda db: db.scope_limits(limited, keys[limited[0][0]].account_id)
        keys = repository.with_scopes(keys, found)
    if not service.price_events([event], keys, book):
        return None
    new_id = yield lambda db: db.record(event, now)
    if new_id is None:
        return None
    result = service.Result(0, event.request_id, service.RECORDED, event.charge_values())
    return service.BatchOutcome([result])


class _Statements:
    """The two statements, on an autocommit connection: each its own transaction."""

    RECORD = recording.RECORD_USAGE.call_sql

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
    """On a Citus cluster: the key's account first, then the lookup and the program of that
    account alone (each statement routed to its shard, the program's call delegated)."""

    RECORD = recording.RECORD_USAGE_OF_ACCOUNT.call_sql

    async def lookup(self, pairs: list[tuple[str, str]]) -> list[Any]:
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.KEY_ACCOUNTS, params)
        found = await cursor.fetchall()
        if not found:
            return []  # an unknown key: the general path quarantines it
        [(_key, account_id)] = found
        params = repository.of_account(params, account_id)
        cursor = await self._connection.execute(repository.CITUS_LOOKUP, params)
        return await cursor.fetchall()

    async def scope_limits(self, pairs: list[tuple[str, str]], account_id: str) -> list[Any]:
        params = repository.of_account(repository.lookup_params(pairs, POSTGRESQL), account_id)
        cursor = await self._connection.execute(repository.CITUS_SCOPE_LIMITS, params)
        return await cursor.fetchall()

    def _params(self, event: Event, now: datetime) -> dict[str, Any]:
        assert event.account_id is not None
        return repository.of_account(super()._params(event, now), event.account_id)
