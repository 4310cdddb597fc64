"""PostgreSQL: plain SQL on psycopg's async connections, in autocommit, on the event loop; the
check-and-hold is one call of ``metering_place_holds`` (migration 0005), shared by the holds of
a busy account that arrive meanwhile (``_Queue``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from metering.ledger.placement.rows import (
    BODY_COLUMNS,
    HOLD_VALUES,
    Placement,
    Resolved,
    resolved_from,
)

_HOLD_COLUMNS_H = ", ".join(f"h.{c}" for c in (*BODY_COLUMNS, "request_fingerprint"))
_RATE_COLUMNS = (
    "input_microcents_per_million, output_microcents_per_million, cache_read_microcents_per_million"
)
# The key, its account, the model, the rates in force (the account's override, the list price)
# and whether the account has a hold with this request id, in one round trip, without locks.
_PG_RESOLVE = f"""
SELECT k.id, k.account_id, k.monthly_spend_limit_microcents, a.billing,
       m.id, m.context_length, m.max_output_tokens, m.reasoning_headroom_tokens,
       m.deprecation_date,
       o.input_microcents_per_million, o.output_microcents_per_million,
       o.cache_read_microcents_per_million,
       p.input_microcents_per_million, p.output_microcents_per_million,
       p.cache_read_microcents_per_million,
       h.id IS NOT NULL
FROM api_keys AS k
JOIN accounts AS a ON a.id = k.account_id
LEFT JOIN catalog_models AS m ON m.id_key = %(model_key)s
LEFT JOIN LATERAL (
    SELECT {_RATE_COLUMNS} FROM account_rates AS r
    WHERE r.account_id = k.account_id AND r.model_id = m.id AND r.effective_at <= %(now)s
    ORDER BY r.effective_at DESC LIMIT 1
) AS o ON true
LEFT JOIN LATERAL (
    SELECT {_RATE_COLUMNS} FROM price_versions AS v
    WHERE v.model_id = m.id AND v.effective_at <= %(now)s
    ORDER BY v.effective_at DESC LIMIT 1
) AS p ON true
LEFT JOIN authorizations AS h
    ON h.account_id = k.account_id AND h.request_id = %(request_id)s
