"""The check-and-hold, the void and the tidy-up, each defined once (metering.programs): the
same statements run on SQLite inside the unit of work and, on PostgreSQL, as the function
``metering_place_holds`` (one round trip) and plain statements.

**The held counter.** Each account row keeps ``held_microcents``, the sum of its *counted* holds,
so the check is O(1) whatever the number of holds in flight. Placing a hold counts it; releasing
one (void, settlement, tidy-up) only changes its status (metering.states.holds) and never waits
for the account's lock. The account's next check-and-hold, holding that lock, first stops
counting the holds released since and those past their ``expires_at`` (which become 'expired':
lazy expiry), then decides. So an active hold always counts, a released one never does by the
time it matters, and the counter equals the sum of the holds it counts (``metering verify``).

**One call, several holds.** ``PLACE_HOLDS`` takes holds of any accounts: it visits them in byte
order of account id (the order settlement locks accounts in, so the two cannot deadlock), locks
each account once (``FOR NO KEY UPDATE``: rows that merely reference it can still be inserted),
and decides each hold as if alone, in the order given. Each statement takes a fresh snapshot after
the lock (READ COMMITTED), so it sees every hold, release and charge committed before it.

**No deadlock.** Releases lock holds after the account, but skip (``SKIP LOCKED``) a hold that
another transaction holds: one being settled or tidied up right now counts until the account's
next check — never credit that is not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    String,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    column,
    exists,
    false,
    func,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, array, insert
from sqlalchemy.sql.elements import ColumnElement

from metering import programs as p
from metering.accounts.access import in_flight_limited
from metering.accounts.spend import Scope, charges_rows, per_scope
from metering.citus import of_account
from metering.kit.ranges import INT64_MAX, INT64_MIN
from metering.ledger.resolution import STAMP_NAMES, resolution_text_apart, stamp_broken
from metering.ledger.spending import without_pending_expiries
from metering.models import Account, Authorization, table
from metering.models.base import UTCDateTime
from metering.states import holds
from metering.states.holds import HoldStatus

HOLDS = table(Authorization)
ACCOUNTS = table(Account)


class Outcome(StrEnum):
    GRANTED = "granted"
    INSUFFICIENT_CREDITS = "insufficient_credits"
    # The spend limits, checked in this order: the key's project's, its member's (over all of
    # the member's keys), the key's own; each over its own window.
    PROJECT_SPEND_LIMIT = "project_spend_limit"
    MEMBER_SPEND_LIMIT = "member_spend_limit"
    KEY_SPEND_LIMIT = "key_spend_limit"
    CONCURRENCY_LIMIT = "concurrency_limit_exceeded"
    EXISTS = "exists"  # the account already has a hold with this request id
    STALE = "stale"  # the remembered resolution it was estimated from no longer holds
    # The account's held sum would leave the signed 64-bit range (unbilled accounts; a prepaid
    # account's holds never exceed its balance).
    OUT_OF_RANGE = "out_of_range"


@dataclass(frozen=True, slots=True)
class Placement:
    """A hold's outcome; ``available``: the account's balance minus its holds in force, before
    this one; ``spent``: for a hold refused by a spend limit, the charges in that limit's window
    plus the holds in force of what it limits (the project's, the member's or the key's)."""

    outcome: Outcome
    available: int
    spent: int | None = None


# The columns an authorization writes into a hold (the rest are the state machine's).
_STATE_COLUMNS = ("status", "closed_at", "usage_event_id", "counted", "unused_noticed")
HOLD_COLUMNS = tuple(c.name for c in HOLDS.columns if c.name not in _STATE_COLUMNS)
# The gateway's view of a hold (metering.ledger.authorizations.hold_body).
BODY_COLUMNS = (
    "id",
    "status",
    "request_id",
    "account_id",
    "api_key_id",
    "model_id",
    "max_tokens",
    "estimate_microcents",
    "expires_at",
)

# What the check-and-hold is given for each hold besides the hold itself: the key's spend limit
# and the window it applies to, its project's and its member's with theirs, and what confirms
# the remembered resolution it was estimated from (null: resolved afresh): on one PostgreSQL
# server its stamp (metering.ledger.resolution.Stamp), on a Citus cluster its text with what it
# was read for.
_EXTRA: p.RowColumns = (
    ("spend_limit", BigInteger()),
    ("window_start", UTCDateTime()),
    ("window_end", UTCDateTime()),
    ("project_id", String()),
    ("project_limit", BigInteger()),
    ("project_window_start", UTCDateTime()),
    ("project_window_end", UTCDateTime()),
    ("member_id", String()),
    ("member_limit", BigInteger()),
    ("member_window_start", UTCDateTime()),
    ("member_window_end", UTCDateTime()),
    ("resolution", Text()),
    ("secret_hash", String()),
    ("model_key", String()),
    ("generation", BigInteger()),
    ("model_generation", BigInteger()),
    ("valid_from", UTCDateTime()),
    ("valid_until", UTCDateTime()),
)
HOLDS_IN = p.Records("p_holds", (*((name, HOLDS.c[name].type) for name in HOLD_COLUMNS), *_EXTRA))
NOW = p.Var("p_now", UTCDateTime())
_BOTTOM = cast(literal(INT64_MIN, BigInteger()), BigInteger())  # a BIGINT, not a numeric
_NO_AMOUNT = cast(null(), BigInteger())


def holds_in_force_rows(account_id: Any, at: Any) -> Select[Any]:
    """The account's holds in force at ``at`` as amounts of ``metering.accounts.spend.per_scope``
    (``api_key_id``, ``amount``: the estimate; ``day`` null: a hold in force counts in every
    window)."""
    return select(
        HOLDS.c.api_key_id,
        HOLDS.c.estimate_microcents.label("amount"),
        cast(null(), UTCDateTime()).label("day"),
    ).where(HOLDS.c.account_id == account_id, holds.in_force(HOLDS, at))


def recount(
    on: p.Backend,
    chosen: Any,
    account: p.Var,
    condition: ColumnElement[bool],
    into: p.Var,
    count: p.Var,
    **values: Any,
) -> tuple[p.Step, ...]:
    """The account's holds that meet ``condition`` (over ``chosen``, an alias of the holds)
    changed to ``values``, skipping those another transaction has locked, the sum of their
    estimates into ``into`` and their number into ``count``.

    On PostgreSQL and SQLite one UPDATE whose subquery locks them, and the sum of what it
    returns. On a Citus shard the same rows are locked by a SELECT of their own and summed as
    they are read, then updated by id: two statements of one table filtered by the account,
    which Citus plans once for all calls (its fast path: metering.citus.one_account), where it
    plans an UPDATE with a subquery twice at every call (docs/citus.md)."""
    picked = select(chosen.c.id).where(chosen.c.account_id == account.ref, condition)
    in_one = (
        p.Sum(
            update(HOLDS)
            .where(HOLDS.c.id.in_(picked.with_for_update(key_share=True, skip_locked=True)))
            .values(**values)
            .returning(HOLDS.c.estimate_microcents),
            "estimate_microcents",
            into,
            count=count,
        ),
    )
    ids = p.Var(f"{into.name}_ids", ARRAY(HOLDS.c.id.type))
    hold_id = p.Var(f"{into.name}_id", HOLDS.c.id.type)
    amount = p.Var(f"{into.name}_amount", BigInteger())
    by_row = (
        p.Assign(into, literal(0, BigInteger())),
        p.Assign(count, literal(0, BigInteger())),
        p.Assign(ids, array([], type_=HOLDS.c.id.type)),
        p.ForEach(
            picked.add_columns(chosen.c.estimate_microcents).with_for_update(
                key_share=True, skip_locked=True
            ),
            into=(hold_id, amount),
            steps=(
                p.Assign(into, into.ref + amount.ref),
                p.Assign(count, count.ref + 1),
                p.Assign(ids, func.array_append(ids.ref, hold_id.ref)),
            ),
        ),
        p.When(
            count.ref != 0,
            (p.Run(update(HOLDS).where(HOLDS.c.id == any_(ids.ref)).values(**values)),),
        ),
    )
    return on.choose(postgresql=in_one, sqlite=in_one, one_shard=by_row)


def adopt_unbilled(
    on: p.Backend,
    account: p.Var,
    billing: p.Var,
    now: p.Var,
    held: p.Var,
    count: p.Var,
    changed: p.Var,
    adopted: p.Var,
    adopted_count: p.Var,
) -> p.When:
    """An unbilled account's active holds placed without the lock (while it had no concurrency
    limit) start being counted, so its requests in flight are all counted from now on
    (metering.accounts.access). Locked ones are skipped, as every release skips them."""
    chosen = HOLDS.alias("uncounted")
    return p.When(
        billing.ref == "unbilled",
        (
            *recount(
                on,
                chosen,
                account,
                and_(holds.in_force(chosen, now.ref), ~chosen.c.counted),
                adopted,
                adopted_count,
                counted=True,
            ),
            p.Assign(held, held.ref + adopted.ref),
            p.Assign(count, count.ref + adopted_count.ref),
            p.Assign(changed, changed.ref | (adopted_count.ref != 0)),
        ),
    )


def _place_holds(on: p.Backend) -> list[p.Step]:
    given = on.records(HOLDS_IN, "h")
    h = {name: p.Var(f"v_h_{name}", kind) for name, kind in HOLDS_IN.columns}
    account = p.Var("v_account_id", String())
    balance, held = p.Var("v_balance", BigInteger()), p.Var("v_held", BigInteger())
    released, expired = p.Var("v_released", BigInteger()), p.Var("v_expired", BigInteger())
    # metering.accounts.access: the holds counted, the account's limit and billing.
    count, limit = p.Var("v_count", BigInteger()), p.Var("v_limit", Integer())
    billing = p.Var("v_billing", String())
    # The account's marks (metering.models.accounts): whether its projects and members can
    # change what its keys resolve to, and so whether a confirmation reads them.
    scope_limits = p.Var("v_scope_limits", Boolean())
    project_models = p.Var("v_project_models", Boolean())
    current = p.Var("v_resolution", Text())  # a remembered resolution's text, read again
    generation = p.Var("v_generation", BigInteger())  # the account's resolution_generation
    released_count = p.Var("v_released_count", BigInteger())
    expired_count = p.Var("v_expired_count", BigInteger())
    adopted = p.Var("v_adopted", BigInteger())
    adopted_count = p.Var("v_adopted_count", BigInteger())
    available = p.Var("v_available", BigInteger())
    next_expiry = p.Var("v_next_expiry", UTCDateTime())
    changed, outcome = p.Var("v_changed", Boolean()), p.Var("v_outcome", String())
    locked = HOLDS.alias("locked")

    def release(
        condition: ColumnElement[bool], into: p.Var, into_count: p.Var, **values: Any
    ) -> tuple[p.Step, ...]:
        """Stop counting the account's holds that meet ``condition``, skipping locked ones."""
        return recount(on, locked, account, condition, into, into_count, counted=False, **values)

    flush = p.When(
        changed.ref,
        (
            p.Run(
                update(ACCOUNTS)
                .where(ACCOUNTS.c.id == account.ref)
                .values(held_microcents=held.ref, held_count=count.ref)
            ),
        ),
    )
    # The account's row, locked; on one server with its resolution generation (what a stamp is
    # confirmed by), on a Citus shard with its marks (what a text is recomputed from).
    read_with_account: dict[p.Var, Any] = on.choose(
        postgresql={generation: ACCOUNTS.c.resolution_generation},
        sqlite={},
        one_shard={
            scope_limits: ACCOUNTS.c.scope_limits,
            project_models: ACCOUNTS.c.project_models,
        },
    )
    take_account = p.When(
        h["account_id"].ref.is_distinct_from(account.ref),
        (
            flush,
            p.Assign(account, h["account_id"].ref),
            p.Fetch(
                select(
                    ACCOUNTS.c.balance_microcents,
                    ACCOUNTS.c.held_microcents,
                    ACCOUNTS.c.held_count,
                    ACCOUNTS.c.max_concurrent_requests,
                    ACCOUNTS.c.billing,
                    ACCOUNTS.c.next_expiry_at,
                    *read_with_account.values(),
                )
                .where(ACCOUNTS.c.id == account.ref)
                .with_for_update(key_share=True),
                into=(balance, held, count, limit, billing, next_expiry, *read_with_account),
                required="no such account",
            ),
            # Grants expired at this instant count no more, their forfeits written or not.
            without_pending_expiries(balance, next_expiry, account, NOW),
            *release(holds.released(locked), released, released_count),
            *release(
                and_(holds.past_expiry(locked, NOW.ref), locked.c.counted),
                expired,
                expired_count,
                status=holds.target("expire"),
            ),
            p.Assign(held, held.ref - released.ref - expired.ref),
            p.Assign(count, count.ref - released_count.ref - expired_count.ref),
            p.Assign(changed, (released_count.ref != 0) | (expired_count.ref != 0)),
            adopt_unbilled(on, account, billing, NOW, held, count, changed, adopted, adopted_count),
        ),
    )
    estimate = h["estimate_microcents"].ref

    # A remembered resolution confirmed under the account's lock (metering.ledger.resolution).
    # On one server by its stamp: a CASE branch of the decision, which reads the model's
    # generation (the account's was read with its row).
    stamped = stamp_broken(
        {name: h[name].ref for name in STAMP_NAMES},
        generation.ref,
        h["model_id"].ref,
        h["created_at"].ref,
    )

    # On a Citus shard by its text, read again at the hold's instant by statements of one table
    # each, which Citus plans once, where it plans the resolution's join (and its subqueries)
    # twice at every call (metering.citus.apart); with the key's project and member only when the
    # account's marks say they can matter.
    def read_again(scoped: bool) -> tuple[p.Step, ...]:
        at = (h["secret_hash"].ref, h["model_key"].ref, h["created_at"].ref)
        return resolution_text_apart(*at, current, scoped=scoped)

    confirm = p.When(
        h["resolution"].ref.isnot(None),
        (p.When(scope_limits.ref | project_models.ref, read_again(True), read_again(False)),),
    )
    recomputed = and_(
        h["resolution"].ref.isnot(None), current.ref.is_distinct_from(h["resolution"].ref)
    )
    # SQLite never confirms (its authorizations read afresh, metering.ledger.placement.sqlite),
    # and each step there is a statement of its own.
    confirming, stale_checks = on.choose(
        postgresql=((), ((stamped, Outcome.STALE.value),)),
        sqlite=((), ()),
        one_shard=((confirm,), ((recomputed, Outcome.STALE.value),)),
    )
    # The checks of docs/api.md#post-v1authorizations in their order, as CASE branches (the spend
    # limit's below).
    # Whether the account has a hold of this request id: a subquery of the decision's CASE, or,
    # on a Citus shard, a statement of its own before it (one table filtered by the account,
    # Citus' fast path, where a subquery in an expression is planned in full twice at each call:
    # metering.citus.one_account); the same answer, as nothing changes the holds in between.
    duplicate = (HOLDS.c.account_id == account.ref, HOLDS.c.request_id == h["request_id"].ref)
    known = p.Var("v_known", Boolean())
    look_up, request_known = on.choose(
        postgresql=((), exists().where(*duplicate)),
        sqlite=((), exists().where(*duplicate)),
        one_shard=(
            (p.Fetch(select(true()).select_from(HOLDS).where(*duplicate).limit(1), into=(known,)),),
            known.ref.isnot(None),
        ),
    )
    decide_checks = (
        *stale_checks,
        (and_(h["request_id"].ref.isnot(None), request_known), Outcome.EXISTS.value),
        # Ranges (docs/api.md#ranges): an account that is not refused for credit (unbilled, here
        # only with a concurrency limit) takes its held sum no further than a signed 64-bit integer;
        # written so that the comparison cannot overflow itself (estimates are >= 0). Before the
        # 429: it is the estimate's 400.
        (
            and_(
                billing.ref != "prepaid",
                estimate > literal(INT64_MAX, BigInteger()) - held.ref,
            ),
            Outcome.OUT_OF_RANGE.value,
        ),
        (in_flight_limited(count.ref, limit.ref), Outcome.CONCURRENCY_LIMIT.value),
        # Unbilled accounts (here only when they have a concurrency limit) skip the 402s.
        (
            and_(billing.ref == "prepaid", estimate > available.ref),
            Outcome.INSUFFICIENT_CREDITS.value,
        ),
    )
    # The last checks: the project's, the member's and the key's spend limits, each in its
    # window, in that order; a limit is checked only when it is set (null: none).
    limits = {
        Outcome.PROJECT_SPEND_LIMIT: (
            h["project_limit"].ref,
            Scope(
                "project",
                "project_id",
                h["project_id"].ref,
                h["project_window_start"].ref,
                h["project_window_end"].ref,
            ),
        ),
        Outcome.MEMBER_SPEND_LIMIT: (
            h["member_limit"].ref,
            Scope(
                "member",
                "member_id",
                h["member_id"].ref,
                h["member_window_start"].ref,
                h["member_window_end"].ref,
            ),
        ),
        Outcome.KEY_SPEND_LIMIT: (
            h["spend_limit"].ref,
            Scope("key", "id", h["api_key_id"].ref, h["window_start"].ref, h["window_end"].ref),
        ),
    }

    def spent_by(scopes: Sequence[Scope]) -> Select[Any]:
        """What each scope has spent (a column by its name): its charges in its window plus
        the estimates of its holds in force, in one scan of each."""
        at = h["created_at"].ref
        rows = union_all(charges_rows(account.ref, scopes), holds_in_force_rows(account.ref, at))
        return per_scope(account.ref, rows.subquery("spent"), scopes)

    # What each scope has spent: on PostgreSQL read for all three scopes at once into these
    # variables (below), on SQLite a subquery of each scope's own, read where its CASE branch
    # is taken.
    read = {
        outcome_: p.Var(f"v_{scope.name}_spent", BigInteger())
        for outcome_, (_, scope) in limits.items()
    }
    spent: dict[Outcome, ColumnElement[Any]] = on.choose(
        postgresql={outcome_: var.ref for outcome_, var in read.items()},
        sqlite={
            outcome_: spent_by([scope]).scalar_subquery() for outcome_, (_, scope) in limits.items()
        },
    )

    def over(limit: Any, scope_spent: Any) -> ColumnElement[bool]:
        return and_(billing.ref == "prepaid", limit.isnot(None), scope_spent + estimate > limit)

    limited = [(over(limit, spent[scope]), scope.value) for scope, (limit, _) in limits.items()]
    # The decision, then the spend limits' checks. On PostgreSQL these are a step of their own,
    # taken only by a prepaid account's hold that passed every check before them and has a
    # limit set: PL/pgSQL starts every subquery of an expression it runs as a query (index
    # scans opened and all) whether its branch is taken or not, so in the CASE the spend-limit
    # sums would cost every hold, limited or not. The step reads what the three scopes spent
    # in one statement (the account's rollups and holds each scanned once, joined to their
    # keys once), then checks the limits in their order on the variables. On SQLite the CASE is
    # the cheaper form (each step there is a statement of its own).
    spend_check = p.When(
        and_(
            outcome.ref == Outcome.GRANTED.value,
            billing.ref == "prepaid",
            or_(*(limit.isnot(None) for limit, _ in limits.values())),
        ),
        (
            p.Fetch(spent_by([scope for _, scope in limits.values()]), into=tuple(read.values())),
            p.Assign(outcome, case(*limited, else_=Outcome.GRANTED.value)),
        ),
    )
    decide, spend_checks = on.choose(
        postgresql=(case(*decide_checks, else_=Outcome.GRANTED.value), (spend_check,)),
        sqlite=(case(*decide_checks, *limited, else_=Outcome.GRANTED.value), ()),
    )
    grant = p.When(
        outcome.ref == Outcome.GRANTED.value,
        (
            p.Run(
                HOLDS.insert().values(
                    {
                        **{name: h[name].ref for name in HOLD_COLUMNS},
                        "status": HoldStatus.ACTIVE.value,
                        "counted": True,
                    }
                )
            ),
            p.Assign(held, held.ref + estimate),
            p.Assign(count, count.ref + 1),
            p.Assign(changed, true()),
        ),
    )
    # What a refused scope spent (its 402 says it): on PostgreSQL the variables its check read,
    # on SQLite its subquery again.
    emitted_spent = case(
        *((outcome.ref == scope.value, spent[scope]) for scope in limits), else_=_NO_AMOUNT
    )
    return [
        p.ForEach(
            select(*(given.c[name] for name in HOLDS_IN.names)).order_by(
                p.byte_order(given.c.account_id), given.c.position
            ),
            into=tuple(h.values()),
            steps=(
                take_account,
                # balance − held, or the bottom of the range when that would pass it (a
                # balance driven far below zero while holds counted): never an overflow.
                p.Assign(
                    available,
                    case(
                        (
                            balance.ref < _BOTTOM + held.ref,
                            _BOTTOM,
                        ),
                        else_=balance.ref - held.ref,
                    ),
                ),
                *confirming,
                *look_up,
                p.Assign(outcome, decide),
                *spend_checks,
                grant,
                p.Emit((h["id"].ref, outcome.ref, available.ref, emitted_spent)),
            ),
        ),
        flush,
    ]


PLACE_HOLDS = p.Program(
    "metering_place_holds",
    params=(NOW, HOLDS_IN),
    build=_place_holds,
    returns=(
        ("hold_id", String()),
        ("outcome", String()),
        ("available", BigInteger()),
        ("spent", BigInteger()),
    ),
    initial={"v_changed": False},
)
PLACE_HOLDS_OF_ACCOUNT = of_account(PLACE_HOLDS)  # on a Citus cluster (metering.citus)


# -- The other statements of a hold's life: each one statement, the same on both backends. -----

_HOLD_ID = bindparam("hold_id", type_=String())
_NOW = bindparam("now", type_=UTCDateTime())
_ACCOUNT_ID = bindparam("b_account_id", type_=String())  # not "account_id": a column

# Unbilled accounts always pass: their holds are recorded (not counted), without any lock, as
# long as the account's held sum stays in range (metering.kit.ranges): the holds in force and
# this one within a signed 64-bit integer. The check is written so that it cannot overflow
# itself (estimates are >= 0); no row inserted and no request id taken means it refused.
_UNBILLED = {name: bindparam(name, type_=HOLDS.c[name].type) for name in HOLD_COLUMNS}
_in_force = HOLDS.alias("in_force")
# Read from the account's own row (its id as the hold's account): on a Citus cluster an insert
# that selects the sharding column from a colocated table runs whole on the account's shard.
INSERT_UNBILLED = (
    insert(HOLDS)
    .from_select(
        [*HOLD_COLUMNS, "status", "counted"],
        select(
            *(ACCOUNTS.c.id if name == "account_id" else _UNBILLED[name] for name in HOLD_COLUMNS),
            literal(HoldStatus.ACTIVE.value, String()),
            false(),
        ).where(
            ACCOUNTS.c.id == _UNBILLED["account_id"],
            select(func.coalesce(func.sum(_in_force.c.estimate_microcents), 0))
            .where(
                _in_force.c.account_id == _UNBILLED["account_id"],
                holds.in_force(_in_force, _UNBILLED["created_at"]),
            )
            .scalar_subquery()
            <= literal(INT64_MAX, BigInteger()) - _UNBILLED["estimate_microcents"],
        ),
    )
    .on_conflict_do_nothing(index_elements=["account_id", "request_id"])
    .returning(HOLDS.c.id)
)
# The account's holds in force: what ``GET /v1/credits`` shows as held (to name the field that
# takes it out of range).
HELD_IN_FORCE = select(func.coalesce(func.sum(_in_force.c.estimate_microcents), 0)).where(
    _in_force.c.account_id == _ACCOUNT_ID, holds.in_force(_in_force, _NOW)
)
BY_REQUEST_ID = select(*(HOLDS.c[name] for name in (*BODY_COLUMNS, "request_fingerprint"))).where(
    HOLDS.c.account_id == _ACCOUNT_ID, HOLDS.c.request_id == bindparam("request_id", type_=String())
)


def void(hold_id: Any, now: Any) -> Any:
    """A void: it releases the active hold ``hold_id`` in force at ``now``; the account's
    counter is left to its next check."""
    return (
        update(HOLDS)
        .where(HOLDS.c.id == hold_id, holds.in_force(HOLDS, now))
        .values(status=holds.target("void"), closed_at=now)
        .returning(*(HOLDS.c[name] for name in BODY_COLUMNS))
    )


VOID = void(_HOLD_ID, _NOW)
_VOIDED_HOLD = p.Var("p_hold_id", String())
_VOIDED_AT = p.Var("p_now", UTCDateTime())
_VOIDED = tuple(p.Var(f"v_voided_{name}", HOLDS.c[name].type) for name in BODY_COLUMNS)


def _void(on: p.Backend) -> list[p.Step]:
    return [
        p.Fetch(void(_VOIDED_HOLD.ref, _VOIDED_AT.ref), into=_VOIDED),
        p.When(_VOIDED[0].ref.is_not(None), (p.Emit(tuple(v.ref for v in _VOIDED)),)),
    ]


# On a Citus cluster, a void as a call delegated to the account's node: there its statement's
# plan is kept between calls, where the statement sent as text was planned at every void.
VOID_OF_ACCOUNT = of_account(
    p.Program(
        "metering_void",
        params=(_VOIDED_HOLD, _VOIDED_AT),
        build=_void,
        returns=tuple((name, HOLDS.c[name].type) for name in BODY_COLUMNS),
    )
)
BY_ID = select(*(HOLDS.c[name] for name in BODY_COLUMNS)).where(HOLDS.c.id == _HOLD_ID)
# Voids that arrive together (PostgreSQL, metering.ledger.placement.postgres): each asked hold
# voided as VOID voids it, at its own request's instant, in one statement; then those it did not
# void read as BY_ID reads them, by a statement of their own (a snapshot taken after the update,
# as a lone void's).
_HOLD_IDS = bindparam("hold_ids", type_=ARRAY(String()))
_asked = (
    func.unnest(_HOLD_IDS, bindparam("nows", type_=ARRAY(UTCDateTime())))
    .table_valued(column("id", String()), column("now", UTCDateTime()))
    .render_derived()
    .alias("asked")
)
VOID_TOGETHER = (
    update(HOLDS)
    .where(HOLDS.c.id == _asked.c.id, holds.in_force(HOLDS, _asked.c.now))
    .values(status=holds.target("void"), closed_at=_asked.c.now)
    .returning(*(HOLDS.c[name] for name in BODY_COLUMNS))
)
BY_IDS = select(*(HOLDS.c[name] for name in BODY_COLUMNS)).where(HOLDS.c.id == any_(_HOLD_IDS))
# The tidy-up: holds past their expiry are marked expired. Locked ones are skipped, never waited
# for (a check-and-hold expiring them itself, a settlement), so it takes part in no deadlock.
_overdue = HOLDS.alias("overdue")
EXPIRE = (
    update(HOLDS)
    .where(
        HOLDS.c.id.in_(
            select(_overdue.c.id)
            .where(holds.past_expiry(_overdue, _NOW))
            .with_for_update(skip_locked=True)
        )
    )
    .values(status=holds.target("expire"))
)
