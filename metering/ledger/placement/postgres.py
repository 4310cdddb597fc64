"""PostgreSQL: the hold statements (metering.ledger.placement.program) as psycopg text on async
connections in autocommit, on the event loop; the check-and-hold is one call of
``metering_place_holds``, shared by the holds that arrive meanwhile (``_QUEUE``); a resolution
read before is remembered for the key's next authorization and confirmed by that call
(``_Remembered``).

On a Citus cluster (docs/citus.md#what-stays-exact) the same statements run for one account's rows
(their ``text_of_account`` forms): the key is read first (``api_keys`` is on every node), then its
account's resolution; the check-and-hold is ``metering_place_holds_of_account``, one call per
account, sent whole to the account's node; a void finds its hold by the account its id names
(metering.states.holds)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import String, bindparam, exists, select

from metering.accounts.access import checked_under_lock
from metering.accounts.keys import KEYS, live_key
from metering.citus import text_of_account
from metering.db import transient
from metering.kit.gathering import Gathering
from metering.kit.kept import Kept
from metering.ledger.metrics import RESOLUTIONS
from metering.ledger.placement.program import (
    BODY_COLUMNS,
    BY_ID,
    BY_IDS,
    BY_REQUEST_ID,
    HELD_IN_FORCE,
    HOLDS,
    INSERT_UNBILLED,
    PLACE_HOLDS,
    PLACE_HOLDS_OF_ACCOUNT,
    VOID,
    VOID_OF_ACCOUNT,
    VOID_TOGETHER,
    Outcome,
    Placement,
)
from metering.ledger.resolution import (
    AT,
    MODEL_KEY,
    SECRET_HASH,
    STAMP_NAMES,
    Resolution,
    Stamp,
    as_text,
    resolution,
    stamp_of,
)
from metering.nodes import Executes
from metering.programs import psycopg_text
from metering.states import holds

# The resolution as JSON text, and whether the key's account has a hold with this request id, in
# one round trip, without locks; no row for a secret that names no live key. On one server with
# its stamp, what the check-and-hold confirms a remembered one by (a cluster confirms the text).
_found = resolution(SECRET_HASH, MODEL_KEY, AT).subquery("resolution")
_RESOLVING = select(
    as_text(_found),
    exists().where(
        HOLDS.c.account_id == _found.c.account_id,
        HOLDS.c.request_id == bindparam("request_id", type_=String()),
    ),
).select_from(_found)
_RESOLVE = psycopg_text(_RESOLVING.add_columns(*stamp_of(_found, AT)))
_PLACE = PLACE_HOLDS.call_sql
_INSERT_UNBILLED = psycopg_text(INSERT_UNBILLED)
_BY_REQUEST_ID = psycopg_text(BY_REQUEST_ID)
_HELD_IN_FORCE = psycopg_text(HELD_IN_FORCE)
_VOID = psycopg_text(VOID)
_BY_ID = psycopg_text(BY_ID)
_VOID_TOGETHER = psycopg_text(VOID_TOGETHER)
_BY_IDS = psycopg_text(BY_IDS)


class _OnCitus:
    """The statements' forms on a Citus cluster, each for one account's rows (the account as
    ``p_account_id``); ``BY_REQUEST_ID`` and ``HELD_IN_FORCE`` name their account already."""

    # The live key's account, from the table every node holds: what the resolution is read for.
    KEY_ACCOUNT = psycopg_text(select(KEYS.c.account_id).where(live_key(KEYS, SECRET_HASH)))
    RESOLVE = text_of_account(_RESOLVING)
    PLACE = PLACE_HOLDS_OF_ACCOUNT.call_sql
    INSERT_UNBILLED = text_of_account(INSERT_UNBILLED)
    VOID = VOID_OF_ACCOUNT.call_sql
    BY_ID = text_of_account(BY_ID)


_BY_REQUEST_ID_COLUMNS = tuple(c.name for c in BY_REQUEST_ID.selected_columns)


class PostgresHolds:
    """The statements on one pooled connection in autocommit, awaited on the event loop: each
    statement is its own transaction (one server-side unit of work), so no BEGIN or COMMIT
    round trips. ``cluster``: the database is a Citus coordinator (its ``Database.kind``)."""

    def __init__(self, connection: Executes, cluster: bool) -> None:
        self._connection = connection
        self._cluster = cluster

    async def _one(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        cursor = await self._connection.execute(sql, params)
        return await cursor.fetchone()

    async def resolve(
        self, secret_hash: str, model_key: str, request_id: str | None, now: datetime
    ) -> tuple[Resolution, bool] | None:
        """Read afresh (and whether the request id is known); a resolution that can price a
        prepaid account's hold is remembered."""
        RESOLUTIONS.inc("read")
        params = {
            "secret_hash": secret_hash,
            "model_key": model_key,
            "request_id": request_id,
            "now": now,
        }
        row: tuple[Any, ...] | None
        if not self._cluster:
            row = await self._one(_RESOLVE, params)
        else:
            key = await self._one(_OnCitus.KEY_ACCOUNT, params)
            row = None
            if key is not None:
                row = await self._one(_OnCitus.RESOLVE, {**params, "p_account_id": key[0]})
        if row is None:
            _REMEMBERED.forget(secret_hash, model_key)
            return None
        text, known, *stamp = row
        found = Resolution.from_text(text)
        _REMEMBERED.keep(secret_hash, model_key, found, text, Stamp(*stamp) if stamp else None)
        return found, known

    async def remembered(self, secret_hash: str, model_key: str) -> Remembered | None:
        """The resolution this process last read for the key and model, to be confirmed by
        the check-and-hold; None when there is none to use."""
        found = _REMEMBERED.get(secret_hash, model_key)
        if found is not None:
            RESOLUTIONS.inc("remembered")
        return found

    async def by_request_id(self, account_id: str, request_id: str) -> dict[str, Any] | None:
        row = await self._one(
            _BY_REQUEST_ID, {"b_account_id": account_id, "request_id": request_id}
        )
        return None if row is None else dict(zip(_BY_REQUEST_ID_COLUMNS, row, strict=True))

    async def place(self, hold: Mapping[str, Any]) -> Placement:
        """Place one hold (a row of ``HOLDS_IN``), together with the holds that this process is
        asked to place meanwhile (``_QUEUE``): of any account, or on Citus of its own
        account only, so that no call is a transaction across shards."""
        return await _QUEUE.record(hold, self.place_all, self.group_of(hold))

    def group_of(self, hold: Mapping[str, Any]) -> str | None:
        """Which holds may share a call with this one: any (None), or on Citus its account's."""
        return str(hold["account_id"]) if self._cluster else None

    async def place_all(self, batch: list[Mapping[str, Any]]) -> list[Placement]:
        """One call of ``metering_place_holds`` for the holds, in order (on Citus, holds of one
        account: ``metering_place_holds_of_account``)."""
        params = {
            "p_now": max(hold["created_at"] for hold in batch),
            # Null fields left out (json_to_recordset reads an absent field as null): less for
            # PostgreSQL to parse.
            "p_holds": json.dumps(
                [{name: v for name, v in hold.items() if v is not None} for hold in batch],
                default=datetime.isoformat,
            ),
        }
        if self._cluster:
            cursor = await self._connection.execute(
                _OnCitus.PLACE, {**params, "p_account_id": batch[0]["account_id"]}
            )
        else:
            cursor = await self._connection.execute(_PLACE, params)
        outcomes = {
            row[0]: Placement(Outcome(row[1]), row[2], row[3]) for row in await cursor.fetchall()
        }
        for placement in outcomes.values():
            if placement.outcome is Outcome.STALE:
                RESOLUTIONS.inc("stale")
        return [outcomes[hold["id"]] for hold in batch]

    async def insert_unbilled(self, values: Mapping[str, Any]) -> bool:
        if self._cluster:
            scoped = {**values, "p_account_id": values["account_id"]}
            return await self._one(_OnCitus.INSERT_UNBILLED, scoped) is not None
        return await self._one(_INSERT_UNBILLED, values) is not None

    async def held_in_force(self, account_id: str, now: datetime) -> int:
        row = await self._one(_HELD_IN_FORCE, {"b_account_id": account_id, "now": now})
        assert row is not None
        return int(row[0])

    async def void(self, hold_id: str, now: datetime) -> tuple[dict[str, Any] | None, bool]:
        """Void one hold: on one server together with the voids this process is asked for
        meanwhile (``_VOIDS``); on Citus alone, on its account's shard."""
        if self._cluster:
            return await self._void_alone(hold_id, now)
        return await _VOIDS.record((hold_id, now), self.void_all)

    async def void_all(self, batch: list[tuple[str, datetime]]) -> list[Voided]:
        """Each hold's row and whether it was voided, in order: one alone as ever, several by
        one ``VOID_TOGETHER``, then one ``BY_IDS`` for those it did not void. A hold asked for
        twice is voided by its first asking (the others find it void).

        Such a statement locks its holds in no set order: should two meet in a deadlock (each
        asked for two holds the other was also asked for), the one refused voids its holds one
        by one (a lone void locks one hold, and holds no other while it waits)."""
        if len(batch) == 1:
            return [await self._void_alone(*batch[0])]
        params = {
            "hold_ids": [hold_id for hold_id, _ in batch],
            "nows": [now for _, now in batch],
        }
        try:
            cursor = await self._connection.execute(_VOID_TOGETHER, params)
        except psycopg.Error as error:
            if not transient(error):
                raise
            return [await self._void_alone(hold_id, now) for hold_id, now in batch]
        voided = {row[0]: _body(row) for row in await cursor.fetchall()}
        found: dict[str, dict[str, Any]] = {}
        unchanged = [hold_id for hold_id, _ in batch if hold_id not in voided]
        if unchanged:
            cursor = await self._connection.execute(_BY_IDS, {"hold_ids": unchanged})
            found = {row[0]: _body(row) for row in await cursor.fetchall()}
        answers: list[Voided] = []
        for hold_id, _ in batch:
            if hold_id in voided:
                answers.append((voided[hold_id], True))
                found[hold_id] = voided.pop(hold_id)
            else:
                answers.append((found.get(hold_id), False))
        return answers

    async def _void_alone(self, hold_id: str, now: datetime) -> Voided:
        void, by_id = _VOID, _BY_ID
        params: dict[str, Any] = {"hold_id": hold_id, "now": now}
        account = holds.account_of(hold_id)
        # On Citus, on the shard of the account the id names (an id of the earlier form, which
        # names none, is looked for on every shard).
        if account is not None and self._cluster:
            void, by_id = _OnCitus.VOID, _OnCitus.BY_ID
            params.update(p_account_id=account, p_hold_id=hold_id, p_now=now)
        row = await self._one(void, params)
        if row is not None:
            return _body(row), True
        row = await self._one(by_id, params)
        return (None if row is None else _body(row)), False


