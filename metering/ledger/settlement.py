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

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    FromClause,
    String,
    all_,
    and_,
    cast,
    func,
    literal,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, array
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import BindParameter

from metering import programs as p
from metering.ledger.spending import debit_steps, lock_accounts
from metering.models import Account, Authorization, LedgerEntry, table
from metering.states import holds

ACCOUNTS = table(Account)
HOLDS = table(Authorization)
ENTRIES = table(LedgerEntry)


class ChargeToSettle(NamedTuple):
    """One recorded usage event's charge (a row of ``CHARGES_IN``): a named tuple, made by name
    in less than half a frozen dataclass's time (a batch makes one per event)."""

    account_id: str
    api_key_id: str
    request_id: str
    usage_event_id: int
    charge_microcents: int  # >= 0
    authorization_id: str | None  # the hold the event names, if any
    prepaid: bool  # debit the balance (an unbilled account's charge only settles the hold)

    def row(self) -> dict[str, Any]:
        """The charge as a row of ``CHARGES_IN`` (by name)."""
        return self._asdict()


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
assert CHARGES_IN.names == ChargeToSettle._fields
_TARGETS = p.Rows("v_targets", (("hold_id", HOLDS.c.id.type), ("event_id", BigInteger())))
_DEBITS = p.Rows("v_debits", (("account_id", ACCOUNTS.c.id.type), ("total", BigInteger())))


def _names(charge: Any) -> ColumnElement[bool]:
    """The hold a charge names (its ``authorization_id``, of its account); ``charge``: its
    columns by name."""
    return and_(
        HOLDS.c.id == charge["authorization_id"], HOLDS.c.account_id == charge["account_id"]
    )


def _of_request(charge: Any) -> ColumnElement[bool]:
    """The hold of a charge that names none: its account's with its request id."""
    return and_(
        HOLDS.c.account_id == charge["account_id"], HOLDS.c.request_id == charge["request_id"]
    )


# The charges as a relation of the given columns of ``CHARGES_IN`` (each statement reads those
# it needs: a program's rows of several columns are a scan of each, metering.programs.Backend).
Charges = Callable[[Sequence[str]], FromClause]
# What finds a charge's hold; what its ledger entry and its account's debit read.
_FINDS = ("account_id", "request_id", "authorization_id", "usage_event_id")
_ENTERS = ("account_id", "api_key_id", "usage_event_id", "charge_microcents", "prepaid")


def settle_steps(
    on: p.Backend,
    charges: Charges,
    now: BindParameter[Any],
    *,
    one_event: bool = False,
    in_event_order: bool = False,
) -> list[p.Step]:
    """Settle the holds of ``charges`` (``CHARGES_IN``'s rows), append the
    ledger debits and debit the balances. ``one_event``: the charges are one event's (a single
    event's call), whose hold a Citus shard then finds and settles by statements of one table
    (``_found_by_row``), and whose one charge and one account's debit are collected as one row
    (``Collect.one_row``). ``in_event_order``: ``charges`` reads them in the order of their
    events' ids (a program's records, which its caller sorted), so their ledger entries are
    appended in that order without a sort of every row first."""
    settleable = holds.may("settle", HOLDS)
    by_name, by_request_id = charges(_FINDS), charges(_FINDS)
    named = (
        select(HOLDS.c.id.label("hold_id"), by_name.c.usage_event_id.label("event_id"))
        .select_from(by_name.join(HOLDS, _names(by_name.c)))
        .where(settleable)
    )
    by_request = (
        select(HOLDS.c.id.label("hold_id"), by_request_id.c.usage_event_id.label("event_id"))
        .select_from(by_request_id.join(HOLDS, _of_request(by_request_id.c)))
        .where(by_request_id.c.authorization_id.is_(None), settleable)
    )
    found = union_all(named, by_request).subquery("found")
    firsts = select(found.c.hold_id, func.min(found.c.event_id).label("event_id")).group_by(
        found.c.hold_id
    )
    targets = on.rows(_TARGETS, "t")
    settled = HOLDS.update().values(status=holds.target("settle"), closed_at=now)
    # Read without locks (each hold is checked again once locked), then settled: on PostgreSQL
    # and SQLite by a join of the charges to the holds and an UPDATE … FROM the targets; on a
    # Citus shard, for one event, by a statement of one table per charge and per hold, which
    # Citus plans once, where it plans a join and an UPDATE … FROM twice at every call.
    in_one: tuple[list[p.Step], list[p.Step]] = (
        [p.Collect(firsts, into=_TARGETS)],
        [
            p.Run(
                settled.values(usage_event_id=targets.c.event_id).where(
                    HOLDS.c.id == targets.c.hold_id, settleable
                )
            )
        ],
    )
    by_row = _found_by_row(charges(_FINDS), targets, settled, settleable) if one_event else in_one
    find, settle = on.choose(postgresql=by_row, sqlite=in_one, one_shard=by_row)
    return [
        *find,
        # Locked in byte order of id, by the locking statement itself: the collected rows need
        # no order.
        p.When(
            on.count(_TARGETS) > 1,
            (
                p.Run(
                    select(HOLDS.c.id)
                    .where(HOLDS.c.id.in_(select(targets.c.hold_id)), settleable)
                    .order_by(p.byte_order(HOLDS.c.id))
                    .with_for_update(key_share=True)
                ),
            ),
        ),
        p.When(on.count(_TARGETS) > 0, tuple(settle)),
        *_charge_steps(on, charges, now, one_event, in_event_order=one_event or in_event_order),
        lock_accounts(on, _DEBITS, "d"),
        # The balances, due expiries, the allocation over the grants and the balance crossings
        # of the move (metering.ledger.spending).
        p.When(on.count(_DEBITS) > 0, tuple(debit_steps(on, _DEBITS, now, one_account=one_event))),
    ]


