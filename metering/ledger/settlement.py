"""Booking charges: ledger debits, balances and hold settlement, inside the caller's transaction.

Usage that happened is always billed: the debit does not depend on the hold (within it, above
it, expired, voided, settled by another event, or none), and the balance may go negative (new
authorizations are then refused until credit is added).

Set-based: a fixed number of statements per call, whatever the number of charges. On PostgreSQL
the rows travel as one JSON parameter (``json_to_recordset``); SQLite, in process, takes them as
an executemany.

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

from sqlalchemy import Connection, and_, bindparam, insert, or_, select, text, tuple_, update
from sqlalchemy.orm import Session

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
    connection = session.connection()
    backend = _Postgres if connection.dialect.name == "postgresql" else _Sqlite
    holds = _holds_to_settle(connection, charges)
    if holds:
        backend.settle_holds(connection, holds, now)
    billed = [c for c in charges if c.billed]
    if billed:
        totals: dict[str, int] = defaultdict(int)
        for c in billed:
            totals[c.account_id] += c.charge_microcents
        backend.debit(connection, billed, sorted(totals.items()), now)


def _holds_to_settle(
    connection: Connection, charges: Sequence[ChargeToSettle]
) -> list[tuple[str, str, int]]:
    """(hold id, account id, usage event id), by hold id: the hold each event names or, naming
    none, the open hold of its account with its request_id; a hold's first event wins."""
    unnamed = sorted({(c.account_id, c.request_id) for c in charges if not c.authorization_id})
    found: dict[tuple[str, str], str] = {}
    if unnamed:
        # Read without locks: settling re-checks each hold once it holds the hold's lock.
        if connection.dialect.name == "postgresql":
            # One fixed statement whatever the batch (prepared once), not an IN list of pairs
            # compiled anew for every batch.
            rows = [{"account_id": a, "request_id": r} for a, r in unnamed]
            result = connection.execute(_Postgres.OPEN_HOLDS, {"rows": _json(rows)})
        else:
            result = connection.execute(
                select(_HOLDS.c.id, _HOLDS.c.account_id, _HOLDS.c.request_id).where(
                    tuple_(_HOLDS.c.account_id, _HOLDS.c.request_id).in_(unnamed), _OPEN
                )
            )
        for hold_id, account_id, request_id in result:
            found[(account_id, request_id)] = hold_id
    targets: dict[tuple[str, str], int] = {}
    for c in charges:
        hold_id = c.authorization_id or found.get((c.account_id, c.request_id))
        if hold_id is not None:
            targets.setdefault((hold_id, c.account_id), c.usage_event_id)
    return [(hold, account, event) for (hold, account), event in sorted(targets.items())]


class _Postgres:
    OPEN_HOLDS = text(
        "SELECT h.id, h.account_id, h.request_id FROM authorizations AS h "
        "JOIN json_to_recordset(CAST(:rows AS json)) AS t(account_id text, request_id text) "
        "ON h.account_id = t.account_id AND h.request_id = t.request_id "
        "WHERE h.status IN ('active', 'expired')"
    )
    _HOLD_ROWS = (
        "json_to_recordset(CAST(:rows AS json)) AS t(id text, account_id text, event_id bigint)"
    )
    # Several holds: lock them in id order first (an UPDATE … FROM locks in plan order).
    LOCK_HOLDS = text(
        f"SELECT h.id FROM authorizations AS h JOIN {_HOLD_ROWS} "
        "ON h.id = t.id AND h.account_id = t.account_id "
        "WHERE h.status IN ('active', 'expired') ORDER BY h.id FOR NO KEY UPDATE OF h"
    )
    SETTLE_HOLDS = text(
        "UPDATE authorizations AS h SET status = 'settled', closed_at = :now, "
        f"usage_event_id = t.event_id FROM {_HOLD_ROWS} "
        "WHERE h.id = t.id AND h.account_id = t.account_id AND h.status IN ('active', 'expired')"
    )
    INSERT_ENTRIES = text(
        "INSERT INTO ledger_entries "
        "(account_id, kind, amount_microcents, usage_event_id, api_key_id, created_at) "
        "SELECT t.account_id, 'charge', -t.amount, t.event_id, t.api_key_id, :now "
        "FROM json_to_recordset(CAST(:rows AS json)) "
        "AS t(account_id text, amount bigint, event_id bigint, api_key_id text)"
    )
    _ACCOUNT_ROWS = "json_to_recordset(CAST(:rows AS json)) AS t(id text, amount bigint)"
    LOCK_ACCOUNTS = text(
        f"SELECT a.id FROM accounts AS a JOIN {_ACCOUNT_ROWS} ON a.id = t.id "
        "ORDER BY a.id FOR NO KEY UPDATE OF a"
    )
    DEBIT_ACCOUNTS = text(
        "UPDATE accounts AS a SET balance_microcents = a.balance_microcents - t.amount "
        f"FROM {_ACCOUNT_ROWS} WHERE a.id = t.id"
    )

    @classmethod
    def settle_holds(
        cls, connection: Connection, holds: list[tuple[str, str, int]], now: datetime
    ) -> None:
        rows = _json([{"id": h, "account_id": a, "event_id": e} for h, a, e in holds])
        if len(holds) > 1:
            connection.execute(cls.LOCK_HOLDS, {"rows": rows})
        connection.execute(cls.SETTLE_HOLDS, {"rows": rows, "now": now})

    @classmethod
    def debit(
        cls,
        connection: Connection,
        billed: list[ChargeToSettle],
        totals: list[tuple[str, int]],
        now: datetime,
    ) -> None:
        entries = [
            {
                "account_id": c.account_id,
                "amount": c.charge_microcents,
                "event_id": c.usage_event_id,
                "api_key_id": c.api_key_id,
            }
            for c in billed
        ]
        connection.execute(cls.INSERT_ENTRIES, {"rows": _json(entries), "now": now})
        rows = _json([{"id": account, "amount": amount} for account, amount in totals])
        if len(totals) > 1:
            connection.execute(cls.LOCK_ACCOUNTS, {"rows": rows})
        connection.execute(cls.DEBIT_ACCOUNTS, {"rows": rows})


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
