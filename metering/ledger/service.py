"""The credit ledger: grants and adjustments (idempotent), balances, holds counted, credits.

An account's balance (``accounts.balance_microcents``) moves only in the transaction that appends
its ledger entry, by an atomic ``balance = balance + x`` under the account's row lock, so it always
equals the sum of the account's entries. ``held`` as credits show it is the sum of the holds that
are active now, so a hold stops counting at its ``expires_at`` without any sweeper; the
check-and-hold compares with a maintained counter instead (metering.ledger.placement), which
``held_counter_mismatches`` reconciles.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, bindparam, cast, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from metering.db import exact_sum
from metering.kit.errors import Conflict, InvalidRequest, NotFound
from metering.kit.money import INT64_MAX, cents
from metering.kit.pagination import newest_first_by_time
from metering.kit.timeutil import format_timestamp
from metering.ledger.credit_grants import (
    create_grant,
    credit_fields,
    get_grant,
    write_due_expiries,
)
from metering.ledger.spending import (
    spend,
)
from metering.models import Account, Authorization, LedgerEntry, table
from metering.notifications import outbox
from metering.states import holds
from metering.states.holds import HoldStatus

ACCOUNTS = table(Account)
HOLDS = table(Authorization)
ENTRIES = table(LedgerEntry)
INT64_MIN = -INT64_MAX - 1


def fingerprint(values: dict[str, Any]) -> str:
    """SHA-256 of a request's normalised fields: what "the same body" means for idempotency."""
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def held_by_account(account_id: Any, now: Any) -> Any:
    """The sum of an account's holds in force at ``now`` (a scalar subquery)."""
    return (
        select(func.coalesce(func.sum(HOLDS.c.estimate_microcents), 0))
        .where(HOLDS.c.account_id == account_id, holds.in_force(HOLDS, now))
        .scalar_subquery()
    )


# The account's row lock: every movement of its balance and every check-and-hold of its credit
# takes it first. FOR NO KEY UPDATE (not FOR UPDATE) so that rows referencing the account (usage
# events, entries, holds) can still be inserted by others meanwhile. SQLite has no row locks:
# its BEGIN IMMEDIATE already serialises every writing transaction.
LOCK_ACCOUNT = (
    select(ACCOUNTS.c.balance_microcents, ACCOUNTS.c.billing)
    .where(ACCOUNTS.c.id == bindparam("account_id"))
    .with_for_update(key_share=True)
)


@dataclass(frozen=True, slots=True)
class LockedAccount:
    id: str
    billing: str
    balance_microcents: int


def lock_account(session: Session, account_id: str) -> LockedAccount:
    row = session.execute(LOCK_ACCOUNT, {"account_id": account_id}).first()
    if row is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    return LockedAccount(account_id, row.billing, row.balance_microcents)


# -- credits -------------------------------------------------------------------------------------

# The holds' account by its value, not by correlation: each part routes to the account's shard.
_CREDITS = select(
    ACCOUNTS.c.balance_microcents,
    held_by_account(bindparam("account_id"), bindparam("now", type_=HOLDS.c.expires_at.type)).label(
        "held"
    ),
).where(ACCOUNTS.c.id == bindparam("account_id"))


def credit_balance(session: Session, account_id: str, now: datetime) -> dict[str, Any]:
    """``credit_balance``: balance, held (holds in force now) and available, exactly."""
    row = session.execute(_CREDITS, {"account_id": account_id, "now": now}).first()
    if row is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    pending, grants = credit_fields(session, account_id, now)
    balance, held = int(row.balance_microcents) - pending, int(row.held)
    available = balance - held
    return {
        "object": "credit_balance",
        "currency": "usd",
        "balance_cents": cents(balance),
        "held_cents": cents(held),
        "available_cents": cents(available),
        "balance_microcents": balance,
        "held_microcents": held,
        "available_microcents": available,
        **grants,
    }