# A void's answer: the hold's row (None: no such hold) and whether this void voided it.
Voided = tuple[dict[str, Any] | None, bool]


def _body(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(BODY_COLUMNS, row, strict=True))


# A hold's fields that confirm a remembered resolution (metering.ledger.resolution), all null
# for one resolved afresh.
NOT_CONFIRMING: dict[str, Any] = dict.fromkeys(
    ("resolution", "secret_hash", "model_key", *STAMP_NAMES)
)


@dataclass(frozen=True, slots=True)
class Remembered:
    """A resolution this process read before, with its text as the database wrote it and, on
    one server, its stamp: what the check-and-hold confirms it still holds by."""

    resolution: Resolution
    text: str
    stamp: Stamp | None

    def confirmation(self, secret_hash: str, model_key: str) -> dict[str, Any]:
        """A hold's confirming fields (``HOLDS_IN``'s): on one server the stamp; on a cluster
        the text, with the key and model it is recomputed for."""
        if self.stamp is not None:
            return {**NOT_CONFIRMING, **{name: getattr(self.stamp, name) for name in STAMP_NAMES}}
        return {
            **NOT_CONFIRMING,
            "resolution": self.text,
            "secret_hash": secret_hash,
            "model_key": model_key,
        }


class _Remembered:
    """The last resolution this process read for each key and model, for the next
    authorization to be estimated from without the resolving round trip. Nothing is decided on
    it: the check-and-hold confirms the text under the account's lock, and a resolution that no
    longer holds is read afresh (and replaced).

    Only resolutions a hold can be placed with are kept: a prepaid account's (or an unbilled
    one's with a concurrency limit), with a model and a price. Bounded (metering.kit.kept):
    when full, it starts again empty (a miss costs one round trip)."""

    def __init__(self) -> None:
        self._resolutions: Kept[tuple[str, str], Remembered] = Kept()

    def get(self, secret_hash: str, model_key: str) -> Remembered | None:
        return self._resolutions.get((secret_hash, model_key))

    def keep(
        self,
        secret_hash: str,
        model_key: str,
        found: Resolution,
        text: str,
        stamp: Stamp | None,
    ) -> None:
        if not checked_under_lock(found.billing, found.max_concurrent_requests) or (
            found.rates is None
        ):
            self.forget(secret_hash, model_key)
            return
        self._resolutions.keep((secret_hash, model_key), Remembered(found, text, stamp))

    def forget(self, secret_hash: str, model_key: str) -> None:
        self._resolutions.forget((secret_hash, model_key))


_REMEMBERED = _Remembered()


# Group commit of the check-and-hold within one process (metering.kit.gathering): while a call
# is in flight, the holds that arrive (of any account; on Citus, of one account: ``group_of``)
# wait, then go together in the next call: one round trip, one durable commit and each account's
# lock taken once for all of them, each hold still decided as if alone, in arrival order.
_QUEUE: Gathering[Mapping[str, Any], Placement] = Gathering(limit=64)
# The voids that arrive while one is made (one server): far more than a process has in flight.
_VOIDS: Gathering[tuple[str, datetime], Voided] = Gathering(limit=100)
