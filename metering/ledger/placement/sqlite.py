"""SQLite: the hold statements (metering.ledger.placement.program) inside the caller's unit of
work, whose BEGIN IMMEDIATE makes this process the one writer; the check-and-hold runs the
program ``PLACE_HOLDS`` step by step."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from metering.ledger.placement.program import (
    BY_ID,
    BY_REQUEST_ID,
    HELD_IN_FORCE,
    HOLDS_IN,
    INSERT_UNBILLED,
    PLACE_HOLDS,
    VOID,
    Outcome,
    Placement,
)
from metering.ledger.resolution import AT, MODEL_KEY, SECRET_HASH, Resolution, resolution
from metering.programs import SQLITE, records_json

# The resolving statement, built once (building it costs ~6 ms of Python, and a statement built
# afresh with its values as literals is compiled afresh too): its values are parameters.
_RESOLVE = resolution(SECRET_HASH, MODEL_KEY, AT)


class SqliteHolds:
    """The same steps, in process: with one writer at a time, each read is as good as a
    locked one."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def resolve(
        self, secret_hash: str, model_key: str, request_id: str | None, now: datetime
    ) -> tuple[Resolution, bool] | None:
        row = self._connection.execute(
            _RESOLVE, {"secret_hash": secret_hash, "model_key": model_key, "now": now}
        ).first()
        if row is None:
            return None
        found = Resolution.from_mapping(row._mapping)
        known = request_id is not None and self.by_request_id(found.account_id, request_id)
        return found, bool(known)

    def remembered(self, secret_hash: str, model_key: str) -> None:
        """Nothing: the resolving read runs in the same transaction as the check-and-hold,
        so a remembered resolution would save no round trip."""
        return None

    def by_request_id(self, account_id: str, request_id: str) -> dict[str, Any] | None:
        row = self._connection.execute(
            BY_REQUEST_ID, {"b_account_id": account_id, "request_id": request_id}
        ).first()
        return None if row is None else dict(row._mapping)

    def place(self, hold: Mapping[str, Any]) -> Placement:
        rows = PLACE_HOLDS.run(
            self._connection,
            p_now=hold["created_at"],
            p_holds=records_json(HOLDS_IN, [hold], SQLITE),
        )
        ((_, outcome, available, spent),) = rows
        return Placement(Outcome(outcome), available, spent)

    def insert_unbilled(self, values: Mapping[str, Any]) -> bool:
        return self._connection.execute(INSERT_UNBILLED, dict(values)).first() is not None

    def held_in_force(self, account_id: str, now: datetime) -> int:
        return int(
            self._connection.execute(
                HELD_IN_FORCE, {"b_account_id": account_id, "now": now}
            ).scalar_one()
        )

    def void(self, hold_id: str, now: datetime) -> tuple[dict[str, Any] | None, bool]:
        params = {"hold_id": hold_id, "now": now}
        row = self._connection.execute(VOID, params).first()
        if row is not None:
            return dict(row._mapping), True
        row = self._connection.execute(BY_ID, params).first()
        return (None if row is None else dict(row._mapping)), False
