"""A usage batch on a Citus cluster: committed per account (docs/citus.md#what-runs-on-a-cluster).

On one server a batch is one transaction (``service.record_events``). On a cluster each
account's events live on the worker that holds the account, and one transaction over several
accounts would be a commit across nodes. So the batch is split by account:

1. the account of each key the batch names, from ``api_keys`` alone (a reference table, read
   where it stands: no worker is asked);
2. for each account, in byte order of its id, one transaction that records its events exactly
   as the batch path does (the lookup, the insert, the read-back of collisions, the settlement
   and the rollups), every statement that account's alone (``account_id``: the statements'
   one-account forms, metering.usage.repository), so each is routed to the account's shard and
   the transaction commits on that worker alone;
3. the quarantined events of the whole batch (unknown keys, and the idempotency conflicts each
   account's transaction found), in one transaction of their own: ``quarantined_events`` is a
   reference table, which a worker's transaction must not have to write on every node.

Each event is then wholly there or wholly absent, and the answer says what happened to each. A
crash between two accounts leaves the first recorded and the second absent: the gateway's retry
of the batch finds the first as duplicates and records the second. An account whose
transaction the database refuses is recorded again in parts (metering.usage.isolation), the
other accounts' being committed as they are; one refused for a transient reason (a deadlock) is
tried again whole (metering.db.retry_transient).

A batch the gateway sends (``record_batch_on_nodes``) records each account's part with fewer
statements, each on the node that holds the account (metering.nodes) and none in a transaction
the service holds open: the account's lookup (one statement on its shard), then one call of
``RECORD_GATHERED_OF_ACCOUNT`` (metering.usage.recording), which inserts the part's events, the
first of each request id, and settles and counts those that were new, as one transaction of
that node (on the node's own shard tables: metering.citus.shard_forms), then the stored events
of the request ids that were taken, whose results the batch path's own rule gives
(``service.classify``). A part the call cannot take (the database refused it: nothing was
written) is recorded by the transaction above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from metering.db import Database, Steps, retry_transient
from metering.usage import isolation, quarantine, repository, service, single
from metering.usage.events import ChargeValues, Content, Event
from metering.usage.prices import PriceBook
from metering.usage.repository import EventKey


def record_batch(
    database: Database, raws: Sequence[object], now: datetime, parsed: service.Parsed
) -> service.BatchOutcome:
    """Record ``raws`` (``parsed``: ``service.parse(raws, now)``), one transaction per account
    (see the module's docstring)."""
    results, events = parsed
    with database.reading() as session:
        accounts = repository.key_accounts(session, service.lookup_pairs(events))
    quarantined: list[Event] = []
    failures = []
    for _account_id, part in _by_account(events, accounts):
        try:
            outcome = _record_part(database, raws, now, part, accounts)
        except isolation.PartFailed as failed:  # the account's other events are in
            failures.append(failed)
            continue
        quarantined += _taken(outcome, part, results)
    if quarantined:
        _keep_quarantined(database, quarantined, now)
    return _answer(results, failures)


def _record_part(
    database: Database,
    raws: Sequence[object],
    now: datetime,
    events: Sequence[Event],
    accounts: service.Accounts,
    refusal: BaseException | None = None,
) -> service.BatchOutcome:
    """``events`` (of one account, or of unknown keys) in a transaction of their own; the
    outcome's indices are positions in ``events``, and its quarantined events are left for the
    caller to keep. ``refusal``: the database refused them already, for what they hold (they are
    recorded in parts at once)."""
    mine = [raws[event.index] for event in events]
    refused = [refusal] if refusal is not None else []

    def once() -> service.BatchOutcome:
        if refused:  # in parts at once (a transient refusal of a part tries it again whole)
            return isolation.record_apart(database, mine, now, refused.pop(), accounts)
        # Parsed anew at each attempt (recording fills in the parsed results and events).
        parsed: service.Parsed = (
            [None] * len(events),
            [dataclasses.replace(event, index=position) for position, event in enumerate(events)],
        )
        try:
            with database.unit_of_work() as session:
                outcome = service.record_events(
                    session, mine, now, parsed=parsed, accounts=accounts
                )
                session.commit()
                return outcome
        except isolation.DATABASE_ERRORS as error:
            if not isolation.refused(error):
                raise  # transient (tried again whole) or the database out of reach (503)
            # Kept in parts, its quarantined events with them.
            return isolation.record_apart(database, mine, now, error, accounts)

    # A transient refusal tries the account's transaction again whole (metering.db).
    return retry_transient(once, "usage batch (one account's part)")


async def record_batch_on_nodes(
    database: Database, raws: Sequence[object], now: datetime
) -> service.BatchOutcome:
    """Record ``raws``: each account's part by a call on the node that holds the account (see
    the module's docstring), a part the call cannot take by its own transaction
    (``_record_part``); the quarantined events of the whole batch then in one transaction."""
    results, events = service.parse(raws, now)
    pairs = service.lookup_pairs(events)
    accounts = await database.run(_key_accounts(pairs), postgresql=single.OneAccount, sqlite=None)
    quarantined: list[Event] = []
    failures = []
    for account_id, part in _by_account(events, accounts):
        if account_id is None:  # unknown keys
            service.price_events(part, {}, PriceBook())
            quarantined += service.quarantine_results(results, part)
            continue
        refusal: BaseException | None = None
        try:
            steps = _part(part, now, account_id)
            found = await database.run(steps, postgresql=single.OneAccount, sqlite=None)
        except isolation.DATABASE_ERRORS as error:
            # Refused for what it holds (nothing was written): recorded in parts at once, the
            # whole part being refused again otherwise; any other error: by its transaction.
            found, refusal = None, error if isolation.refused(error) else None
        if found is not None:
            priced, first, new, stored = found
            # The new events' ids are the call's own (it settled them).
            service.classify(results, priced, first, dict.fromkeys(new, 0), stored)
            quarantined += service.quarantine_results(results, part)
            continue
        try:
            outcome = await database.in_writer_thread(
                _record_part, database, raws, now, part, accounts, refusal
            )
        except isolation.PartFailed as failed:  # the account's other events are in
            failures.append(failed)
            continue
        quarantined += _taken(outcome, part, results)
    if quarantined:
        await database.in_writer_thread(_keep_quarantined, database, quarantined, now)
    return _answer(results, failures)


def _by_account(
    events: Sequence[Event], accounts: service.Accounts
) -> list[tuple[str | None, list[Event]]]:
    """The batch's events by the account of their keys, in byte order of account (as every
    debit locks accounts), those of no account's key (unknown keys: no statement) first."""
    parts: dict[str | None, list[Event]] = {}
    for event in events:
        parts.setdefault(accounts.get(event.api_key_id or ""), []).append(event)
    return sorted(parts.items(), key=lambda item: (item[0] is not None, item[0] or ""))


def _taken(
    outcome: service.BatchOutcome, part: Sequence[Event], results: list[service.Result | None]
) -> list[Event]:
    """A part's ``outcome`` (its indices positions in ``part``) into the batch's ``results``;
    its quarantined events, left for the batch to keep."""
    for result in outcome.results:
        result.index = part[result.index].index
        results[result.index] = result
    return list(outcome.quarantined)


def _answer(
    results: list[service.Result | None], failures: Sequence[isolation.PartFailed]
) -> service.BatchOutcome:
    """The batch's outcome, once every part has its results; refused (500) when a part's events
    could not all be recorded (the other accounts' are in)."""
    if failures:
        raise isolation.PartFailed(f"{len(failures)} accounts' events could not all be recorded")
    assert all(r is not None for r in results)
    return service.BatchOutcome([r for r in results if r is not None])


def _keep_quarantined(database: Database, events: Sequence[Event], now: datetime) -> None:
    """The batch's quarantined events, in one transaction of their own."""
    with database.unit_of_work() as session:
        quarantine.keep(session, events, now)
        session.commit()


def _key_accounts(pairs: list[tuple[str, str]]) -> Steps[dict[str, str]]:
    found: dict[str, str] = yield lambda db: db.key_accounts(pairs)
    return found


_Stored = dict[EventKey, tuple[Content, ChargeValues]]
# What an account's part came to: its priced events, the first of each key, the keys recorded
# new, and the stored events of the keys that were taken.
_Found = tuple[list[Event], dict[EventKey, Event], set[EventKey], _Stored]


def _part(events: list[Event], now: datetime, account_id: str) -> Steps[_Found | None]:
    """An account's part: the account's lookup of its pairs, its events priced, the first of
    each key recorded by one call, then the stored events of the keys that were taken; None
    when a taken key's stored event is not found. A refusal of the database is raised (the
    call is one transaction: nothing was written)."""
    pairs = service.lookup_pairs(events)
    keys, book = yield lambda db: db.lookup_of_account(pairs, account_id)
    limited = repository.scope_pairs(keys, pairs)
    if limited:
        found = yield lambda db: db.scope_limits(limited, account_id)
        keys = repository.with_scopes(keys, found)
    priced = service.price_events(events, keys, book)
    first = service.first_of_each(priced)
    new: set[EventKey] = set()
    if first:
        # In the order of their keys, as the batch path inserts them.
        firsts = [first[key] for key in sorted(first)]
        booked = yield lambda db: db.record_new(firsts, now)
        new = {key for key in first if key[1] in booked}
    taken = sorted(key for key in first if key not in new)
    stored: _Stored = {}
    if taken:
        stored = yield lambda db: db.stored(taken, account_id)
        if any(key not in stored for key in taken):
            return None
    return priced, first, new, stored
