"""PostgreSQL: plain SQL on psycopg's async connections, in autocommit, on the event loop; the
check-and-hold is one call of ``metering_place_holds`` (migrations 0005 and 0010), shared by the
holds that arrive meanwhile (``_Queue``); a resolution read before is remembered for the key's
next authorization and confirmed by that call (``_Remembered``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any

import psycopg

from metering.ledger.metrics import RESOLUTIONS
from metering.ledger.placement.rows import (
    BODY_COLUMNS,
    HOLD_VALUES,
    Placement,
    Resolved,
    resolved_from,
)

_HOLD_COLUMNS_H = ", ".join(f"h.{c}" for c in (*BODY_COLUMNS, "request_fingerprint"))
# The key, its account, the model and the rates in force (``metering_resolution``, migration
# 0010), and whether the account has a hold with this request id, in one round trip, without
# locks.
_PG_RESOLVE = """
SELECT r::text, EXISTS (
    SELECT 1 FROM authorizations AS h
    WHERE h.account_id = r ->> 1 AND h.request_id = %(request_id)s)
FROM metering_resolution(%(secret_hash)s, %(model_key)s, %(now)s) AS r
WHERE r IS NOT NULL
"""
_PG_PLACE = (
    "SELECT hold_id, outcome, available FROM metering_place_holds("
    "%(account_id)s::text, %(now)s::timestamptz, %(holds)s::json)"
)
_PG_PLACE_OF_ACCOUNTS = (
    "SELECT hold_id, outcome, available FROM metering_place_holds_of_accounts("
    "%(now)s::timestamptz, %(holds)s::json)"
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
        """Read afresh; a resolution that can price a prepaid account's hold is remembered."""
        RESOLUTIONS.inc("read")
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
            _REMEMBERED.forget(secret_hash, model_key)
            return None
        resolved = resolved_from(_resolution_row(row[0]), row[1])
        _REMEMBERED.keep(secret_hash, model_key, resolved, row[0])
        return resolved

    async def remembered(self, secret_hash: str, model_key: str) -> Resolved | None:
        """The resolution this process last read for the key and model, to be confirmed by
        the check-and-hold (``Confirm``); None when there is none to use."""
        resolved = _REMEMBERED.get(secret_hash, model_key)
        if resolved is not None:
            RESOLUTIONS.inc("remembered")
        return resolved

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
        confirm: Confirm | None = None,
    ) -> Placement:
        """Place one hold, together with the holds that this process is asked to place
        meanwhile (see ``_Queue``). With ``confirm``, the hold is placed only if the resolution
        it was estimated from still holds (else the outcome is 'stale')."""
        return await _QUEUE.place(
            self, _Placing(values, spend_limit, month_start, month_end, confirm)
        )

    async def place_all(self, batch: list[_Placing]) -> list[Placement]:
        """One call for the holds, in order: ``metering_place_holds`` when they are all of one
        account, else ``metering_place_holds_of_accounts`` (one transaction, the accounts in
        the order settlement locks them)."""
        holds = [
            {
                **placing.values,
                "spend_limit": placing.spend_limit,
                "month_start": placing.month_start,
                "month_end": placing.month_end,
                **(placing.confirm.fields() if placing.confirm else {}),
            }
            for placing in batch
        ]
        accounts = {placing.values["account_id"] for placing in batch}
        cursor = await self._connection.execute(
            _PG_PLACE if len(accounts) == 1 else _PG_PLACE_OF_ACCOUNTS,
            {
                "account_id": batch[0].values["account_id"],
                "now": max(placing.values["created_at"] for placing in batch),
                "holds": json.dumps(holds, default=datetime.isoformat),
            },
        )
        outcomes = {row[0]: Placement(row[1], row[2]) for row in await cursor.fetchall()}
        for placement in outcomes.values():
            if placement.outcome == "stale":
                RESOLUTIONS.inc("stale")
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
class Confirm:
    """What the check-and-hold recomputes to confirm a remembered resolution: its text and
    what it was read for."""

    text: str
    secret_hash: str
    model_key: str

    def fields(self) -> dict[str, str]:
        return {
            "resolution": self.text,
            "secret_hash": self.secret_hash,
            "model_key": self.model_key,
        }


class _Remembered:
    """The last resolution this process read for each key and model (its text, as the
    database gave it), for the next authorization to be estimated from without the resolving
    round trip. Nothing is decided on it: the check-and-hold confirms the text under the
    account's lock, and a resolution that no longer holds is read afresh (and replaced).

    Only resolutions a hold can be placed with are kept: a prepaid account's, with a model
    and a price. Bounded: when full, it starts again empty (a miss costs one round trip)."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._resolutions: dict[tuple[str, str], Resolved] = {}

    def get(self, secret_hash: str, model_key: str) -> Resolved | None:
        return self._resolutions.get((secret_hash, model_key))

    def keep(self, secret_hash: str, model_key: str, resolved: Resolved, text: str) -> None:
        if resolved.billing != "prepaid" or resolved.rates is None:
            self.forget(secret_hash, model_key)
            return
        if len(self._resolutions) >= self.LIMIT:
            self._resolutions.clear()
        self._resolutions[(secret_hash, model_key)] = replace(
            resolved, known_request=False, text=text
        )

    def forget(self, secret_hash: str, model_key: str) -> None:
        self._resolutions.pop((secret_hash, model_key), None)


_REMEMBERED = _Remembered()


@dataclass(frozen=True, slots=True)
class _Placing:
    values: Mapping[str, Any]
    spend_limit: int | None
    month_start: datetime
    month_end: datetime
    confirm: Confirm | None


@dataclass(slots=True)
class _Waiting:
    placing: _Placing
    # Set to the placement once made, or to a batch (this one first) for it to make.
    answer: asyncio.Future[Placement | list[_Waiting]]


class _Queue:
    """Group commit, within one process. While this process has a check-and-hold in flight,
    further holds (of any account) wait, then go together in the next call: one round trip and
    one durable commit for all of them instead of one each, each account's lock taken once, and
    each hold still decided as if alone, in arrival order, under its account's lock.

    Only the grouping lives in process memory; every decision is the database's, so any number
    of processes may serve (each groups its own). The first waiter makes the next call for the
    rest, so no request waits for more than the call in flight and its own."""

    MAX_BATCH = 64

    def __init__(self) -> None:
        self._waiting: dict[asyncio.AbstractEventLoop, list[_Waiting]] = {}

    async def place(self, holds: PostgresHolds, placing: _Placing) -> Placement:
        loop = asyncio.get_running_loop()
        queue = self._waiting.get(loop)
        mine = _Waiting(placing, loop.create_future())
        if queue is None:
            self._waiting[loop] = []
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
            self._hand_over(loop)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """The next call goes to the first live waiter, with the others behind it."""
        waiting = [w for w in self._waiting[loop] if not w.answer.done()]
        if not waiting:
            del self._waiting[loop]
            return
        batch, self._waiting[loop] = waiting[: self.MAX_BATCH], waiting[self.MAX_BATCH :]
        batch[0].answer.set_result(batch)


_QUEUE = _Queue()


def _resolution_row(text: str) -> list[Any]:
    """``metering_resolution``'s JSON array as a resolving row (its date is ISO text in JSON)."""
    row = json.loads(text)
    if row[8] is not None:
        row[8] = date.fromisoformat(row[8])
    return row


def _hold(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip((*BODY_COLUMNS, "request_fingerprint"), row, strict=True))
