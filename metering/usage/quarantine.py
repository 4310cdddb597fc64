"""The quarantine: keyed events that cannot be billed now, kept verbatim for an operator.

Usage is never dropped: an unbillable event is stored with its code, once per distinct raw
event (``raw_sha256``), and ``reprocess`` retries entries after the catalog or prices are fixed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from json.encoder import encode_basestring_ascii
from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session

from metering import citus
from metering.db import is_postgresql
from metering.kit.jsonenc import RawJSON, loads_exact
from metering.kit.money import INT64_MAX
from metering.kit.pagination import page, row_id_after
from metering.kit.ranges import DATABASE_ERRORS, is_out_of_range
from metering.kit.timeutil import format_timestamp
from metering.models import QuarantinedEvent, table
from metering.notifications import outbox
from metering.usage import repository, sums
from metering.usage.events import OUT_OF_RANGE, Event
from metering.usage.schemas import MAX_BATCH
from metering.usage.service import (
    DUPLICATE,
    QUARANTINED,
    RECORDED,
    STATUSES,
    BatchOutcome,
    lookup_pairs,
    parse,
    record_events,
)
from metering.usage.sql import Update, Upsert

QUARANTINE = table(QuarantinedEvent)
MAX_API_KEY_ID = 64
MAX_MODEL = 200


def _canonical(value: Any, out: list[str]) -> None:
    if value is None or value is True or value is False:
        out.append({None: "null", True: "true", False: "false"}[value])
    elif isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, Decimal):
        # As sent (the exact parser keeps fractions as Decimal); NaN and infinities are not JSON.
        text = str(value)
        out.append(text if value.is_finite() else encode_basestring_ascii(text))
    elif isinstance(value, Mapping):
        out.append("{")
        for position, key in enumerate(sorted(value, key=str)):
            if position:
                out.append(",")
            out.append(encode_basestring_ascii(str(key)))
            out.append(":")
            _canonical(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for position, item in enumerate(value):
            if position:
                out.append(",")
            _canonical(item, out)
        out.append("]")
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, numbers as sent: one text per distinct event."""
    out: list[str] = []
    _canonical(value, out)
    return "".join(out)


def _bounded(text: str | None, limit: int) -> str | None:
    return text if text is not None and len(text) <= limit else None


_COLUMNS = (
    "account_id",
    "api_key_id",
    "request_id",
    "model",
    "code",
    "message",
    "raw_event",
    "raw_sha256",
    "attempts",
    "received_at",
    "last_attempt_at",
)
# The same raw event again: one more attempt, with its current reason.
_ON_RESEND: dict[str, Update] = {
    "account_id": "excluded",
    "code": "excluded",
    "message": "excluded",
    "attempts": "add",
    "last_attempt_at": "excluded",
}
_KEEP = Upsert(QUARANTINE, _COLUMNS, conflict=("raw_sha256",), update=_ON_RESEND)


def keep(session: Session, events: Sequence[Event], now: datetime) -> None:
    """Store unbillable events, once per distinct raw event: the same one sent again only counts
    another attempt and takes its current reason."""
    rows: dict[str, list[Any]] = {}
    for event in events:
        assert event.problem is not None
        raw = canonical_json(event.raw)
        sha = hashlib.sha256(raw.encode()).hexdigest()
        if sha in rows:
            rows[sha][8] += 1  # attempts
            continue
        rows[sha] = [
            event.account_id,
            _bounded(event.api_key_id, MAX_API_KEY_ID),
            event.request_id,
            _bounded(event.model, MAX_MODEL),
            event.problem.code,
            event.problem.message,
            raw,
            sha,
            1,
            now,
            now,
        ]
    _KEEP.run(session, [rows[sha] for sha in sorted(rows)])
    # With the batch's commit, so a batch rolled back announces nothing (usage.quarantined).
    outbox.emit_quarantined(
        session, [(e.account_id, e.problem.code) for e in events if e.problem is not None], now
    )


def entry_body(entry: QuarantinedEvent) -> dict[str, Any]:
    return {
        "id": entry.id,
        "object": "quarantined_event",
        "account_id": entry.account_id,
        "api_key_id": entry.api_key_id,
        "request_id": entry.request_id,
        "model": entry.model,
        "code": entry.code,
        "message": entry.message,
        "attempts": entry.attempts,
        "received_at": format_timestamp(entry.received_at),
        "last_attempt_at": format_timestamp(entry.last_attempt_at),
        # Stored as canonical JSON (numbers as sent), so written verbatim: never re-parsed and
        # re-encoded, which recursed once per nesting level and failed on deep events.
        "event": RawJSON(entry.raw_event),
    }


