"""Booking charges: ledger debits, balances and hold settlement, as steps of the caller's program
(metering.programs), inside its one transaction.

Usage that happened is always billed: the debit does not depend on the hold (within it, above
it, expired, voided, settled by another event, or none), and the balance may go negative (new
authorizations are then refused until credit is added).

Set-based: a fixed number of statements whatever the number of charges. The hold a charge
settles is the one it names (``authorization_id``, of the same account) or, naming none, its
account's open hold with its request id; a hold settled by several charges gets the first
(lowest) event id; voided and already settled holds stay as they are; an expired one is settled
(it did get its usage, so it is not lost usage).

Row locks are taken in one global order, so concurrent batches cannot deadlock: first the
holds, then the accounts, each in byte order of id. The account row is the one every
authorization of the account waits for, so it is taken last: the caller's program ends with it
(and the rollup rows), and its lock is held only until the commit. (A check-and-hold takes its
account first, then the account's released holds, but it skips any hold locked by someone else,
so it never waits in the opposite order: see metering.ledger.placement.)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import BigInteger, FromClause, String, and_, cast, func, literal, select, union_all
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import BindParameter

from metering import programs as p
from metering.ledger.spending import debit_steps, lock_accounts
from metering.models import Account, Authorization, LedgerEntry, table
from metering.states import holds

ACCOUNTS = table(Account)
HOLDS = table(Authorization)
ENTRIES = table(LedgerEntry)


@dataclass(frozen=True, slots=True)
class ChargeToSettle:
    """One recorded usage event's charge (a row of ``CHARGES_IN``)."""

    account_id: str
    api_key_id: str
    request_id: str
    usage_event_id: int
    charge_microcents: int  # >= 0
    authorization_id: str | None  # the hold the event names, if any
    prepaid: bool  # debit the balance (an unbilled account's charge only settles the hold)

    def row(self) -> dict[str, Any]:
        """The charge as a row of ``CHARGES_IN`` (by name)."""
        return {
            "account_id": self.account_id,
            "api_key_id": self.api_key_id,
            "request_id": self.request_id,
            "usage_event_id": self.usage_event_id,
            "charge_microcents": self.charge_microcents,
            "authorization_id": self.authorization_id,
            "prepaid": self.prepaid,
        }


CHARGES_IN = p.Records(  # ChargeToSettle's fields
    "p_charges",
    (
        ("account_id", ACCOUNTS.c.id.type),
        ("api_key_id", HOLDS.c.api_key_id.type),
        ("request_id", HOLDS.c.request_id.type),
        ("usage_event_id", BigInteger()),
        ("charge_microcents", BigInteger()),
        ("authorization_id", HOLDS.c.id.type),
        ("prepaid", p.Boolean()),
    ),
)
assert CHARGES_IN.names == tuple(f.name for f in fields(ChargeToSettle))
_TARGETS = p.Rows("v_targets", (("hold_id", HOLDS.c.id.type), ("event_id", BigInteger())))
_DEBITS = p.Rows("v_debits", (("account_id", ACCOUNTS.c.id.type), ("total", BigInteger())))