def held_counter_mismatches(session: Session) -> list[str]:
    """For ``metering verify``: every account's ``held_microcents`` equals the sum of the holds
    it counts (and ``held_count`` their number), and no active hold of a prepaid account goes
    uncounted (either would let a
    check-and-hold grant credit that is not there, or refuse credit that is)."""
    counted = (
        select(
            HOLDS.c.account_id,
            exact_sum(session, HOLDS.c.estimate_microcents).label("total"),
            func.count().label("number"),
        )
        .where(HOLDS.c.counted)
        .group_by(HOLDS.c.account_id)
        .subquery()
    )
    total, number = func.coalesce(counted.c.total, 0), func.coalesce(counted.c.number, 0)
    mismatches = [
        f"account {account_id}: held counter {held} microcents, counted holds {summed}"
        if held != summed
        else f"account {account_id}: held count {count}, counted holds {how_many}"
        for account_id, held, summed, count, how_many in session.execute(
            select(ACCOUNTS.c.id, ACCOUNTS.c.held_microcents, total, ACCOUNTS.c.held_count, number)
            .outerjoin(counted, counted.c.account_id == ACCOUNTS.c.id)
            .where((ACCOUNTS.c.held_microcents != total) | (ACCOUNTS.c.held_count != number))
            .order_by(ACCOUNTS.c.id)
        )
    ]
    mismatches += [
        f"account {account_id}: active hold {hold_id} is not counted in its held counter"
        for hold_id, account_id in session.execute(
            select(HOLDS.c.id, HOLDS.c.account_id)
            .join(ACCOUNTS, ACCOUNTS.c.id == HOLDS.c.account_id)
            .where(
                HOLDS.c.status == HoldStatus.ACTIVE.value,
                ~HOLDS.c.counted,
                ACCOUNTS.c.billing == "prepaid",
            )
            .order_by(HOLDS.c.id)
        )
    ]
    return mismatches


# -- grants and adjustments ----------------------------------------------------------------------

_ENTRY_BY_KEY = select(ENTRIES).where(
    ENTRIES.c.account_id == bindparam("account_id"),
    ENTRIES.c.idempotency_key == bindparam("idempotency_key"),
)
_MOVE_BALANCE = (
    update(ACCOUNTS)
    .where(ACCOUNTS.c.id == bindparam("account_id"))
    .values(balance_microcents=ACCOUNTS.c.balance_microcents + bindparam("amount"))
)


@dataclass(frozen=True, slots=True)
class GrantTerms:
    """A grant's terms (category, priority, expiry), defaults applied."""

    category: str
    priority: int
    expires_at: datetime | None

    def fingerprinted(self) -> dict[str, Any]:
        """What the fingerprint adds: nothing for the terms every grant had before categories,
        priorities and expiries (so a retry of a grant made then still replays it)."""
        if (self.category, self.priority, self.expires_at) == ("paid", 50, None):
            return {}
        return {
            "category": self.category,
            "priority": self.priority,
            "expires_at": format_timestamp(self.expires_at) if self.expires_at else None,
        }


ADJUSTMENT_TERMS = GrantTerms("adjustment", 50, None)


def add_entry(
    session: Session,
    account_id: str,
    kind: str,
    amount_microcents: int,
    idempotency_key: str,
    note: str | None,
    now: datetime,
    terms: GrantTerms | None = None,
) -> tuple[dict[str, Any], bool]:
    """Append a grant or an adjustment and move the books with it; returns the entry's body
    (for a grant: the grant's) and whether it was created (False: the same request was
    made before, nothing changed).

    A grant, or a positive adjustment, creates a credit grant, which first pays off the
    deficit; a negative adjustment is spent like a charge (metering.ledger.spending). Due
    expiries of the account are written first. The same idempotency key with a different
    request is a 409, whatever the kind: grants and adjustments share one namespace per
    account.
    """
    lock_account(session, account_id)
    write_due_expiries(session, account_id, now)
    account = lock_account(session, account_id)
    if kind == "grant":
        terms = terms or GrantTerms("paid", 50, None)
    elif amount_microcents > 0:
        terms = ADJUSTMENT_TERMS
    request_fingerprint = fingerprint(
        {
            "kind": kind,
            "amount_microcents": amount_microcents,
            "note": note,
            **(terms.fingerprinted() if kind == "grant" and terms else {}),
        }
    )
    params = {"account_id": account_id, "idempotency_key": idempotency_key}
    existing = session.execute(_ENTRY_BY_KEY, params).first()
    if existing is not None:
        return _replayed(session, existing, request_fingerprint, now), False
    if terms is not None and terms.expires_at is not None and terms.expires_at <= now:
        raise InvalidRequest(
            "expires_at must be later than now", code="invalid_parameter", param="expires_at"
        )
    new_balance = account.balance_microcents + amount_microcents
    if not INT64_MIN <= new_balance <= INT64_MAX:
        raise InvalidRequest(
            "amount_cents would take the balance beyond the largest amount the service holds",
            param="amount_cents",
        )
    values = {
        "account_id": account_id,
        "kind": kind,
        "amount_microcents": amount_microcents,
        "idempotency_key": idempotency_key,
        "request_fingerprint": request_fingerprint,
        "note": note,
        "usage_event_id": None,
        "api_key_id": None,
        "created_at": now,
    }
    try:
        # The account lock already serialises requests with this key; the unique constraint is
        # the backstop, and a savepoint keeps the transaction usable if it ever fires.
        with session.begin_nested():
            entry_id = session.execute(
                insert(ENTRIES).values(values).returning(ENTRIES.c.id)
            ).scalar_one()
    except IntegrityError:
        existing = session.execute(_ENTRY_BY_KEY, params).first()
        if existing is None:
            raise
        return _replayed(session, existing, request_fingerprint, now), False
    grant_id = None
    if amount_microcents > 0:
        assert terms is not None
        session.execute(_MOVE_BALANCE, {"account_id": account_id, "amount": amount_microcents})
        # The balance thresholds this move crosses, under the account's row lock (taken above);
        # a rise crosses none downward, so it only keeps the one rule in one place.
        outbox.note_balance_move(session, account_id, account.balance_microcents, new_balance, now)
        grant_id = create_grant(
            session,
            account_id,
            entry_id,
            terms.category,
            terms.priority,
            amount_microcents,
            terms.expires_at,
            note,
            now,
        )
    else:
        # The debit's steps write its balance crossings (metering.ledger.spending).
        spend(session, {account_id: -amount_microcents}, now)
    if kind == "grant":
        return get_grant(session, str(grant_id), now), True
    return entry_body({**values, "id": entry_id, "grant_id": grant_id}), True


