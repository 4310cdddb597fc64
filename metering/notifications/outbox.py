"""The outbox: events written in the very transaction that causes them.

An event is a row of ``webhook_events``; the delivery loop later makes one delivery per matching
endpoint. So a crash loses no event, and a rolled-back change sends none.

Several ways in, one table:

* ``emit(session, type, account_id, data, now)``: from Python, in the caller's unit of work
  (``credit.grant_expiring``, the operator-only types). Amounts in ``data`` are integer
  ``*_microcents`` fields; messages show them as ``*_cents`` beside the exact value.
* ``balance_crossings(moves, now)``: the balance thresholds (``credit.balance_low``,
  ``credit.balance_depleted``) as one Core statement over the balance moves of a transaction, a
  step of every debit's program (metering.ledger.spending: settlement, negative adjustments,
  due expiries; so PostgreSQL's functions and SQLite run the same rule) and run as is by grants,
  positive adjustments and voids (``note_balance_move``). ``grants_expired(due, now)``: one
  ``credit.grant_expired`` per expiry entry, in the same step list.
* ``spend_limit.threshold_reached``: steps of the usage programs, after the rollups they add
  (metering.notifications.spend_limits).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    FromClause,
    String,
    and_,
    insert,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Text

from metering.kit.ids import new_id
from metering.models import Account, WebhookEvent, table
from metering.models.notifications import NO_ACCOUNT

EVENTS = table(WebhookEvent)
ACCOUNTS = table(Account)

BALANCE_LOW = "credit.balance_low"
BALANCE_DEPLETED = "credit.balance_depleted"
GRANT_EXPIRING = "credit.grant_expiring"
GRANT_EXPIRED = "credit.grant_expired"
SPEND_LIMIT_REACHED = "spend_limit.threshold_reached"
EXPIRED_UNUSED = "authorization.expired_unused"
USAGE_QUARANTINED = "usage.quarantined"
EXPORT_COMPLETED = "export.completed"
TEST = "webhook.test"
PAYMENT_SUCCEEDED = "payment.succeeded"
PAYMENT_FAILED = "payment.failed"
PAYMENT_REFUNDED = "payment.refunded"
PAYMENT_REFUND_FAILED = "payment.refund_failed"
PAYMENT_DISPUTED = "payment.disputed"
AUTO_RECHARGE_DISABLED = "auto_recharge.disabled"
AUTO_RECHARGE_LIMIT_REACHED = "auto_recharge.limit_reached"

# Every type an endpoint may subscribe to (docs/api.md#event-types); those an account key may
# not (the operator-only ones).
EVENT_TYPES = frozenset(
    {
        BALANCE_LOW,
        BALANCE_DEPLETED,
        GRANT_EXPIRING,
        GRANT_EXPIRED,
        SPEND_LIMIT_REACHED,
        EXPIRED_UNUSED,
        USAGE_QUARANTINED,
        EXPORT_COMPLETED,
        TEST,
        PAYMENT_SUCCEEDED,
        PAYMENT_FAILED,
        PAYMENT_REFUNDED,
        PAYMENT_REFUND_FAILED,
        PAYMENT_DISPUTED,
        AUTO_RECHARGE_DISABLED,
        AUTO_RECHARGE_LIMIT_REACHED,
    }
)
OPERATOR_ONLY = frozenset(
    {
        EXPIRED_UNUSED,
        USAGE_QUARANTINED,
        EXPORT_COMPLETED,
        PAYMENT_REFUNDED,
        PAYMENT_REFUND_FAILED,
        PAYMENT_DISPUTED,
    }
)


def stored_account(account_id: str | None) -> str:
    """The ``account_id`` an event of ``account_id`` (None: of no account) is stored under."""
    return NO_ACCOUNT if account_id is None else account_id


def shown_account(stored: str) -> str | None:
    """An event's (or delivery's) account as messages and the API show it: null for none."""
    return None if stored == NO_ACCOUNT else stored


def emit(
    session: Session,
    type_: str,
    account_id: str | None,
    data: Mapping[str, Any],
    now: datetime,
    *,
    dispatched: bool = False,
) -> str:
    """Write one event in the session's transaction; returns its id (``evt_…``).
    ``dispatched``: its deliveries are made by the caller, not by the fan-out."""
    assert type_ in EVENT_TYPES, type_
    public_id = new_id("evt", 26)
    session.execute(
        insert(EVENTS).values(
            public_id=public_id,
            account_id=stored_account(account_id),
            type=type_,
            data=json.dumps(dict(data), separators=(",", ":"), allow_nan=False),
            created_at=now,
            dispatched=dispatched,
        )
    )
    return public_id


# A message's body is at most 64 KiB: a manifest larger than this is sent without its file list.
MAX_MANIFEST_BYTES = 48 * 1024


def emit_export_completed(session: Session, day: date, manifest: bytes, now: datetime) -> str:
    """``export.completed`` {date, manifest} (operator-wide), with the export's own commit."""
    document = json.loads(manifest)
    if len(manifest) > MAX_MANIFEST_BYTES:
        document["files_omitted"] = len(document.pop("files", []))
    return emit(
        session, EXPORT_COMPLETED, None, {"date": day.isoformat(), "manifest": document}, now
    )


def emit_quarantined(
    session: Session, codes: Sequence[tuple[str | None, str]], now: datetime
) -> None:
    """``usage.quarantined`` {count, by_code}: one per account (None: keys of no account) of the
    events a batch quarantined, given as (account id, code) pairs."""
    accounts: dict[str | None, dict[str, int]] = {}
    for account_id, code in codes:
        by_code = accounts.setdefault(account_id, {})
        by_code[code] = by_code.get(code, 0) + 1
    for account_id in sorted(accounts, key=lambda a: a or ""):
        by_code = dict(sorted(accounts[account_id].items()))
        data = {"count": sum(by_code.values()), "by_code": by_code}
        emit(session, USAGE_QUARANTINED, account_id, data, now)