def list_entries(
    session: Session, code: str | None, account_id: str | None, limit: int, after: str | None
) -> dict[str, Any]:
    """Entries newest first (as every admin list: by id, the same order on every backend),
    optionally of one code and one account."""
    query = select(QuarantinedEvent).order_by(QuarantinedEvent.id.desc()).limit(limit + 1)
    if code is not None:
        query = query.where(QuarantinedEvent.code == code)
    if account_id is not None:
        query = query.where(QuarantinedEvent.account_id == account_id)
    if after:
        query = query.where(QuarantinedEvent.id < row_id_after(after))
    rows = session.execute(query).scalars().all()
    return page(rows, limit, entry_body, lambda entry: (entry.id,))


def _chunks(session: Session, ids: Sequence[int] | None) -> Iterator[Sequence[QuarantinedEvent]]:
    """Entries to retry, oldest first, at most one batch at a time."""
    if ids is not None:
        # An id beyond a 64-bit row id is as unknown as any other: skipped (the database could
        # not even compare it).
        wanted = sorted({i for i in ids if -INT64_MAX - 1 <= i <= INT64_MAX})
        for start in range(0, len(wanted), MAX_BATCH):
            chunk = wanted[start : start + MAX_BATCH]
            yield (
                session.execute(
                    select(QuarantinedEvent)
                    .where(QuarantinedEvent.id.in_(chunk))
                    .order_by(QuarantinedEvent.id)
                )
                .scalars()
                .all()
            )
        return
    last_id = 0
    while True:
        entries = (
            session.execute(
                select(QuarantinedEvent)
                .where(QuarantinedEvent.id > last_id)
                .order_by(QuarantinedEvent.id)
                .limit(MAX_BATCH)
            )
            .scalars()
            .all()
        )
        if not entries:
            return
        yield entries
        last_id = entries[-1].id


def reprocess(session: Session, ids: Sequence[int] | None, now: datetime) -> dict[str, Any]:
    """Retry entries (``ids``, or every entry; unknown ids are skipped): those billable now are
    recorded exactly once and leave the quarantine (so do those recorded meanwhile by a resend,
    as duplicates); the others stay with their current reason, one more attempt counted.

    One reprocess at a time owns the quarantine, until its transaction ends (PostgreSQL and a
    Citus cluster: a transaction's advisory lock on the coordinator; SQLite has one writer):
    concurrent ones took the same entries', events' and accounts' rows in different orders and
    deadlocked. The next one then reads the entries as the first left them."""
    if is_postgresql(session):
        citus.lock(session, citus.QUARANTINE_REPROCESS_LOCK, 0, wait=True)
    data: list[dict[str, Any]] = []
    counts = dict.fromkeys(STATUSES, 0)
    for entries in _chunks(session, ids):
        if entries:
            _reprocess_chunk(session, entries, now, data, counts)
    return {
        "object": "quarantine_reprocess",
        "recorded": counts[RECORDED],
        "duplicates": counts[DUPLICATE],
        "quarantined": counts[QUARANTINED],
        "data": data,
    }


def _reprocess_chunk(
    session: Session,
    entries: Sequence[QuarantinedEvent],
    now: datetime,
    data: list[dict[str, Any]],
    counts: dict[str, int],
    guided: bool = False,
) -> None:
    """Retry ``entries`` together, in a savepoint; when the database refuses them (an event
    beyond the range, metering.kit.ranges), those that cannot fit the sums (found in a few
    queries: metering.usage.sums) stay, as ``invalid_usage``, one more attempt counted, and the
    others are retried together; when they are refused again (``guided``), each on its own."""
    shown, counted = len(data), dict(counts)
    savepoint = session.begin_nested()
    try:
        _retry(session, entries, now, data, counts)
        savepoint.commit()
        return
    except DATABASE_ERRORS as error:
        savepoint.rollback()
        del data[shown:]
        counts.update(counted)
        if not is_out_of_range(error) and len(entries) == 1:
            raise
        beyond: set[int] = set()
        if not guided and is_out_of_range(error):
            beyond = _beyond_range(session, entries, now)
        if beyond:
            rest = [entry for index, entry in enumerate(entries) if index not in beyond]
            if rest:
                _reprocess_chunk(session, rest, now, data, counts, guided=True)
            _keep_beyond(session, [entries[i] for i in sorted(beyond)], now, data, counts)
            data[shown:] = sorted(data[shown:], key=lambda item: item["id"])
            return
        if len(entries) > 1:
            for entry in entries:
                _reprocess_chunk(session, [entry], now, data, counts, guided=True)
            return
    _keep_beyond(session, entries, now, data, counts)


