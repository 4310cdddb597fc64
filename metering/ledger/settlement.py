"""Booking charges: ledger debits, balances and hold settlement, inside the caller's transaction.

Usage that happened is always billed: the debit does not depend on the hold (within it, above
it, expired, voided, settled by another event, or none), and the balance may go negative (new
authorizations are then refused until credit is added).

Set-based: a fixed number of statements per call, whatever the number of charges. On PostgreSQL
one: the server-side function ``metering_settle_charges`` (migration 0007), the charges as one
JSON parameter; SQLite, in process and one writer at a time, runs the same steps here as
executemany statements.

Row locks are taken in one global order, so concurrent batches cannot deadlock: first the
holds, by id; then the accounts, by id. The account row is the one every authorization of the
account waits for, so it is taken last: called as the last write of the ingest transaction, it
is held only until the commit. (A check-and-hold takes its account first, then the account's
released holds, but it skips any hold locked by someone else, so it never waits in the
opposite order: see metering.ledger.placement.)
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, insert, or_, select, tuple_, update
from sqlalchemy.orm import Session

from metering.db import driver_connection, is_postgresql
from metering.models import Account, Authorization, LedgerEntry, table

_ACCOUNTS = table(Account)
_HOLDS = table(Authorization)
_ENTRIES = table(LedgerEntry)
# A hold that expired before its usage arrived is settled too: it did get its usage, so it must
# not be reported as lost. Voided and already settled holds stay as they are.
_OPEN = or_(_HOLDS.c.status == "active", _HOLDS.c.status == "expired")


@dataclass(frozen=True, slots=True)
class ChargeToSettle:
    account_id: str
    api_key_id: str
    request_id: str
    usage_event_id: int
    charge_microcents: int  # >= 0
    authorization_id: str | None  # the hold the event names, if any
    billed: bool  # prepaid: debit the balance; unbilled: only settle the hold


def settle_charges(session: Session, charges: Sequence[ChargeToSettle], now: datetime) -> None:
    if not charges:
        return
    if is_postgresql(session):
        # One round trip: the steps below, as the server-side function of migration 0007.
        rows = [
            {
                "account_id": c.account_id,
                "api_key_id": c.api_key_id,
                "request_id": c.request_id,
                "event_id": c.usage_event_id,
                "amount": c.charge_microcents,
                "authorization_id": c.authorization_id or None,
                "billed": c.billed,
            }
            for c in sorted(charges, key=lambda c: c.usage_event_id)
        ]
        driver_connection(session).execute(_PG_SETTLE, {"now": now, "rows": _json(rows)})
        return
    connection = session.connection()
    holds = _holds_to_settle(connection, charges)
    if holds:
        _Sqlite.settle_holds(connection, holds, now)
    billed = [c for c in charges if c.billed]
    if billed:
        totals: dict[str, int] = defaultdict(int)
        for c in billed:
            totals[c.account_id] += c.charge_microcents
        _Sqlite.debit(connection, billed, sorted(totals.items()), now)


_PG_SETTLE = "SELECT metering_settle_charges(%(now)s, %(rows)s::json)"


def _holds_to_settle(
    connection: Connection, charges: Sequence[ChargeToSettle]
) -> list[tuple[str, str, int]]:
    """(hold id, account id, usage event id), by hold id: the hold each event names or, naming
    none, the open hold of its account with its request_id; a hold's first event wins."""
    unnamed = sorted({(c.account_id, c.request_id) for c in charges if not c.authorization_id})
    found: dict[tuple[str, str], str] = {}
    if unnamed:
        # Read without locks: settling re-checks each hold once it holds the hold's lock.
        result = connection.execute(
            select(_HOLDS.c.id, _HOLDS.c.account_id, _HOLDS.c.request_id).where(
                tuple_(_HOLDS.c.account_id, _HOLDS.c.request_id).in_(unnamed), _OPEN
            )
        )
        for hold_id, account_id, request_id in result:
            found[(account_id, request_id)] = hold_id
    targets: dict[tuple[str, str], int] = {}
    for c in sorted(charges, key=lambda c: c.usage_event_id):
        hold_id = c.authorization_id or found.get((c.account_id, c.request_id))
        if hold_id is not None:
            targets.setdefault((hold_id, c.account_id), c.usage_event_id)
    return [(hold, account, event) for (hold, account), event in sorted(targets.items())]


class _Sqlite:
    """One writer at a time (BEGIN IMMEDIATE), in process: an executemany is already cheap."""

    SETTLE_HOLDS = (
        update(_HOLDS)
        .where(
            and_(
                _HOLDS.c.id == bindparam("b_hold_id"),
                _HOLDS.c.account_id == bindparam("b_account_id"),
                _OPEN,
            )
        )
        .values(
            status="settled",
            closed_at=bindparam("b_now", type_=_HOLDS.c.closed_at.type),
            usage_event_id=bindparam("b_event"),
        )
    )
    DEBIT_ACCOUNT = (
        update(_ACCOUNTS)
        .where(_ACCOUNTS.c.id == bindparam("b_account_id"))
        .values(balance_microcents=_ACCOUNTS.c.balance_microcents - bindparam("b_amount"))
    )

    @classmethod
    def settle_holds(
        cls, connection: Connection, holds: list[tuple[str, str, int]], now: datetime
    ) -> None:
        connection.execute(
            cls.SETTLE_HOLDS,
            [{"b_hold_id": h, "b_account_id": a, "b_event": e, "b_now": now} for h, a, e in holds],
        )

    @classmethod
    def debit(
        cls,
        connection: Connection,
        billed: list[ChargeToSettle],
        totals: list[tuple[str, int]],
        now: datetime,
    ) -> None:
        connection.execute(
            insert(_ENTRIES),
            [
                {
                    "account_id": c.account_id,
                    "kind": "charge",
                    "amount_microcents": -c.charge_microcents,
                    "usage_event_id": c.usage_event_id,
                    "api_key_id": c.api_key_id,
                    "created_at": now,
                }
                for c in billed
            ],
        )
        connection.execute(
            cls.DEBIT_ACCOUNT, [{"b_account_id": a, "b_amount": amount} for a, amount in totals]
        )


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, separators=(",", ":"))
