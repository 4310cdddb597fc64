"""Which events of a refused usage batch cannot fit the sums they add to (docs/api.md#ranges),
found in a fixed number of queries, before the database would refuse them one by one.

The database stays the judge of the range (metering.kit.ranges): this only guides the isolation
of a batch it refused (metering.usage.isolation) and of a reprocess (metering.usage.quarantine).
Recording a batch moves every sum one way (a charge moves the balance down and the rollups' counters
up), so the events the database would record are, in batch order, each one that fits the sums as
the events before it left them. Read here: the stored sums each event adds to (the balance of
its account, the six rollup rows of its hour and day), and which events are stored already
(duplicates add nothing); then, in batch order, each event either fits every sum (counted) or
is refused. The events found refused are quarantined at once and the others recorded together:
the answer is the one the database gives event by event (a balance is read without a lock: a
grant made meanwhile may let an event fit that was refused here; it stays quarantined, to be
reprocessed). When the database still refuses the others, the isolation splits them as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from metering.kit.ranges import INT64_MIN, fits
from metering.kit.timeutil import floor_day, floor_hour
from metering.models import Account
from metering.usage import repository, service
from metering.usage.events import Event
from metering.usage.rollups import COUNTERS, GROUPINGS, ROLLUPS, WIDTHS, RollupKey

_ZERO = dict.fromkeys(COUNTERS, 0)


def refused(
    session: Session,
    raws: Sequence[object],
    now: datetime,
    accounts: service.Accounts | None = None,
) -> set[int]:
    """The positions in ``raws`` of the events whose charge or usage would take a stored sum
    beyond the signed 64-bit range, each after the events before it that fit (see the module).
    ``accounts``: on a Citus cluster, the account of each key (``service.record_events``)."""
    _, events = service.parse(raws, now)
    service.resolve(session, events, accounts)
    first: dict[repository.EventKey, Event] = {}
    for event in events:
        if event.problem is None and event.charge is not None:
            first.setdefault((event.account_id or "", event.request_id), event)
    if not first:
        return set()
    stored = _stored(session, sorted(first), accounts is not None)
    new = sorted((e for k, e in first.items() if k not in stored), key=lambda e: e.index)
    balances = _balances(session, {e.account_id or "" for e in new if e.prepaid})
    rows = _rollups(session, new)
    out: set[int] = set()
    for event in new:
        if not _add(event, balances, rows):
            out.add(event.index)
    return out


def _keys(event: Event) -> list[RollupKey]:
    """The six rollup rows an event adds to."""
    assert event.occurred_at is not None
    account, key, model = event.account_id or "", event.api_key_id or "", event.model_id or ""
    starts = {"1h": floor_hour(event.occurred_at), "1d": floor_day(event.occurred_at)}
    grouped = {"key_model": (key, model), "key": (key, ""), "model": ("", model)}
    return [
        RollupKey(account, width, grouping, starts[width], *grouped[grouping])
        for width in WIDTHS
        for grouping in GROUPINGS
    ]


def _add(event: Event, balances: dict[str, int], rows: dict[RollupKey, dict[str, int]]) -> bool:
    """Count ``event`` in the sums when it fits every one (else change nothing)."""
    usage, charge = event.usage, event.charge
    assert usage is not None and charge is not None
    added = {
        "requests": 1,
        "input_tokens": usage.prompt_tokens,
        "cache_read_tokens": usage.cached_tokens,
        "output_tokens": usage.output_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cost_microcents": charge.total_microcents,
    }
    assert tuple(added) == COUNTERS
    account = event.account_id or ""
    balance = None
    if event.prepaid:
        balance = balances.get(account, 0) - charge.total_microcents
        if balance < INT64_MIN:
            return False
    updated = []
    for key in _keys(event):
        row = rows.get(key, _ZERO)
        sums = {name: row[name] + added[name] for name in COUNTERS}
        if not all(fits(value) for value in sums.values()):
            return False
        updated.append((key, sums))
    rows.update(updated)
    if balance is not None:
        balances[account] = balance
    return True


def _stored(
    session: Session, keys: Sequence[repository.EventKey], cluster: bool
) -> set[repository.EventKey]:
    """The keys whose event is stored already (on a cluster, asked account by account)."""
    if not cluster:
        return set(repository.stored(session, keys))
    found: set[repository.EventKey] = set()
    for account_id in sorted({account for account, _ in keys}):
        mine = [key for key in keys if key[0] == account_id]
        found |= set(repository.stored(session, mine, account_id))
    return found


def _balances(session: Session, accounts: Iterable[str]) -> dict[str, int]:
    wanted = sorted(accounts)
    if not wanted:
        return {}
    query = select(Account.id, Account.balance_microcents).where(Account.id.in_(wanted))
    return {row.id: row.balance_microcents for row in session.execute(query)}


def _rollups(session: Session, events: Sequence[Event]) -> dict[RollupKey, dict[str, int]]:
    """The stored rollup rows the events add to, by key."""
    wanted = {key for event in events for key in _keys(event)}
    if not wanted:
        return {}
    columns = [ROLLUPS.c[name] for name in RollupKey._fields]
    query = select(*columns, *(ROLLUPS.c[name] for name in COUNTERS)).where(
        ROLLUPS.c.account_id.in_(sorted({key.account_id for key in wanted})),
        tuple_(ROLLUPS.c.bucket_width, ROLLUPS.c.bucket_start).in_(
            sorted({(key.bucket_width, key.bucket_start) for key in wanted})
        ),
    )
    found: dict[RollupKey, dict[str, int]] = {}
    for row in session.execute(query):
        key = RollupKey(*row[: len(columns)])
        if key in wanted:
            found[key] = dict(zip(COUNTERS, row[len(columns) :], strict=True))
    return found