def settle_steps(on: p.Backend, charges: FromClause, now: BindParameter[Any]) -> list[p.Step]:
    """Settle the holds of ``charges`` (a relation with ``CHARGES_IN``'s columns), append the
    ledger debits and debit the balances."""
    named = (
        select(HOLDS.c.id.label("hold_id"), charges.c.usage_event_id.label("event_id"))
        .select_from(
            charges.join(
                HOLDS,
                and_(
                    HOLDS.c.id == charges.c.authorization_id,
                    HOLDS.c.account_id == charges.c.account_id,
                ),
            )
        )
        .where(holds.may("settle", HOLDS))
    )
    by_request = (
        select(HOLDS.c.id.label("hold_id"), charges.c.usage_event_id.label("event_id"))
        .select_from(
            charges.join(
                HOLDS,
                and_(
                    HOLDS.c.account_id == charges.c.account_id,
                    HOLDS.c.request_id == charges.c.request_id,
                ),
            )
        )
        .where(charges.c.authorization_id.is_(None), holds.may("settle", HOLDS))
    )
    found = union_all(named, by_request).subquery("found")
    firsts = select(found.c.hold_id, func.min(found.c.event_id).label("event_id")).group_by(
        found.c.hold_id
    )
    targets = on.rows(_TARGETS, "t")
    return [
        # Read without locks; each hold is checked again once locked (in byte order of id, by
        # the locking statement itself: the collected rows need no order).
        p.Collect(firsts, into=_TARGETS),
        p.When(
            on.count(_TARGETS) > 1,
            (
                p.Run(
                    select(HOLDS.c.id)
                    .where(HOLDS.c.id.in_(select(targets.c.hold_id)), holds.may("settle", HOLDS))
                    .order_by(p.byte_order(HOLDS.c.id))
                    .with_for_update(key_share=True)
                ),
            ),
        ),
        p.When(
            on.count(_TARGETS) > 0,
            (
                p.Run(
                    HOLDS.update()
                    .values(
                        status=holds.target("settle"),
                        closed_at=now,
                        usage_event_id=targets.c.event_id,
                    )
                    .where(HOLDS.c.id == targets.c.hold_id, holds.may("settle", HOLDS))
                ),
            ),
        ),
        *_charge_steps(on, charges, now),
        lock_accounts(on, _DEBITS, "d"),
        # The balances, due expiries, the allocation over the grants and the balance crossings
        # of the move (metering.ledger.spending).
        p.When(on.count(_DEBITS) > 0, tuple(debit_steps(on, _DEBITS, now))),
    ]


def _charge_steps(on: p.Backend, charges: FromClause, now: BindParameter[Any]) -> list[p.Step]:
    """The ledger's charge entries of the prepaid charges (in event order), and each account's
    total into ``_DEBITS`` (one row per account, in no particular order: every statement that
    locks accounts orders them itself). On PostgreSQL one statement: the insert is a CTE and
    the totals are summed from what it returns; SQLite has no such CTE: the insert, then the
    totals summed from the charges. So on a Citus shard, where the insert of the charges' rows
    is a loop of one-row inserts Citus plans once (metering.citus.one_account) and the totals
    then a statement of no table, where the CTE made one statement planned twice at every call
    (an ``INSERT … SELECT`` of no distributed table, through an intermediate result)."""
    entries = ENTRIES.insert().from_select(
        ["account_id", "kind", "amount_microcents", "usage_event_id", "api_key_id", "created_at"],
        select(
            charges.c.account_id,
            literal("charge", String()),
            -charges.c.charge_microcents,
            charges.c.usage_event_id,
            charges.c.api_key_id,
            now,
        )
        .where(charges.c.prepaid)
        .order_by(charges.c.usage_event_id),
    )
    return on.choose(postgresql=_charged_in_one, sqlite=_charged_in_two, one_shard=_charged_in_two)(
        entries, charges
    )


def _charged_in_one(entries: Insert, charges: FromClause) -> list[p.Step]:
    charged = entries.returning(ENTRIES.c.account_id, ENTRIES.c.amount_microcents).cte("charged")
    totals = select(
        charged.c.account_id,
        cast(-func.sum(charged.c.amount_microcents), BigInteger).label("total"),
    ).group_by(charged.c.account_id)
    return [p.Collect(totals, into=_DEBITS)]


def _charged_in_two(entries: Insert, charges: FromClause) -> list[p.Step]:
    totals = (
        select(
            charges.c.account_id,
            cast(func.sum(charges.c.charge_microcents), BigInteger).label("total"),
        )
        .where(charges.c.prepaid)
        .group_by(charges.c.account_id)
    )
    return [p.Run(entries), p.Collect(totals, into=_DEBITS)]