def _found_by_row(
    charges: FromClause, targets: FromClause, settled: Any, settleable: Any
) -> tuple[list[p.Step], list[p.Step]]:
    """``settle_steps``' targets found charge by charge, in event order, each charge's hold by
    a statement of one table (``_names`` or ``_of_request``), a hold kept with the first (lowest)
    event that settles it; then settled hold by hold, each by an UPDATE of one row."""
    charge = {
        name: p.Var(f"v_charge_{name}", charges.c[name].type)
        for name in ("account_id", "request_id", "authorization_id", "usage_event_id")
    }
    given = {name: var.ref for name, var in charge.items()}
    hold = p.Var("v_charge_hold", HOLDS.c.id.type)
    ids = p.Var(_TARGETS.array("hold_id"), ARRAY(HOLDS.c.id.type))
    events = p.Var(_TARGETS.array("event_id"), ARRAY(BigInteger()))
    each_hold = p.Var("v_target_hold", HOLDS.c.id.type)
    each_event = p.Var("v_target_event", BigInteger())
    find: list[p.Step] = [
        p.Assign(ids, array([], type_=HOLDS.c.id.type)),
        p.Assign(events, array([], type_=BigInteger())),
        p.ForEach(
            select(*(charges.c[name] for name in charge)),  # one event's: no order to keep
            into=tuple(charge.values()),
            steps=(
                p.When(
                    given["authorization_id"].isnot(None),
                    (p.Fetch(select(HOLDS.c.id).where(_names(given), settleable), into=(hold,)),),
                    (
                        p.Fetch(
                            select(HOLDS.c.id).where(_of_request(given), settleable), into=(hold,)
                        ),
                    ),
                ),
                p.When(
                    and_(hold.ref.isnot(None), hold.ref != all_(ids.ref)),
                    _TARGETS.appended({"hold_id": hold.ref, "event_id": given["usage_event_id"]}),
                ),
            ),
        ),
    ]
    settle: list[p.Step] = [
        p.ForEach(
            select(targets.c.hold_id, targets.c.event_id),
            into=(each_hold, each_event),
            steps=(
                p.Run(
                    settled.values(usage_event_id=each_event.ref).where(
                        HOLDS.c.id == each_hold.ref, settleable
                    )
                ),
            ),
        )
    ]
    return find, settle


def _charge_steps(
    on: p.Backend, charges: Charges, now: BindParameter[Any], one_event: bool, in_event_order: bool
) -> list[p.Step]:
    """The ledger's charge entries of the prepaid charges (in event order: sorted by their event
    ids unless the charges are read in that order, ``in_event_order``), and each account's
    total into ``_DEBITS`` (one row per account, in no particular order: every statement that
    locks accounts orders them itself). On PostgreSQL one statement: the insert is a CTE and
    the totals are summed from what it returns; SQLite has no such CTE: the insert, then the
    totals summed from the charges. So on a Citus shard, where the insert of the charges' rows
    is a loop of one-row inserts Citus plans once (metering.citus.one_account) and the totals
    then a statement of no table, where the CTE made one statement planned twice at every call
    (an ``INSERT … SELECT`` of no distributed table, through an intermediate result). One
    event's charge on PostgreSQL: its entry's insert returns its account's debit, one row."""
    entered = charges(_ENTERS)
    charged = select(
        entered.c.account_id,
        literal("charge", String()),
        -entered.c.charge_microcents,
        entered.c.usage_event_id,
        entered.c.api_key_id,
        now,
    ).where(entered.c.prepaid)
    entries = ENTRIES.insert().from_select(
        ["account_id", "kind", "amount_microcents", "usage_event_id", "api_key_id", "created_at"],
        charged if in_event_order else charged.order_by(entered.c.usage_event_id),
    )
    in_one = _one_charged_in_one if one_event else _charged_in_one
    return on.choose(postgresql=in_one, sqlite=_charged_in_two, one_shard=_charged_in_two)(
        entries, charges
    )


def _charged_in_one(entries: Insert, charges: Charges) -> list[p.Step]:
    charged = entries.returning(ENTRIES.c.account_id, ENTRIES.c.amount_microcents).cte("charged")
    totals = select(
        charged.c.account_id,
        cast(-func.sum(charged.c.amount_microcents), BigInteger).label("total"),
    ).group_by(charged.c.account_id)
    return [p.Collect(totals, into=_DEBITS)]


def _one_charged_in_one(entries: Insert, charges: Charges) -> list[p.Step]:
    debit = cast(-ENTRIES.c.amount_microcents, BigInteger).label("total")
    return [p.Collect(entries.returning(ENTRIES.c.account_id, debit), into=_DEBITS, one_row=True)]


def _charged_in_two(entries: Insert, charges: Charges) -> list[p.Step]:
    summed = charges(("account_id", "charge_microcents", "prepaid"))
    totals = (
        select(
            summed.c.account_id,
            cast(func.sum(summed.c.charge_microcents), BigInteger).label("total"),
        )
        .where(summed.c.prepaid)
        .group_by(summed.c.account_id)
    )
    return [p.Run(entries), p.Collect(totals, into=_DEBITS)]
