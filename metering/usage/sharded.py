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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from metering.db import Database, retry_transient
from metering.usage import isolation, quarantine, repository, service
from metering.usage.events import Event


def record_batch(
    database: Database, raws: Sequence[object], now: datetime, parsed: service.Parsed
) -> service.BatchOutcome:
    """Record ``raws`` (``parsed``: ``service.parse(raws, now)``), one transaction per account
    (see the module's docstring)."""
    results, events = parsed
    with database.reading() as session:
        accounts = repository.key_accounts(session, service.lookup_pairs(events))
    parts: dict[str | None, list[Event]] = {}
    for event in events:
        parts.setdefault(accounts.get(event.api_key_id or ""), []).append(event)
    quarantined: list[Event] = []
    failures = []
    # In byte order of account (as every debit locks accounts); no account's (unknown keys:
    # no statement) first.
    for account_id in sorted(parts, key=lambda a: (a is not None, a or "")):
        part = parts[account_id]
        try:
            outcome = _record_part(database, raws, now, part, accounts)
        except isolation.PartFailed as failed:  # the account's other events are in
            failures.append(failed)
            continue
        quarantined += outcome.quarantined
        for result in outcome.results:
            result.index = part[result.index].index
            results[result.index] = result
    if quarantined:
        with database.unit_of_work() as session:
            quarantine.keep(session, quarantined, now)
            session.commit()
    if failures:
        raise isolation.PartFailed(f"{len(failures)} accounts' events could not all be recorded")
    assert all(r is not None for r in results)
    return service.BatchOutcome([r for r in results if r is not None])


def _record_part(
    database: Database,
    raws: Sequence[object],
    now: datetime,
    events: Sequence[Event],
    accounts: service.Accounts,
) -> service.BatchOutcome:
    """``events`` (of one account, or of unknown keys) in a transaction of their own; the
    outcome's indices are positions in ``events``, and its quarantined events are left for the
    caller to keep."""
    mine = [raws[event.index] for event in events]

    def once() -> service.BatchOutcome:
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