def _beyond_range(session: Session, entries: Sequence[QuarantinedEvent], now: datetime) -> set[int]:
    """The positions of the entries whose events cannot fit the sums (metering.usage.sums)."""
    raws = [loads_exact(e.raw_event.encode()) for e in entries]
    _, events = parse(raws, now)
    accounts = repository.accounts_on_cluster(session, lookup_pairs(events))
    return sums.refused(session, raws, now, accounts)


def _keep_beyond(
    session: Session,
    entries: Sequence[QuarantinedEvent],
    now: datetime,
    data: list[dict[str, Any]],
    counts: dict[str, int],
) -> None:
    """The entries stay, as ``invalid_usage`` (beyond the range), one more attempt counted."""
    session.connection().execute(
        update(QUARANTINE)
        .where(QUARANTINE.c.id == bindparam("b_id"))
        .values(
            code=OUT_OF_RANGE.code,
            message=OUT_OF_RANGE.message,
            attempts=QUARANTINE.c.attempts + 1,
            last_attempt_at=now,
        ),
        [{"b_id": entry.id} for entry in entries],
    )
    for entry in entries:
        counts[QUARANTINED] += 1
        data.append(
            {
                "id": entry.id,
                "request_id": entry.request_id,
                "status": QUARANTINED,
                "charge": None,
                "error": OUT_OF_RANGE.body(),
            }
        )


def _retry(
    session: Session,
    entries: Sequence[QuarantinedEvent],
    now: datetime,
    data: list[dict[str, Any]],
    counts: dict[str, int],
) -> None:
    raws = [loads_exact(e.raw_event.encode()) for e in entries]
    parsed = parse(raws, now)
    record_events(
        session,
        raws,
        now,
        before_settlement=lambda outcome: _update_entries(
            session, entries, outcome, now, data, counts
        ),
        parsed=parsed,
        # On a Citus cluster, account by account (an operator's transaction may span them).
        accounts=repository.accounts_on_cluster(session, lookup_pairs(parsed[1])),
    )


def _update_entries(
    session: Session,
    entries: Sequence[QuarantinedEvent],
    outcome: BatchOutcome,
    now: datetime,
    data: list[dict[str, Any]],
    counts: dict[str, int],
) -> None:
    """The entries' fate, written before the charges' settlement locks the accounts: those
    recorded (or found recorded) leave the quarantine, the others take their current reason."""
    resolved: list[int] = []
    for entry, result in zip(entries, outcome.results, strict=True):
        counts[result.status] += 1
        if result.status != QUARANTINED:
            resolved.append(entry.id)
        data.append(
            {
                "id": entry.id,
                "request_id": result.request_id,
                "status": result.status,
                "charge": result.charge,
                "error": None if result.error is None else result.error.body(),
            }
        )
    if resolved:
        session.execute(delete(QuarantinedEvent).where(QuarantinedEvent.id.in_(resolved)))
    still = [(entries[e.index], e) for e in outcome.quarantined]
    if still:
        session.connection().execute(
            update(QUARANTINE)
            .where(QUARANTINE.c.id == bindparam("b_id"))
            .values(
                account_id=bindparam("b_account_id"),
                code=bindparam("b_code"),
                message=bindparam("b_message"),
                attempts=QUARANTINE.c.attempts + 1,
                last_attempt_at=now,
            ),
            [
                {
                    "b_id": entry.id,
                    "b_account_id": event.account_id,
                    "b_code": event.problem.code if event.problem else entry.code,
                    "b_message": event.problem.message if event.problem else entry.message,
                }
                for entry, event in sorted(still, key=lambda pair: pair[0].id)
            ],
        )