# -- SQL pieces both backends render -------------------------------------------------------------


class event_id(FunctionElement[str]):
    """A new ``evt_…`` id made by the database (128 random bits, hex)."""

    inherit_cache = True
    name = "event_id"
    type = String()


@compiles(event_id)
def _event_id_pg(element: event_id, compiler: Any, **kw: Any) -> str:
    return "'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '')"


@compiles(event_id, "sqlite")
def _event_id_sqlite(element: event_id, compiler: Any, **kw: Any) -> str:
    return "'evt_' || lower(hex(randomblob(16)))"


class json_object_text(FunctionElement[str]):
    """A JSON object of key/value pairs, as text (``json_build_object`` / ``json_object``)."""

    inherit_cache = True
    name = "json_object_text"
    type = Text()


@compiles(json_object_text)
def _json_object_pg(element: json_object_text, compiler: Any, **kw: Any) -> str:
    return f"CAST(json_build_object({compiler.process(element.clauses, **kw)}) AS TEXT)"


@compiles(json_object_text, "sqlite")
def _json_object_sqlite(element: json_object_text, compiler: Any, **kw: Any) -> str:
    return f"json_object({compiler.process(element.clauses, **kw)})"


def crosses_low(before: Any, after: Any, threshold: Any) -> ColumnElement[bool]:
    """``credit.balance_low``'s crossing: from ≥ the threshold (set) to below it."""
    return and_(threshold.is_not(None), before >= threshold, after < threshold)


def crosses_depleted(before: Any, after: Any) -> ColumnElement[bool]:
    """``credit.balance_depleted``'s crossing: from > 0 to ≤ 0."""
    return and_(before > 0, after <= 0)


def crosses(before: Any, after: Any, threshold: Any) -> ColumnElement[bool]:
    """Whether a move from ``before`` to ``after`` crosses any threshold (a debit's program
    writes the events only then: ``balance_crossings``)."""
    return or_(crosses_low(before, after, threshold), crosses_depleted(before, after))


def balance_crossings(moves: FromClause, now: Any, account_id: Any = None) -> Any:
    """Write the threshold events of balance moves: ``moves`` has ``account_id``,
    ``before_microcents`` and ``after_microcents`` (the balance before and after the
    transaction's move, read under the account's row lock, so two transactions that together
    cross see the crossing once, in the second).

    * ``credit.balance_low``: from ≥ the account's threshold to below it. Re-armed by being at or
      above it again; a threshold set above the balance fires nothing until that recovery
      (the balance was not ≥ the threshold before any later move).
    * ``credit.balance_depleted``: from > 0 to ≤ 0; re-armed above 0.

    ``account_id``, when the moves are one account's, names it to the account's read too (on
    Citus the read then goes to that account's shard alone).
    """
    threshold = ACCOUNTS.c.low_balance_threshold_microcents
    on = ACCOUNTS.c.id == moves.c.account_id
    if account_id is not None:
        on = and_(on, ACCOUNTS.c.id == account_id)
    joined = moves.join(ACCOUNTS, on)
    low = (
        select(
            event_id(),
            moves.c.account_id,
            literal(BALANCE_LOW, String()),
            json_object_text(
                literal("balance_microcents", String()),
                moves.c.after_microcents,
                literal("threshold_microcents", String()),
                threshold,
            ),
            now,
        )
        .select_from(joined)
        .where(crosses_low(moves.c.before_microcents, moves.c.after_microcents, threshold))
    )
    depleted = (
        select(
            event_id(),
            moves.c.account_id,
            literal(BALANCE_DEPLETED, String()),
            json_object_text(literal("balance_microcents", String()), moves.c.after_microcents),
            now,
        )
        .select_from(moves)
        .where(crosses_depleted(moves.c.before_microcents, moves.c.after_microcents))
    )
    crossed = union_all(low, depleted).subquery("crossed")
    return insert(EVENTS).from_select(
        ["public_id", "account_id", "type", "data", "created_at"],
        select(*crossed.c),
    )


def note_balance_move(
    session: Session, account_id: str, before: int, after: int, now: datetime
) -> None:
    """Grants and adjustments: ``balance_crossings`` for one move, in the session's transaction
    (the caller holds the account's row lock)."""
    if before == after:
        return
    from metering.models.base import UTCDateTime

    moves = select(
        literal(account_id, String()).label("account_id"),
        literal(before, ACCOUNTS.c.balance_microcents.type).label("before_microcents"),
        literal(after, ACCOUNTS.c.balance_microcents.type).label("after_microcents"),
    ).subquery("m")
    session.execute(
        balance_crossings(moves, literal(now, UTCDateTime()), literal(account_id, String()))
    )


def grants_expired(due: FromClause, now: Any) -> Any:
    """``credit.grant_expired`` {grant_id, forfeited_microcents}: one per expiry entry written
    (``due`` has ``grant_id``, ``account_id`` and ``amount``, the forfeited remainder), in the
    transaction that writes it."""
    return insert(EVENTS).from_select(
        ["public_id", "account_id", "type", "data", "created_at"],
        select(
            event_id(),
            due.c.account_id,
            literal(GRANT_EXPIRED, String()),
            json_object_text(
                literal("grant_id", String()),
                due.c.grant_id,
                literal("forfeited_microcents", String()),
                due.c.amount,
            ),
            now,
        ),
    )