def _replayed(
    session: Session, existing: Any, request_fingerprint: str, now: datetime
) -> dict[str, Any]:
    if existing.request_fingerprint != request_fingerprint:
        raise Conflict(
            f"idempotency_key {existing.idempotency_key!r} was already used for a different "
            "request on this account",
            code="idempotency_conflict",
            param="idempotency_key",
        )
    if existing.kind == "grant":  # the grant as it now stands
        return get_grant(session, existing.grant_id, now)
    return entry_body(existing._mapping)


def entry_body(entry: Any) -> dict[str, Any]:
    kind = entry["kind"]
    amount = int(entry["amount_microcents"])
    return {
        "id": entry["id"],
        "object": "ledger_entry",
        "account_id": entry["account_id"],
        "kind": kind,
        "amount_cents": cents(amount),
        "amount_microcents": amount,
        "idempotency_key": entry["idempotency_key"],
        "note": entry["note"] if kind == "grant" else None,
        "reason": entry["note"] if kind in ("adjustment", "void", "refund") else None,
        "usage_event_id": entry["usage_event_id"],
        "api_key_id": entry["api_key_id"],
        "grant_id": entry.get("grant_id"),
        "created_at": format_timestamp(entry["created_at"]),
        "effective_at": format_timestamp(entry.get("effective_at") or entry["created_at"]),
    }


def list_entries(
    session: Session, account_id: str, limit: int, after: str | None
) -> dict[str, Any]:
    """An account's entries, newest first (by the time they were recorded, then id)."""
    if session.execute(select(ACCOUNTS.c.id).where(ACCOUNTS.c.id == account_id)).first() is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    return newest_first_by_time(
        session,
        select(ENTRIES).where(ENTRIES.c.account_id == account_id),
        ENTRIES.c.created_at,
        ENTRIES.c.id,
        limit,
        after,
        entry_body,
    )


# -- activity (the portal's Activity page) -------------------------------------------------------


def _utc_day(session: Session, column: Any) -> Any:
    """The UTC date of a timestamp column as ``YYYY-MM-DD`` text, on either backend (SQLite
    keeps UTC timestamps as sortable text that starts with the date)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD")
    return func.substr(column, 1, 10)


def activity(session: Session, account_id: str, since: datetime, until: datetime) -> dict[str, Any]:
    """An account's entries recorded in [since, until): grants and adjustments one by one,
    charges summed per UTC day of recording; newest first."""
    window = (
        ENTRIES.c.account_id == account_id,
        ENTRIES.c.created_at >= since,
        ENTRIES.c.created_at < until,
    )
    entries = [
        entry_body(row._mapping)
        for row in session.execute(
            select(ENTRIES)
            .where(*window, ENTRIES.c.kind != "charge")
            .order_by(ENTRIES.c.created_at.desc(), ENTRIES.c.id.desc())
        )
    ]
    day = _utc_day(session, ENTRIES.c.created_at).label("day")
    charges = [
        {"date": row.day, "charges": int(row[1]), "amount_microcents": int(row.total)}
        for row in session.execute(
            select(
                day,
                func.count().label("count"),
                cast(func.sum(ENTRIES.c.amount_microcents), BigInteger).label("total"),
            )
            .where(*window, ENTRIES.c.kind == "charge")
            .group_by(day)
            .order_by(day.desc())
        )
    ]
    return {"entries": entries, "charges_by_day": charges}
