"""Recording usage: the event row, its insert, the rollup upsert and the two programs that book
a recorded event's charge and aggregates, each defined once (metering.programs) and run on
both backends.

* ``SETTLE_USAGE`` (the batch path): the charges of events just inserted (settled, debited) and
  their rollup rows, in the caller's transaction after the insert.
* ``RECORD_USAGE`` (one event, PostgreSQL's lean path): the insert, and only if the event was
  new, the same settlement and rollups, as one statement and one transaction.

Both end with the spend-limit thresholds the charges count against
(``spend_limit.threshold_reached``, metering.notifications.spend_limits): no statement when no
key, project or member of the batch has a limit.

The columns come from the tables: an event row is every column of ``usage_events`` but its id
and ``recorded_at`` (the statement's ``now``); a rollup row is every column of
``usage_rollups`` (metering.usage.rollups). The programs take the usage summed per account,
key, model and hour (``HOURLY_IN``) and spread it over the six rows each hour counts in
(``rollup_upsert``, one event's hour ``hour_rollup_steps``: bucket width {1h, 1d} × grouping
{key_model, key, model}, each row's key by ``_rollup_key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, BigInteger, FromClause, and_, case, cast, func, select, true
from sqlalchemy.orm import Session

from metering import programs as p
from metering.citus import by_account, of_account
from metering.db import is_cluster
from metering.forms import Forms
from metering.ledger.settlement import CHARGES_IN, ChargeToSettle, settle_steps
from metering.models import UsageEvent, table
from metering.models.base import UTCDateTime
from metering.notifications import spend_limits
from metering.notifications.spend_limits import ScopeLimit
from metering.usage import rollups
from metering.usage.rollups import (
    COUNTERS,
    GROUPINGS,
    HOURLY_IN,
    LAST_EVENT,
    ROLLUP_KEY,
    ROLLUPS,
    WIDTHS,
)

EVENTS = table(UsageEvent)

EVENT_COLUMNS = tuple(c.name for c in EVENTS.columns if c.name not in ("id", "recorded_at"))
EVENTS_IN = p.Records("p_events", tuple((name, EVENTS.c[name].type) for name in EVENT_COLUMNS))
# Text columns of an event whose values need no escaping in its JSON: request_id matched its
# pattern, api and outcome their lists.
EVENT_VERBATIM = ("request_id", "api", "outcome")
# The dedup key (docs/api.md#post-v1usageevents): unique forever.
EVENT_KEY = ("account_id", "request_id")

NOW = p.Var("p_now", UTCDateTime())
PREPAID = p.Var("p_prepaid", p.Boolean())
# What the insert hands back of each new event: to the programs that settle it, and (its id and
# dedup key) to a batch's caller, which has the rest.
_RETURNED = ("id", "account_id", "request_id", "api_key_id", "authorization_id", "total_microcents")
NEW_KEYS = ("id", *EVENT_KEY)


def insert_events(
    on: p.Backend, rows: FromClause, returned: Sequence[str] = _RETURNED, sort: bool = False
) -> Any:
    """Insert ``rows`` (``EVENTS_IN``'s columns) with ``ON CONFLICT DO NOTHING``, so a row that
    already stands, or that a concurrent batch is inserting, wins cleanly; returns the new
    events' ``returned`` columns (those that conflicted are not among them).

    The rows are inserted in the order their relation gives them, which is their records' order (as
    the caller gave them: a batch's by key): a program's arrays are unnested in step and handed on
    as they are read, and an ``INSERT … SELECT`` is never run in parallel. So concurrent batches
    meet each other's keys in one order, with no sort of every row first (a sort by ``position`` was
    4% of PostgreSQL's instructions per event in a batch); a deadlock would in any case be tried
    again (metering.db). ``sort``: by ``position`` all the same (the few single events gathered from
    a JSON document: their sort costs nothing measurable, and their rate in the ingest benchmark was
    lower without it in three alternated comparisons, within its noise)."""
    source = select(*(rows.c[name] for name in EVENT_COLUMNS), NOW.ref).where(
        true()  # SQLite: ON CONFLICT after a SELECT needs a WHERE
    )
    if sort:
        source = source.order_by(rows.c.position)
    return (
        on.insert(EVENTS)
        .from_select([*EVENT_COLUMNS, "recorded_at"], source)
        .on_conflict_do_nothing(index_elements=list(EVENT_KEY))
        .returning(*(EVENTS.c[name] for name in returned))
    )


# The six kinds of rollup row, in byte order: the order of one hour's six rows by their key.
KINDS = tuple(sorted((width, grouping) for width in WIDTHS for grouping in GROUPINGS))


def _rollup_key(width: Any, grouping: Any, hourly: Any) -> dict[str, Any]:
    """The key of the row of one kind (``width`` × ``grouping``) that an hour's usage
    (``hourly``: ``HOURLY_IN``'s columns, by name) counts in: the hour's or its day's, by key and
    model, by key (model '') or by model (api key ''). The kind is a row of ``KINDS`` (its
    values: each choice made here) or the columns of ``KINDS``' constant rows joined to the
    hours (each choice a CASE)."""
    key = {
        "account_id": hourly["account_id"],
        "bucket_width": width,
        "grouping": grouping,
        "bucket_start": _when(width, "1h", hourly["hour"], hourly["day"]),
        "api_key_id": _when(grouping, "model", "", hourly["api_key_id"]),
        "model_id": _when(grouping, "key", "", hourly["model_id"]),
    }
    assert tuple(key) == ROLLUP_KEY
    return key


def _when(value: Any, equal: str, then: Any, otherwise: Any) -> Any:
    """``then`` where ``value`` is ``equal``, else ``otherwise``: chosen here for a kind's
    value, by a CASE for a column."""
    if isinstance(value, str):
        return then if value == equal else otherwise
    return case((value == equal, then), else_=otherwise)


def rollup_upsert(
    on: p.Backend, hourly: FromClause, last_event_id: Any = None, one_hour: bool = False
) -> Any:
    """Add ``hourly`` (``HOURLY_IN``'s columns) to the six rollup rows each of its rows counts in
    (``_rollup_key``), summed per rollup key and written in the key's order (byte order), so
    concurrent writers lock the rows they share in the same order; ``last_event_id`` replaces
    the rows' own when given. ``one_hour``: ``hourly`` is one row (one event's), so its six rows
    are distinct and already in key order (``KINDS``'s, the constant rows joined to it in their
    order): neither summed nor sorted."""
    kinds = on.constants(
        (("bucket_width", ROLLUPS.c.bucket_width.type), ("grouping", ROLLUPS.c.grouping.type)),
        KINDS,
        "k",
    )
    key = _rollup_key(kinds.c.bucket_width, kinds.c.grouping, hourly.c)
    spread = (
        select(
            *(value.label(name) for name, value in key.items()),
            *(hourly.c[name] for name in (*COUNTERS, LAST_EVENT)),
        )
        .select_from(hourly.join(kinds, true()))
        .subquery("s")
    )
    if one_hour:
        source = select(
            *(spread.c[name] for name in (*ROLLUP_KEY, *COUNTERS)),
            spread.c[LAST_EVENT] if last_event_id is None else last_event_id,
        ).where(true())  # SQLite: ON CONFLICT after a SELECT needs a WHERE
        return _add_rollups(on, source)
    newest = func.max(spread.c[LAST_EVENT]) if last_event_id is None else last_event_id
    source = (
        select(
            *(spread.c[name] for name in ROLLUP_KEY),
            *(cast(func.sum(spread.c[name]), BigInteger).label(name) for name in COUNTERS),
            newest.label(LAST_EVENT),
        )
        .where(true())  # SQLite: ON CONFLICT after a SELECT needs a WHERE
        .group_by(*(spread.c[name] for name in ROLLUP_KEY))
        .order_by(
            *(
                p.byte_order(spread.c[name]) if name != "bucket_start" else spread.c[name]
                for name in ROLLUP_KEY
            )
        )
    )
    return _add_rollups(on, source)


# One hour's usage (a row of ``HOURLY_IN``) read into variables (``hour_rollup_steps``), but its
# newest event's id, which the caller gives.
_HOUR = {
    name: p.Var(f"v_hour_{name}", kind) for name, kind in HOURLY_IN.columns if name != LAST_EVENT
}


def hour_rollup_steps(on: p.Backend, hourly: FromClause, last_event_id: Any) -> p.Step:
    """Add one hour's usage (``hourly``: one row, one event's) to its six rollup rows, its
    newest event ``last_event_id``: six distinct rows, written in ``KINDS``' order (the key's).

    On PostgreSQL and SQLite one statement (``rollup_upsert``'s ``one_hour``). On a Citus shard
    the hour read into variables, then one ``INSERT … VALUES`` of the six rows, each key from
    ``_rollup_key`` with its kind's values. Every row is the account's, so Citus sends it whole
    to the account's shard and keeps its plan as it keeps a one-row insert's (the shard chosen
    when it runs), and its setup of a statement at every call (about 100k instructions of the
    worker's) is done once for the six rows, where the one-account compiler would make the
    ``INSERT … SELECT`` six inserts of one row (metering.citus.one_account; docs/citus.md)."""

    def in_one() -> p.Step:
        return p.Run(rollup_upsert(on, hourly, last_event_id=last_event_id, one_hour=True))

    def by_values() -> p.Step:
        hour = {name: var.ref for name, var in _HOUR.items()}
        rows = [
            {
                **_rollup_key(width, grouping, hour),
                **{name: hour[name] for name in COUNTERS},
                LAST_EVENT: last_event_id,
            }
            for width, grouping in KINDS
        ]
        return p.ForEach(
            select(*(hourly.c[name] for name in _HOUR)),
            into=tuple(_HOUR.values()),
            steps=(p.Run(_add_rollups(on, rows)),),
        )

    return on.choose(postgresql=in_one, sqlite=in_one, one_shard=by_values)()


def _add_rollups(on: p.Backend, source: Any) -> Any:
    """Insert ``source`` (rollup rows: a SELECT, or a list of rows by column) adding to the rows
    that stand."""
    columns = [*ROLLUP_KEY, *COUNTERS, LAST_EVENT]
    if isinstance(source, list):
        rows = [{name: row[name] for name in columns} for row in source]
        statement = on.insert(ROLLUPS).values(rows)
    else:
        statement = on.insert(ROLLUPS).from_select(columns, source)
    excluded = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=list(ROLLUP_KEY),
        set_={
            **{name: ROLLUPS.c[name] + excluded[name] for name in COUNTERS},
            LAST_EVENT: p.greatest(ROLLUPS.c[LAST_EVENT], excluded[LAST_EVENT]),
        },
    )


# A batch's charges, one array per column on PostgreSQL: the settlement reads them three times
# (the holds they name, the holds of their request ids, the ledger's entries), and each read of
# a JSON document parsed it whole again, where each read of the arrays only unnests them.
CHARGES_BY_COLUMN = replace(CHARGES_IN, by_column=True)


def _settle_usage(on: p.Backend) -> list[p.Step]:
    return [
        # The charges' arrays are in their events' order (``settle_usage`` sorts them).
        *settle_steps(
            on,
            lambda only: on.records(CHARGES_BY_COLUMN, "c", only),
            NOW.ref,
            in_event_order=True,
        ),
        # The contended rows last (every concurrent batch of the account adds to them): their
        # locks are held only until the commit.
        p.Run(rollup_upsert(on, on.records(HOURLY_IN, "r"))),
        # After the rollups: what the keys have spent includes this batch.
        *spend_limits.threshold_steps(on, NOW.ref),
    ]


# The spend-limit thresholds' parameters (metering.notifications.spend_limits).
_LIMITS = (spend_limits.LIMITS_IN, spend_limits.LIMITED)

SETTLE_USAGE = p.Program(
    "metering_settle_usage",
    params=(NOW, CHARGES_BY_COLUMN, HOURLY_IN, *_LIMITS),
    build=_settle_usage,
)
# On a Citus cluster (metering.citus), inside the transaction of a batch's account.
SETTLE_USAGE_OF_ACCOUNT = of_account(SETTLE_USAGE, delegated=False)


_NEW = p.Rows("v_new", tuple((name, EVENTS.c[name].type) for name in _RETURNED))
# The newest new event's id (the insert's largest, collected with its rows: no query, no sort).
NEWEST = p.Var("v_newest", BigInteger())


# A charge's columns (``CHARGES_IN``'s but ``prepaid``) from a new event's (``_NEW``'s).
_OF_NEW = {
    "account_id": "account_id",
    "api_key_id": "api_key_id",
    "request_id": "request_id",
    "usage_event_id": "id",
    "charge_microcents": "total_microcents",
    "authorization_id": "authorization_id",
}


def _charge_of_new(
    new: FromClause, prepaid: Any, only: Sequence[str] = CHARGES_IN.names
) -> dict[str, Any]:
    """A new event's charge (``CHARGES_IN``'s columns, ``only`` those) from what its insert
    returned (``_NEW``'s columns) and whether its account is prepaid."""
    return {name: prepaid if name == "prepaid" else new.c[_OF_NEW[name]] for name in only}


def _record_usage(on: p.Backend) -> list[p.Step]:
    return [*record_usage_steps(on), p.Return(NEWEST.ref)]


def record_usage_steps(on: p.Backend) -> list[p.Step]:
    """``RECORD_USAGE``'s steps but its result: the event inserted, and only if it was new, its
    charge settled and its hour's usage added; the new event's id in ``NEWEST`` (None when its
    request id was taken)."""
    newest = NEWEST.ref

    def charges(only: Sequence[str]) -> FromClause:
        """The new event's charge, of the columns ``only`` (the new event's unnested alone)."""
        new = on.rows(_NEW, "n", [_OF_NEW[name] for name in only if name in _OF_NEW])
        charge = _charge_of_new(new, PREPAID.ref, only)
        return select(*(charge[name].label(name) for name in only)).subquery("c")

    return [
        # One event: one row at most.
        p.Collect(
            insert_events(on, on.records(EVENTS_IN, "e")),
            into=_NEW,
            largest=("id", NEWEST),
            one_row=True,
        ),
        p.When(
            on.count(_NEW) > 0,
            (
                *settle_steps(on, charges, NOW.ref, one_event=True),
                # One event: one hour's row.
                hour_rollup_steps(on, on.records(HOURLY_IN, "r"), newest),
                *spend_limits.threshold_steps(on, NOW.ref),
            ),
        ),
    ]


RECORD_USAGE = p.Program(
    "metering_record_usage",
    params=(NOW, EVENTS_IN, PREPAID, HOURLY_IN, *_LIMITS),
    build=_record_usage,
    returns=BigInteger(),
    # Its statements' plans are kept, not made again at every call: with the plan cache's
    # default, PostgreSQL kept planning each statement anew for its parameters (a plan for the
    # row arrays' actual sizes looks cheaper than one for any size), ~250 µs of the backend's
    # CPU per single event, about a quarter of it (docs/performance.md). Its arrays hold one
    # event's rows; the batch path (SETTLE_USAGE) keeps plans made for its sizes.
    settings={"plan_cache_mode": "force_generic_plan"},
)
RECORD_USAGE_OF_ACCOUNT = of_account(RECORD_USAGE)  # on a Citus cluster (metering.citus)


# Each new event's charge (``CHARGES_IN``'s columns) and its hour's usage (``HOURLY_IN``'s).
_CHARGE_COLUMNS = tuple(name for name, _ in CHARGES_IN.columns)
_BOOKED = p.Rows(
    "v_booked",
    (
        *CHARGES_IN.columns,
        *((name, kind) for name, kind in HOURLY_IN.columns if name not in _CHARGE_COLUMNS),
    ),
)
# What the stored event gives a rollup row (the rest is its ``GATHERED_IN`` row's).
_BY_EVENT = (*_CHARGE_COLUMNS, LAST_EVENT)
# The events of ``RECORD_GATHERED``, one JSON document: each one's row (``EVENTS_IN``'s columns)
# and, beside it, its account's billing and what of its usage in its hour (``HOURLY_IN``'s
# columns, for that event alone) neither its row nor the stored event gives.
GATHERED_IN = p.Records(
    EVENTS_IN.name,
    (
        *EVENTS_IN.columns,
        ("prepaid", p.Boolean()),
        *(
            (name, kind)
            for name, kind in HOURLY_IN.columns
            if name not in _BY_EVENT and name not in EVENT_COLUMNS
        ),
    ),
)
# The same, one array per column, for an account's part of a batch on a cluster (hundreds of
# events), whose document PostgreSQL parsed twice (its input, then ``json_to_recordset``), about
# a quarter of a worker's instructions per event (docs/citus.md). One server's few events that
# arrived together keep the document.
GATHERED_BY_COLUMN = replace(GATHERED_IN, by_column=True)
# The request ids of the events that were new (in ``_BOOKED``'s order).
_BOOKED_REQUESTS = p.Var(_BOOKED.array("request_id"), ARRAY(EVENTS.c.request_id.type))


def _record_gathered(events: p.Records) -> Callable[[p.Backend], list[p.Step]]:
    """The program of ``RECORD_GATHERED``, its events given as ``events`` (``GATHERED_IN``, or
    ``GATHERED_BY_COLUMN``)."""
    return lambda on: _gathered_steps(on, events)


def _gathered_steps(on: p.Backend, events: p.Records) -> list[p.Step]:
    # The events read once (a CTE read twice is read into a tuplestore once): by the insert,
    # then beside what it returned.
    gathered = select(on.records(events, "g")).cte("gathered")
    new = insert_events(on, gathered, sort=True).cte("new")
    # Only the events that were new are settled and counted: a request id already taken is
    # none of this program's business (the caller's general path classifies it).
    found = new.join(
        gathered,
        and_(
            gathered.c.account_id == new.c.account_id,
            gathered.c.request_id == new.c.request_id,
        ),
    )
    columns = {
        **_charge_of_new(new, gathered.c.prepaid),
        **{name: gathered.c[name] for name in HOURLY_IN.names if name not in _BY_EVENT},
        LAST_EVENT: new.c.id,
    }
    return [
        # The new events and what they book, in one statement.
        p.Collect(
            select(*(columns[name].label(name) for name, _ in _BOOKED.columns)).select_from(found),
            into=_BOOKED,
        ),
        p.When(
            on.count(_BOOKED) > 0,
            (
                # Each statement unnests the booked columns it reads.
                *settle_steps(on, lambda only: on.rows(_BOOKED, "c", only), NOW.ref),
                p.Run(rollup_upsert(on, on.rows(_BOOKED, "r", HOURLY_IN.names))),
                *spend_limits.threshold_steps(on, NOW.ref),
            ),
        ),
        p.Return(_BOOKED_REQUESTS.ref),
    ]


RECORD_GATHERED = p.Program(
    "metering_record_gathered",
    params=(NOW, GATHERED_IN, *_LIMITS),
    build=_record_gathered(GATHERED_IN),
    returns=ARRAY(EVENTS.c.request_id.type),
    # As RECORD_USAGE's, for the same reason: its arrays hold the few events that arrived
    # together at one process (metering.usage.together), never a batch's thousand.
    settings={"plan_cache_mode": "force_generic_plan"},
)
# On a Citus cluster, an account's part of a batch (metering.usage.sharded): one call on the
# node that holds the account, its shard form's statements on the shard's own tables.
# Its events by column (``GATHERED_BY_COLUMN``).
RECORD_GATHERED_OF_ACCOUNT = of_account(
    replace(
        RECORD_GATHERED,
        params=(NOW, GATHERED_BY_COLUMN, *_LIMITS),
        build=_record_gathered(GATHERED_BY_COLUMN),
    ),
    # Its shard form planned once per backend (hundreds of events per call).
    shard_settings=RECORD_GATHERED.settings,
)


ENCODE_GATHERED = p.records_encoder(GATHERED_IN, p.POSTGRESQL, verbatim=EVENT_VERBATIM)
ENCODE_GATHERED_BY_COLUMN = p.arrays_encoder(GATHERED_BY_COLUMN)
# On PostgreSQL each column is read from the charges themselves (``ChargeToSettle``'s fields).
_CHARGE_ARRAYS = p.arrays_encoder(CHARGES_BY_COLUMN, {name: name for name in CHARGES_IN.names})
_ENCODE_SQLITE_CHARGES = p.records_encoder(CHARGES_IN, p.SQLITE, verbatim=("request_id",))


def _sqlite_charges(charges: Sequence[ChargeToSettle]) -> dict[str, str]:
    """The charges' parameter on SQLite (which reads their JSON document)."""
    return {CHARGES_IN.name: _ENCODE_SQLITE_CHARGES([charge.row() for charge in charges])}


_SETTLE = Forms.of_program(SETTLE_USAGE, SETTLE_USAGE_OF_ACCOUNT)


def settle_usage(
    session: Session,
    charges: Sequence[ChargeToSettle],
    rollup_rows: Sequence[Mapping[str, Any]],
    now: datetime,
    limits: Sequence[ScopeLimit] = (),
    account_id: str | None = None,
) -> None:
    """Book the charges of events just inserted and add their usage to the rollups
    (``SETTLE_USAGE``; ``rollup_rows``: ``HOURLY_IN``'s rows, metering.usage.rollups.rows), in
    the session's transaction: one round trip on PostgreSQL. ``limits``: the spend limits
    the charges count against (their thresholds are checked, metering.notifications.spend_limits).
    ``account_id`` (a Citus cluster): all of them are that account's (``SETTLE_USAGE_OF_ACCOUNT``,
    each statement routed to its shard)."""
    if not charges and not rollup_rows:
        return
    if account_id is None and is_cluster(session):
        # Charges of several accounts on a cluster: each account's, as its own call.
        for account, (its_charges, its_rows, its_limits) in by_account(
            charges, rollup_rows, limits
        ).items():
            settle_usage(session, its_charges, its_rows, now, its_limits, account)
        return

    def params(on: p.Backend) -> dict[str, Any]:
        # The rows live only while they are written: not during the round trip, beside the text.
        # In their events' order: the program appends their ledger entries as it reads them.
        ordered = sorted(charges, key=lambda c: c.usage_event_id)
        charges_params = on.choose(postgresql=_CHARGE_ARRAYS, sqlite=_sqlite_charges)
        return {
            "p_now": now,
            **charges_params(ordered),
            "p_rollups": on.choose(postgresql=rollups.ENCODE, sqlite=rollups.ENCODE_SQLITE)(
                rollup_rows
            ),
            **spend_limits.limit_params(limits, now, on),
        }

    _SETTLE.rows(session, params, account_id)
