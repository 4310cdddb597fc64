"""Spending credit: the steps every debit of a balance runs (a batch's charges, a negative
adjustment, and a write of due expiries alone), defined once (metering.programs).

Under the account's row lock (the balance update takes it), for each account of the debits:

1. **Due expiries.** When the account's ``next_expiry_at`` has passed, every grant expired at
   the clock whose remainder is not yet forfeited gets its ``expiry`` entry (dated at its
   ``expires_at``), its remainder goes to 0 (status ``expired``), the balance drops by it, and
   ``next_expiry_at`` moves to the next live grant's expiry.
2. **Allocation, set-based.** The account's total of the batch is paid from its live grants in
   the spending order (metering.ledger.grants: the same sort key) with one window over them: a
   grant pays ``min(remainder, total − what the grants before it hold)`` while that is positive,
   and what they cannot cover adds to the deficit. So a batch of many events of one account
   allocates its total once. Every part is added to its allocation day (``spend`` / ``deficit``:
   one row per account, UTC day, kind and grant, ``add_allocations``), and the grants and the
   deficit move by the same parts (one statement on PostgreSQL; one per table in a Citus
   cluster's one-account forms, ``programs.ONE_SHARD``). On PostgreSQL a debit that the first
   live grant pays whole (the one part the window would find) is paid first by a lookup of that
   grant alone (``_spending_steps``); only the others take the window.
3. **Events.** Each expiry entry's ``credit.grant_expired``, and the balance thresholds
   the whole move crosses (``credit.balance_low`` / ``_depleted``: before = the balance the
   debit's update returned plus the debit, after = the balance at the end, both under the row
   lock), in the same transaction (metering.notifications.outbox).

Most debits need few statements: the balance update returns, per account, whether due expiries
are to be written and whether the move may cross a threshold (the outbox's own crossing rule
over the row it updated, or due expiries that move it further); the expiries and the events run
only when some account needs them, decided on the collected rows without a query.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import (
    BigInteger,
    FromClause,
    String,
    and_,
    case,
    cast,
    func,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from metering import programs as p
from metering.citus import of_account
from metering.db import is_cluster
from metering.forms import Forms
from metering.ledger.grants import order_by
from metering.models import Account, CreditAllocationDay, CreditGrant, LedgerEntry, table
from metering.models.base import UTCDateTime
from metering.notifications import outbox
from metering.states import grants as grant_states
from metering.states.grants import live_sql, pending_sql

ACCOUNTS = table(Account)
GRANTS = table(CreditGrant)
ALLOCATIONS = table(CreditAllocationDay)
ENTRIES = table(LedgerEntry)
# Allocation kinds: a grant's part of a debit, and the part no live grant could pay.
SPEND, DEFICIT = "spend", "deficit"
NO_GRANT = ""  # the ``grant_id`` of a ``deficit`` day (a key column: not NULL)
_ALLOCATION_KEY = ["account_id", "allocation_date", "kind", "grant_id"]


def add_allocations(on: p.Backend, source: Any) -> Any:
    """Add ``source`` (a SELECT of rows of ``account_id``, ``allocation_date``, ``kind``,
    ``grant_id``, ``amount_microcents``, one per key; or one row's values, a dict) to the
    allocation days that stand."""
    insert = on.insert(ALLOCATIONS)
    statement = (
        insert.values(source)
        if isinstance(source, dict)
        # SQLite: ON CONFLICT after a SELECT needs a WHERE
        else insert.from_select([*_ALLOCATION_KEY, "amount_microcents"], source.where(true()))
    )
    return statement.on_conflict_do_update(
        index_elements=_ALLOCATION_KEY,
        set_={
            "amount_microcents": ALLOCATIONS.c.amount_microcents
            + statement.excluded.amount_microcents
        },
    )


_DUE = p.Rows(
    "v_due",
    (
        ("grant_id", GRANTS.c.id.type),
        ("account_id", ACCOUNTS.c.id.type),
        ("amount", BigInteger()),
        ("expires_at", UTCDateTime()),
    ),
)
_PARTS = p.Rows(
    "v_parts",
    (
        ("grant_id", GRANTS.c.id.type),
        ("account_id", ACCOUNTS.c.id.type),
        ("amount", BigInteger()),
        ("kind", ALLOCATIONS.c.kind.type),
    ),
)
_MOVED = p.Rows(
    "v_moved",
    (
        ("account_id", ACCOUNTS.c.id.type),
        ("after_microcents", BigInteger()),
        # 1: the account has due expiries to write; 1: the move may cross a threshold.
        ("expiring", BigInteger()),
        ("crossing", BigInteger()),
    ),
)


def expiry_steps(on: p.Backend, debits: p.Rows, now: BindParameter[Any]) -> list[p.Step]:
    """Write the due expiries of ``debits``' accounts (already locked) whose ``next_expiry_at``
    has passed."""
    d = on.rows(debits, "xd")
    due = on.rows(_DUE, "due")
    due_sum = on.rows(_DUE, "ds")
    next_live = GRANTS.alias("nl")
    forfeited = (
        select(func.coalesce(func.sum(due_sum.c.amount), 0))
        .where(due_sum.c.account_id == ACCOUNTS.c.id)
        .scalar_subquery()
    )
    return [
        p.Collect(
            select(
                GRANTS.c.id.label("grant_id"),
                GRANTS.c.account_id,
                GRANTS.c.remaining_microcents.label("amount"),
                GRANTS.c.expires_at,
            ).where(GRANTS.c.account_id.in_(select(d.c.account_id)), pending_sql(GRANTS, now)),
            into=_DUE,
            order_by=("expires_at", "grant_id"),
        ),
        p.When(
            on.count(_DUE) > 0,
            (
                p.Run(
                    ENTRIES.insert().from_select(
                        [
                            "account_id",
                            "kind",
                            "amount_microcents",
                            "grant_id",
                            "created_at",
                            "effective_at",
                        ],
                        select(
                            due.c.account_id,
                            literal("expiry", String()),
                            -due.c.amount,
                            due.c.grant_id,
                            now,
                            due.c.expires_at,
                        ).order_by(due.c.expires_at, p.byte_order(due.c.grant_id)),
                    )
                ),
                p.Run(
                    GRANTS.update()
                    .values(remaining_microcents=0, status=grant_states.target("expire"))
                    .where(GRANTS.c.id == due.c.grant_id)
                ),
                p.Run(outbox.grants_expired(on.rows(_DUE, "de"), now)),
            ),
        ),
        p.Run(
            ACCOUNTS.update()
            .values(
                balance_microcents=ACCOUNTS.c.balance_microcents - forfeited,
                recharge_due_at=recharge_due(ACCOUNTS.c.balance_microcents - forfeited, now),
                next_expiry_at=select(func.min(next_live.c.expires_at))
                .where(next_live.c.account_id == ACCOUNTS.c.id, live_sql(next_live, now))
                .scalar_subquery(),
            )
            .where(ACCOUNTS.c.id.in_(select(d.c.account_id)), ACCOUNTS.c.next_expiry_at <= now)
        ),
    ]


def pending_forfeits(account_id: Any, now: Any) -> Any:
    """What the account's grants expired at ``now`` still hold (forfeits not yet written)."""
    return (
        select(func.coalesce(func.sum(GRANTS.c.remaining_microcents), 0))
        .where(GRANTS.c.account_id == account_id, pending_sql(GRANTS, now))
        .scalar_subquery()
    )


def without_pending_expiries(
    balance: p.Var, next_expiry: p.Var, account: p.Var, now: p.Var
) -> p.Step:
    """The check-and-hold's balance at ``now``: the written balance less the remainders of
    grants expired since (looked for only once the account's ``next_expiry_at`` has passed)."""
    return p.When(
        next_expiry.ref <= now.ref,
        (p.Assign(balance, balance.ref - pending_forfeits(account.ref, now.ref)),),
    )


def lock_accounts(on: p.Backend, debits: p.Rows, alias: str) -> p.Step:
    """Lock the accounts of ``debits`` (rows with ``account_id``) in byte order of id when
    there are several, so concurrent debits of the same accounts cannot deadlock (one account's
    row is locked by the statement that updates it)."""
    d = on.rows(debits, alias)
    return p.When(
        on.count(debits) > 1,
        (
            p.Run(
                select(ACCOUNTS.c.id)
                .where(ACCOUNTS.c.id.in_(select(d.c.account_id)))
                .order_by(p.byte_order(ACCOUNTS.c.id))
                .with_for_update(key_share=True)
            ),
        ),
    )


def recharge_due(after: Any, now: Any) -> Any:
    """The account's ``recharge_due_at`` once its balance is ``after``: marked ``now`` when
    auto-recharge is on and the balance falls below its threshold, kept when already marked (the
    scheduler clears it: metering.payments.recharge). Written by the balance's own update, so the
    debit that takes the balance below the threshold records that a recharge is due at no cost of
    a statement."""
    due_at = ACCOUNTS.c.recharge_due_at
    threshold = ACCOUNTS.c.recharge_threshold_microcents
    return case(
        (and_(due_at.is_(None), threshold.is_not(None), after < threshold), now),
        else_=due_at,
    )


def debit_steps(
    on: p.Backend, debits: p.Rows, now: BindParameter[Any], one_account: bool = False
) -> list[p.Step]:
    """Debit each account of ``debits`` (rows ``account_id``, ``total`` ≥ 0, one per account,
    their rows locked first when there are several) by its total: the balance, due expiries,
    and the allocation over its live grants in spending order (see the module).
    ``one_account``: ``debits`` is one row at most (a single event's), and so is what its
    statements return (``Collect.one_row``)."""
    d = on.rows(debits, "d")
    totals = on.rows(debits, "dt")
    after = ACCOUNTS.c.balance_microcents
    due = ACCOUNTS.c.next_expiry_at <= now

    def debit(account_id: Any, total: Any, debited: Any) -> Any:
        """The account's debit by ``total``, returning ``_MOVED``'s columns (``debited``: the
        debit, as the update's RETURNING can name it)."""
        may_cross = or_(
            due,
            outbox.crosses(after + debited, after, ACCOUNTS.c.low_balance_threshold_microcents),
        )
        return (
            ACCOUNTS.update()
            .values(
                balance_microcents=ACCOUNTS.c.balance_microcents - total,
                recharge_due_at=recharge_due(ACCOUNTS.c.balance_microcents - total, now),
            )
            .where(ACCOUNTS.c.id == account_id)
            .returning(
                ACCOUNTS.c.id.label("account_id"),
                after.label("after_microcents"),
                case((due, 1), else_=0).label("expiring"),
                case((may_cross, 1), else_=0).label("crossing"),
            )
        )

    # The accounts' debits: one UPDATE … FROM the debits' rows; on SQLite, whose RETURNING may
    # name only the updated table, the debit read again there by a subquery; on a Citus shard
    # (one account, so one row at most) an UPDATE of the account's row by the row's values,
    # which Citus plans once, where it plans an UPDATE … FROM twice at every call.
    row = {name: p.Var(f"v_debit_{name}", kind) for name, kind in debits.columns}
    returned = {name: p.Var(f"v_debited_{name}", kind) for name, kind in _MOVED.columns}
    by_row: list[p.Step] = [
        *_MOVED.emptied(),
        p.ForEach(
            select(d.c.account_id, d.c.total),
            into=(row["account_id"], row["total"]),
            steps=(
                p.Fetch(
                    debit(row["account_id"].ref, row["total"].ref, row["total"].ref),
                    into=tuple(returned.values()),
                ),
                p.When(
                    returned["account_id"].ref.isnot(None),
                    _MOVED.appended({name: var.ref for name, var in returned.items()}),
                ),
            ),
        ),
    ]
    in_sqlite = select(totals.c.total).where(totals.c.account_id == ACCOUNTS.c.id)
    debited: list[p.Step] = on.choose(
        postgresql=[
            p.Collect(debit(d.c.account_id, d.c.total, d.c.total), into=_MOVED, one_row=one_account)
        ],
        sqlite=[
            p.Collect(debit(d.c.account_id, d.c.total, in_sqlite.scalar_subquery()), into=_MOVED)
        ],
        one_shard=by_row,
    )
    return [
        *debited,
        p.When(on.holds_any(_MOVED, "expiring", 1), tuple(expiry_steps(on, debits, now))),
        *_spending_steps(on, debits, now, one_account),
        # The balance thresholds the whole move (debit and due expiries) crosses, once.
        p.When(
            on.holds_any(_MOVED, "crossing", 1),
            (p.Run(outbox.balance_crossings(_moves(on, debits), now)),),
        ),
    ]


def _parts(on: p.Backend, d: FromClause, totals: FromClause, now: BindParameter[Any]) -> Any:
    """The parts of the debits (``d`` and ``totals``: the same rows, ``account_id`` and
    ``total``): each live grant's take in spending order (one window over them), and each
    account's shortfall (``grant_id``, ``account_id``, ``amount``)."""
    before = func.sum(GRANTS.c.remaining_microcents).over(
        partition_by=GRANTS.c.account_id, order_by=order_by(GRANTS), rows=(None, -1)
    )
    live = (
        select(
            GRANTS.c.id,
            GRANTS.c.account_id,
            GRANTS.c.remaining_microcents.label("remaining"),
            totals.c.total,
            cast(func.coalesce(before, 0), BigInteger).label("prior"),
        )
        .select_from(GRANTS.join(totals, GRANTS.c.account_id == totals.c.account_id))
        .where(live_sql(GRANTS, now), totals.c.total > 0)
        .subquery("live")
    )
    left = live.c.total - live.c.prior
    takes = select(
        live.c.id.label("grant_id"),
        live.c.account_id,
        case((live.c.remaining < left, live.c.remaining), else_=left).label("amount"),
    ).where(live.c.prior < live.c.total)
    covered = GRANTS.alias("covered")
    held = (
        select(func.coalesce(func.sum(covered.c.remaining_microcents), 0))
        .where(covered.c.account_id == d.c.account_id, live_sql(covered, now))
        .scalar_subquery()
    )
    shortfalls = select(
        cast(null(), GRANTS.c.id.type).label("grant_id"),
        d.c.account_id,
        (d.c.total - held).label("amount"),
    ).where(d.c.total > held)
    parts = union_all(takes, shortfalls)
    # PostgreSQL: a CTE of the one statement that writes the parts (_allocation_steps).
    return on.choose(
        postgresql=parts.cte("found"),
        sqlite=parts.subquery("found"),
        one_shard=parts.subquery("found"),
    )


_WHOLE = p.Rows("v_whole", (("account_id", ACCOUNTS.c.id.type),))
# On a Citus shard (``ONE_SHARD``): each debit the first grant paid whole, as its grant returned it.
_PAID = p.Rows(
    "v_paid",
    (
        ("account_id", ACCOUNTS.c.id.type),
        ("grant_id", GRANTS.c.id.type),
        ("amount", BigInteger()),
    ),
)
# ... and the debits it did not pay.
_UNPAID = p.Rows("v_unpaid", (("account_id", ACCOUNTS.c.id.type), ("total", BigInteger())))


def _spending_steps(
    on: p.Backend, debits: p.Rows, now: BindParameter[Any], one_account: bool
) -> list[p.Step]:
    """The allocation of ``debits`` over their accounts' live grants (``_parts``).

    On PostgreSQL the most frequent case first (``_first_grant_first``). SQLite, which has no
    lateral joins, runs the general allocation for every debit."""
    first: Callable[[p.Backend, p.Rows, BindParameter[Any]], list[p.Step]] = partial(
        _first_grant_first, one_account=one_account
    )
    return on.choose(postgresql=first, sqlite=_allocated)(on, debits, now)


def _allocated(on: p.Backend, debits: p.Rows, now: BindParameter[Any]) -> list[p.Step]:
    """Every debit by the general allocation."""
    return _allocation_steps(on, _parts(on, on.rows(debits, "d"), on.rows(debits, "dt"), now), now)


def _first_grant_first(
    on: p.Backend, debits: p.Rows, now: BindParameter[Any], one_account: bool = False
) -> list[p.Step]:
    """A debit paid whole by the account's first live grant in spending order (its remainder
    covers the debit, so by ``_parts`` it is the one part), found by one lookup of that grant
    per account (``ORDER BY`` the spending order, ``LIMIT 1``), spent and written as its
    allocation in one statement; on SQLite in two: the grants' update returns what each paid, and
    that is added to the allocation days; on a Citus shard (``ONE_SHARD``: one account, one debit
    at most) the lookup, the grant's update and the allocation each a statement of one table,
    which Citus plans once (a join, a CTE and an UPDATE … FROM it plans twice at every call).
    The debits it did not pay (a take over several grants, a shortfall, or a total of 0) go
    through the general allocation."""
    w = on.rows(debits, "w")

    def first_of(account_id: Any) -> Any:
        """The account's first live grant in spending order (its id and remainder)."""
        return (
            select(GRANTS.c.id, GRANTS.c.remaining_microcents)
            .where(GRANTS.c.account_id == account_id, live_sql(GRANTS, now))
            .order_by(*order_by(GRANTS))
            .limit(1)
        )

    def pays_whole(total: Any, remaining: Any) -> tuple[Any, ...]:
        """The first grant pays the debit whole (its remainder covers a debit above 0)."""
        return (total > 0, remaining >= total)

    first = first_of(w.c.account_id).lateral("first")
    found = (
        select(w.c.account_id, first.c.id.label("grant_id"), w.c.total.label("amount"))
        .select_from(w.join(first, true()))
        .where(*pays_whole(w.c.total, first.c.remaining_microcents))
    )

    def spend(paid: FromClause) -> Any:
        """What the first grants paid (``account_id``, ``grant_id``, ``amount``), added to
        their allocation days."""
        return add_allocations(
            on,
            select(
                paid.c.account_id,
                on.utc_date(now),
                literal(SPEND, String()),
                paid.c.grant_id,
                paid.c.amount,
            ),
        )

    def spent(grant_id: Any, amount: Any) -> Any:
        """The first grant's update by what it pays."""
        return (
            GRANTS.update()
            .values(remaining_microcents=GRANTS.c.remaining_microcents - amount)
            .where(GRANTS.c.id == grant_id)
        )

    def paid_in_one() -> tuple[list[p.Step], p.Rows]:
        whole = found.cte("whole")
        paid = spend(whole).add_cte(spent(whole.c.grant_id, whole.c.amount).cte("spent"))
        paying = paid.returning(ALLOCATIONS.c.account_id)
        return [p.Collect(paying, into=_WHOLE, one_row=one_account)], _WHOLE

    def paid_in_two() -> tuple[list[p.Step], p.Rows]:
        whole = found.subquery("whole")
        returned = (whole.c.account_id, whole.c.grant_id, whole.c.amount)
        return [
            p.Collect(spent(whole.c.grant_id, whole.c.amount).returning(*returned), into=_PAID),
            p.When(on.count(_PAID) > 0, (p.Run(spend(on.rows(_PAID, "pd"))),)),
        ], _PAID

    def paid_by_row() -> tuple[list[p.Step], p.Rows]:
        account = p.Var("v_whole_account_id", ACCOUNTS.c.id.type)
        total = p.Var("v_whole_total", BigInteger())
        grant = p.Var("v_first_grant_id", GRANTS.c.id.type)
        remaining = p.Var("v_first_remaining", BigInteger())
        updated = p.Var("v_first_updated", GRANTS.c.id.type)
        paid = {"account_id": account.ref, "grant_id": grant.ref, "amount": total.ref}
        return [
            *_PAID.emptied(),
            p.ForEach(
                select(w.c.account_id, w.c.total),
                into=(account, total),
                steps=(
                    p.Fetch(first_of(account.ref), into=(grant, remaining)),
                    p.When(
                        and_(*pays_whole(total.ref, remaining.ref)),
                        (
                            p.Fetch(
                                spent(grant.ref, total.ref).returning(GRANTS.c.id), into=(updated,)
                            ),
                            p.When(updated.ref.isnot(None), _PAID.appended(paid)),
                        ),
                    ),
                ),
            ),
            p.When(on.count(_PAID) > 0, (p.Run(spend(on.rows(_PAID, "pd"))),)),
        ], _PAID

    # The steps that pay, and the rows of the debits they paid.
    pay, done = on.choose(postgresql=paid_in_one, sqlite=paid_in_two, one_shard=paid_by_row)()

    def unpaid(alias: str) -> FromClause:
        rows, paid_rows = on.rows(debits, f"{alias}r"), on.rows(done, f"{alias}w")
        return (
            select(rows.c.account_id, rows.c.total)
            .where(rows.c.account_id.not_in(select(paid_rows.c.account_id)))
            .subquery(alias)
        )

    def rest_read() -> list[p.Step]:
        return _allocation_steps(on, _parts(on, unpaid("d"), unpaid("dt"), now), now)

    def rest_collected() -> list[p.Step]:
        # On a Citus shard the debits left are collected first, by a statement of no table
        # (PostgreSQL's alone): as a subquery of the allocation's insert, Citus would compute
        # them first and copy them to every node, as it does a CTE.
        left = unpaid("u")
        return [
            p.Collect(select(left.c.account_id, left.c.total), into=_UNPAID),
            *_allocation_steps(
                on, _parts(on, on.rows(_UNPAID, "d"), on.rows(_UNPAID, "dt"), now), now
            ),
        ]

    rest = on.choose(postgresql=rest_read, sqlite=rest_collected, one_shard=rest_collected)()
    return [*pay, p.When(on.count(done) < on.count(debits), tuple(rest))]


def _kind(parts: FromClause) -> Any:
    """A part's allocation kind: a grant's take is ``spend``, a shortfall (no grant) ``deficit``."""
    return case((parts.c.grant_id.is_(None), DEFICIT), else_=SPEND)


def _allocation_steps(on: p.Backend, found: FromClause, now: BindParameter[Any]) -> list[p.Step]:
    """The parts ``found`` (each grant's take, and each account's shortfall: ``grant_id``,
    ``account_id``, ``amount``) are added to the allocation days, and move the grants'
    remainders and the deficits. On PostgreSQL one statement: the parts are computed once (a
    CTE, so the grants are read before they move) and the two updates are data-modifying CTEs
    of the insert. On SQLite, which has no such CTEs, and on a Citus shard (``ONE_SHARD``: such
    a statement would copy its CTE to every node), the parts are collected first (the upsert's
    ``RETURNING`` would give the day's sums, not the parts), then added, and the updates run
    from them (the deficit's only when there is a shortfall)."""

    def allocation(parts: FromClause) -> Any:
        return add_allocations(
            on,
            select(
                parts.c.account_id,
                on.utc_date(now),
                _kind(parts),
                func.coalesce(parts.c.grant_id, NO_GRANT),
                parts.c.amount,
            ),
        )

    def spent(parts: FromClause) -> Any:
        return (
            GRANTS.update()
            .values(remaining_microcents=GRANTS.c.remaining_microcents - parts.c.amount)
            .where(GRANTS.c.id == parts.c.grant_id)
        )

    def owed(parts: FromClause) -> Any:
        return (
            ACCOUNTS.update()
            .values(deficit_microcents=ACCOUNTS.c.deficit_microcents + parts.c.amount)
            .where(ACCOUNTS.c.id == parts.c.account_id, parts.c.grant_id.is_(None))
        )

    def in_one() -> list[p.Step]:
        return [
            p.Run(allocation(found).add_cte(spent(found).cte("spent"), owed(found).cte("owed")))
        ]

    def collected_first() -> list[p.Step]:
        parts = on.rows(_PARTS, "pt")
        collected = select(
            found.c.grant_id,
            found.c.account_id,
            found.c.amount,
            _kind(found).label("kind"),
        )
        return [
            p.Collect(collected, into=_PARTS),
            p.When(
                on.count(_PARTS) > 0,
                (p.Run(allocation(on.rows(_PARTS, "pa"))), p.Run(spent(parts))),
            ),
            p.When(on.holds_any(_PARTS, "kind", DEFICIT), (p.Run(owed(parts)),)),
        ]

    return on.choose(postgresql=in_one, sqlite=collected_first, one_shard=collected_first)()


def _moves(on: p.Backend, debits: p.Rows) -> Any:
    """Each debited account's balance before the move (what its update returned plus the
    debit) and after it (the balance now, due expiries included), under its row lock."""
    moved = on.rows(_MOVED, "mv")
    d = on.rows(debits, "md")
    now_balance = ACCOUNTS.alias("nb")
    return (
        select(
            moved.c.account_id,
            (moved.c.after_microcents + d.c.total).label("before_microcents"),
            now_balance.c.balance_microcents.label("after_microcents"),
        )
        .select_from(
            moved.join(d, d.c.account_id == moved.c.account_id).join(
                now_balance, now_balance.c.id == moved.c.account_id
            )
        )
        .subquery("m")
    )


# -- The program for debits outside settlement: a negative adjustment, or due expiries alone. --

NOW = p.Var("p_now", UTCDateTime())
DEBITS_IN = p.Records("p_debits", (("account_id", ACCOUNTS.c.id.type), ("total", BigInteger())))
_DEBITS = p.Rows("v_debits", DEBITS_IN.columns)


def _spend_credit(on: p.Backend) -> list[p.Step]:
    given = on.records(DEBITS_IN, "g")
    return [
        p.Collect(
            select(given.c.account_id, given.c.total), into=_DEBITS, order_by=("account_id",)
        ),
        lock_accounts(on, _DEBITS, "ld"),
        *debit_steps(on, _DEBITS, NOW.ref),
    ]


SPEND_CREDIT = p.Program("metering_spend_credit", params=(NOW, DEBITS_IN), build=_spend_credit)
# On a Citus cluster (metering.citus), inside the transaction of the spend's unit of work.
SPEND_CREDIT_OF_ACCOUNT = of_account(SPEND_CREDIT, delegated=False)
_SPEND = Forms.of_program(SPEND_CREDIT, SPEND_CREDIT_OF_ACCOUNT)


def spend(session: Session, debits: dict[str, int], now: datetime) -> None:
    """Debit accounts (id → amount ≥ 0; 0 only writes their due expiries) in the session's
    transaction (``SPEND_CREDIT``: one round trip on PostgreSQL; on a Citus cluster one per
    account, each routed to its shard)."""
    rows: list[dict[str, Any]] = [{"account_id": a, "total": t} for a, t in sorted(debits.items())]
    if not is_cluster(session):
        _debit(session, rows, now)
        return
    for row in rows:  # in byte order of account, as every debit locks accounts
        _debit(session, [row], now, str(row["account_id"]))


def _debit(
    session: Session, rows: list[dict[str, Any]], now: datetime, account_id: str | None = None
) -> None:
    _SPEND.rows(
        session,
        lambda on: {NOW.name: now, DEBITS_IN.name: p.records_json(DEBITS_IN, rows, on)},
        account_id,
    )
