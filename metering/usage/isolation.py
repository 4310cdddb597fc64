"""A batch whose transaction failed, recorded again in parts, so that one account's trouble never
refuses the other accounts' events (docs/api.md#ranges).

The normal path pays nothing for this: the batch is one transaction (metering.usage.service),
and only when the database refuses it does the ingest come here. The batch is then split in
halves, each recorded in a savepoint of one new transaction, and a half that fails is split
again, down to single events: the events that fit are recorded exactly as the batch would have
recorded them, in batch order (a charge only ever moves a balance down and a rollup up, so a
part that fits as a whole fits event by event), and only the events that cannot be recorded are
singled out, in O(k log n) attempts for k of them. A refusal for the range is guided first
(metering.usage.sums: the sums the events add to, read in a few queries): the events that
cannot fit are quarantined together and the others recorded as one part, split only when the
database still refuses them — k refused events otherwise cost O(k log n) round trips each
(a batch of 999 took a minute on a Citus cluster).

An event the database refuses because its charge would take a stored amount or sum (the
account's balance, a rollup) out of the signed 64-bit range (metering.kit.ranges) is
quarantined ``invalid_usage``. Any other refusal of a single event is unexpected: the rest of
the batch is committed all the same, then the request fails (500), and the gateway's retry finds
the recorded events as duplicates.

A transient refusal (metering.db.transient: a deadlock, a serialization failure) is no reason to
split: the batch's transaction is rolled back whole and tried again from the start
(metering.db.retry_transient), and so is this one's when a part meets one. Splitting would keep
the first parts' row locks while taking the next parts' (one transaction, savepoints), out of
the global lock order, and two such batches would deadlock again at every split.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from metering.db import Database, Transient, transient, unreachable
from metering.kit.ranges import DATABASE_ERRORS, is_out_of_range
from metering.usage import quarantine, service, sums
from metering.usage.events import OUT_OF_RANGE, is_keyed, parse_event

log = logging.getLogger(__name__)

__all__ = ["DATABASE_ERRORS", "PartFailed", "record_apart", "refused"]


class PartFailed(RuntimeError):
    """Events the database refused for a reason other than the range: the rest is recorded."""


def refused(error: BaseException) -> bool:
    """Whether the database refused a batch for what it holds, so that recording it in parts
    may single out the events it refuses: not a transient refusal (the batch is tried again
    whole) nor the database out of reach (503)."""
    return not transient(error) and not unreachable(error)


def record_apart(
    database: Database,
    raws: Sequence[object],
    now: datetime,
    error: BaseException,
    accounts: service.Accounts | None = None,
) -> service.BatchOutcome:
    """Record ``raws``, whose batch the database refused with ``error``, in parts (see the
    module's docstring), in one transaction. ``accounts``: on a Citus cluster, the account of
    each key (``service.record_events``). A transient refusal of a part raises ``Transient``
    out of the transaction, rolled back whole (see the module's docstring)."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    log.warning("a batch of %d events refused (%s): recorded again in parts", len(raws), reason)
    results: list[service.Result | None] = [None] * len(raws)
    failures: list[BaseException] = []
    with database.unit_of_work() as session:

        def attempt(indices: Sequence[int]) -> BaseException | None:
            nested = session.begin_nested()
            try:
                outcome = service.record_events(
                    session,
                    [raws[i] for i in indices],
                    now,
                    before_settlement=lambda done: quarantine.keep(session, done.quarantined, now),
                    accounts=accounts,
                )
                nested.commit()
            except DATABASE_ERRORS as exc:
                nested.rollback()
                if transient(exc):
                    # No further split while this transaction holds the parts' locks: it is
                    # rolled back whole, and the batch tried again from the start.
                    raise Transient(exc) from exc
                if unreachable(exc):
                    raise
                return exc
            for result in outcome.results:
                result.index = indices[result.index]
                results[result.index] = result
            return None

        def record(indices: Sequence[int], error: BaseException) -> None:
            """Record ``indices``, refused together with ``error``, in smaller parts."""
            if len(indices) > 1:
                middle = len(indices) // 2
                for half in (indices[:middle], indices[middle:]):
                    refused = attempt(half)
                    if refused is not None:
                        record(half, refused)
                return
            index = indices[0]
            if is_out_of_range(error) and is_keyed(raws[index]):
                results[index] = _quarantine(session, index, raws[index], now, accounts)
            else:
                log.error("an event the database refused: %s", error)
                failures.append(error)

        # Those that cannot fit the sums, found in a few queries, quarantined together; the
        # others recorded together (metering.usage.sums). Split as below only when the
        # database still refuses them.
        beyond = sums.refused(session, raws, now, accounts) if is_out_of_range(error) else set()
        rest = [index for index in range(len(raws)) if index not in beyond]
        refused_again = attempt(rest) if beyond and rest else error
        if beyond:
            _quarantine_all(session, sorted(beyond), raws, now, accounts, results)
        if refused_again is not None and rest:
            record(rest, refused_again)
        session.commit()
    if failures:
        raise PartFailed(f"{len(failures)} events of the batch could not be recorded")
    assert all(r is not None for r in results)
    return service.BatchOutcome([r for r in results if r is not None])


def _quarantine_all(
    session: Session,
    indices: Sequence[int],
    raws: Sequence[object],
    now: datetime,
    accounts: service.Accounts | None,
    results: list[service.Result | None],
) -> None:
    """Keep the events at ``indices`` (keyed, billable, beyond the range) as ``invalid_usage``,
    together."""
    events = []
    for index in indices:
        raw = raws[index]
        assert isinstance(raw, Mapping)
        events.append(parse_event(index, raw, now))
    service.resolve(session, events, accounts)  # their accounts, for the quarantine's entries
    for event in events:
        event.problem = OUT_OF_RANGE
        results[event.index] = service.Result(
            event.index, event.request_id, service.QUARANTINED, error=OUT_OF_RANGE
        )
    quarantine.keep(session, events, now)


def _quarantine(
    session: Session, index: int, raw: object, now: datetime, accounts: service.Accounts | None
) -> service.Result:
    """Keep ``raw`` (keyed, billable but beyond the range) as ``invalid_usage``."""
    assert isinstance(raw, Mapping)
    event = parse_event(index, raw, now)
    service.resolve(session, [event], accounts)  # its account, for the quarantine's entry
    event.problem = OUT_OF_RANGE
    quarantine.keep(session, [event], now)
    return service.Result(index, event.request_id, service.QUARANTINED, error=OUT_OF_RANGE)
