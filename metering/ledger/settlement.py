"""Booking charges: ledger debits, balances and hold settlement, inside the caller's transaction.

Usage that happened is always billed: the debit does not depend on the hold (within it, above
it, expired, voided, settled by another event, or none), and the balance may go negative.
Set-based: a fixed number of statements per call, whatever the number of charges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, bindparam, insert, or_, update
from sqlalchemy.orm import Session

from metering.models import Account, Authorization, LedgerEntry, table

_ACCOUNTS = table(Account)
_HOLDS = table(Authorization)
_ENTRIES = table(LedgerEntry)


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
    billed = [c for c in charges if c.billed]
    if billed:
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
        totals: dict[str, int] = defaultdict(int)
        for c in billed:
            totals[c.account_id] += c.charge_microcents
        # Sorted, so concurrent batches lock account rows in one order (no deadlock).
        connection.execute(
            update(_ACCOUNTS)
            .where(_ACCOUNTS.c.id == bindparam("b_account_id"))
            .values(balance_microcents=_ACCOUNTS.c.balance_microcents - bindparam("b_amount")),
            [{"b_account_id": a, "b_amount": totals[a]} for a in sorted(totals)],
        )
    _settle_holds(session, charges, now)


def _settle_holds(session: Session, charges: Sequence[ChargeToSettle], now: datetime) -> None:
    """Close the hold each event names (or, unnamed, the account's hold with its request_id).

    A hold that expired before its usage arrived is settled too: it did get its usage, so it
    must not be reported as lost. Voided and already settled holds stay as they are."""
    open_hold = or_(_HOLDS.c.status == "active", _HOLDS.c.status == "expired")
    named = sorted(
        (c for c in charges if c.authorization_id), key=lambda c: c.authorization_id or ""
    )
    unnamed = sorted(
        (c for c in charges if not c.authorization_id), key=lambda c: (c.account_id, c.request_id)
    )
    values = {"status": "settled", "closed_at": now, "usage_event_id": bindparam("b_event_id")}
    connection = session.connection()
    if named:
        connection.execute(
            update(_HOLDS)
            .where(
                and_(
                    _HOLDS.c.id == bindparam("b_hold_id"),
                    _HOLDS.c.account_id == bindparam("b_account_id"),
                    open_hold,
                )
            )
            .values(values),
            [
                {
                    "b_hold_id": c.authorization_id,
                    "b_account_id": c.account_id,
                    "b_event_id": c.usage_event_id,
                }
                for c in named
            ],
        )
    if unnamed:
        connection.execute(
            update(_HOLDS)
            .where(
                and_(
                    _HOLDS.c.account_id == bindparam("b_account_id"),
                    _HOLDS.c.request_id == bindparam("b_request_id"),
                    open_hold,
                )
            )
            .values(values),
            [
                {
                    "b_account_id": c.account_id,
                    "b_request_id": c.request_id,
                    "b_event_id": c.usage_event_id,
                }
                for c in unnamed
            ],
        )