WHERE k.secret_hash = %(secret_hash)s AND k.revoked_at IS NULL
"""
_PG_PLACE = (
    "SELECT hold_id, outcome, available FROM metering_place_holds("
    "%(account_id)s::text, %(now)s::timestamptz, %(holds)s::json)"
)
# Unbilled accounts always pass: their holds are recorded (not counted), without any lock.
_PG_INSERT_UNBILLED = (
    f"INSERT INTO authorizations ({', '.join(HOLD_VALUES)}, status, counted) "
    f"VALUES ({', '.join(f'%({c})s' for c in HOLD_VALUES)}, 'active', false) "
    "ON CONFLICT (account_id, request_id) DO NOTHING RETURNING id"
)
_PG_BY_REQUEST_ID = (
    f"SELECT {_HOLD_COLUMNS_H} FROM authorizations AS h "
    "WHERE h.account_id = %(account_id)s AND h.request_id = %(request_id)s"
)
_PG_VOID = (
    "UPDATE authorizations SET status = 'voided', closed_at = %(now)s "
    "WHERE id = %(hold_id)s AND status = 'active' AND expires_at > %(now)s "
    f"RETURNING {', '.join(BODY_COLUMNS)}"
)
_PG_BY_ID = f"SELECT {', '.join(BODY_COLUMNS)} FROM authorizations WHERE id = %(hold_id)s"


class PostgresHolds:
    """The statements on one pooled connection in autocommit, awaited on the event loop: each
    statement is its own transaction, so no BEGIN or COMMIT round trips."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection

    async def _one(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        cursor = await self._connection.execute(sql, params)
        return await cursor.fetchone()

    async def resolve(
        self, secret_hash: str, model_key: str, request_id: str | None, now: datetime
    ) -> Resolved | None:
        row = await self._one(
            _PG_RESOLVE,
            {
                "secret_hash": secret_hash,
                "model_key": model_key,
                "request_id": request_id,
                "now": now,
            },
        )
        if row is None:
            return None
        return resolved_from(row, row[15])

    async def by_request_id(self, account_id: str, request_id: str) -> dict[str, Any] | None:
        row = await self._one(
            _PG_BY_REQUEST_ID, {"account_id": account_id, "request_id": request_id}
        )
        return None if row is None else _hold(row)

    async def place(
        self,
        values: Mapping[str, Any],
        spend_limit: int | None,
        month_start: datetime,
        month_end: datetime,
    ) -> Placement:
        """Place one hold, together with the holds of the same account that this process is
        asked to place meanwhile (see ``_Queue``)."""
        return await _QUEUE.place(self, _Placing(values, spend_limit, month_start, month_end))

    async def place_all(self, batch: list[_Placing]) -> list[Placement]:
        """One call of ``metering_place_holds`` for holds of one account, in order."""
        holds = [
            {
                **placing.values,
                "spend_limit": placing.spend_limit,
                "month_start": placing.month_start,
                "month_end": placing.month_end,
            }
            for placing in batch
        ]
        cursor = await self._connection.execute(
            _PG_PLACE,
            {
                "account_id": batch[0].values["account_id"],
                "now": max(placing.values["created_at"] for placing in batch),
                "holds": json.dumps(holds, default=datetime.isoformat),
            },
        )
        outcomes = {row[0]: Placement(row[1], row[2]) for row in await cursor.fetchall()}
        return [outcomes[placing.values["id"]] for placing in batch]

    async def insert_unbilled(self, values: Mapping[str, Any]) -> bool:
        return await self._one(_PG_INSERT_UNBILLED, values) is not None

    async def void(self, hold_id: str, now: datetime) -> tuple[dict[str, Any] | None, bool]:
        row = await self._one(_PG_VOID, {"hold_id": hold_id, "now": now})
        if row is not None:
            return dict(zip(BODY_COLUMNS, row, strict=True)), True
        row = await self._one(_PG_BY_ID, {"hold_id": hold_id})
        return (None if row is None else dict(zip(BODY_COLUMNS, row, strict=True))), False


@dataclass(frozen=True, slots=True)
class _Placing:
    values: Mapping[str, Any]
    spend_limit: int | None
    month_start: datetime
    month_end: datetime


@dataclass(slots=True)
class _Waiting:
    placing: _Placing
    # Set to the placement once made, or to a batch (this one first) for it to make.
    answer: asyncio.Future[Placement | list[_Waiting]]


class _Queue:
    """Group commit for busy accounts, within one process. While this process has a
    check-and-hold of an account in flight, more holds of that account wait, then go together
    in the next call: one lock of the account row and one durable commit for all of them
    instead of one each, each still decided as if alone, in arrival order, under the lock.

    Only the grouping lives in process memory; every decision is the database's, so any number
    of processes may serve (each groups its own). The first waiter makes the next call for the
    rest, so no request waits for more than the call in flight and its own."""

    MAX_BATCH = 64

    def __init__(self) -> None:
        self._waiting: dict[tuple[asyncio.AbstractEventLoop, str], list[_Waiting]] = {}

    async def place(self, holds: PostgresHolds, placing: _Placing) -> Placement:
        loop = asyncio.get_running_loop()
        key = (loop, placing.values["account_id"])
        queue = self._waiting.get(key)
        mine = _Waiting(placing, loop.create_future())
        if queue is None:
            self._waiting[key] = []
            batch = [mine]
        else:
            queue.append(mine)
            answer = await mine.answer
            if isinstance(answer, Placement):
                return answer
            batch = answer
        try:
            placements = await holds.place_all([waiting.placing for waiting in batch])
        except BaseException as error:
            for waiting in batch[1:]:
                if not waiting.answer.done():
                    if isinstance(error, asyncio.CancelledError):
                        waiting.answer.cancel()
                    else:
                        waiting.answer.set_exception(error)
            raise
        else:
            for waiting, placement in zip(batch[1:], placements[1:], strict=True):
                if not waiting.answer.done():
                    waiting.answer.set_result(placement)
            return placements[0]
        finally:
            self._hand_over(key)

    def _hand_over(self, key: tuple[asyncio.AbstractEventLoop, str]) -> None:
        """The next call goes to the first live waiter, with the others behind it."""
        waiting = [w for w in self._waiting[key] if not w.answer.done()]
        if not waiting:
            del self._waiting[key]
            return
        batch, self._waiting[key] = waiting[: self.MAX_BATCH], waiting[self.MAX_BATCH :]
        batch[0].answer.set_result(batch)


_QUEUE = _Queue()


def _hold(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip((*BODY_COLUMNS, "request_fingerprint"), row, strict=True))
