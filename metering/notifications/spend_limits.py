"""``spend_limit.threshold_reached`` (docs/api.md#event-types): a key's charges in its spend window
reach 80%, and 100%, of its limit; a jump past both fires 80 then 100; once per key, window and
percent.

One step list (``threshold_steps``), run at the end of the usage programs
(metering.usage.recording) after the batch's rollup rows are added, so on both backends, in
the transaction that records the charges:

* **What a key has spent** is the spend-limit check's own rule (metering.accounts.spend
  ``key_charges``: its charges with ``occurred_at`` in the window), over the window that
  contains the clock's now (metering.accounts.windows, as the check and ``GET /v1/api-keys``);
  charges of an earlier window (late usage) move nothing in the current one.
* **Once**: a reached threshold is a row of ``spend_limit_notices``, keyed by (account, key,
  window kind, window start, percent), inserted ``ON CONFLICT DO NOTHING``; only the rows that
  insert returns become events. A new window has a new start: re-armed.
* **Exact under concurrency**: only prepaid accounts' keys are limited (the check-and-hold leaves
  unbilled accounts alone), and a prepaid batch has taken its account's row lock (the balance
  update) before these steps, so of two batches that together reach a threshold the second
  waits for the first's commit and then sees both batches' charges (READ COMMITTED: a fresh
  snapshot per statement); the notice's key does the rest.
* **Cost**: the caller says whether any recorded charge's key has a limit (``p_spend_limited``,
  from the batch's lookup): when none has, the steps are one test of that parameter, no
  statement. A limited key costs one statement (the notices' insert), and one more when a
  threshold is reached (the events).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import BigInteger, Integer, String, and_, insert, literal, select
from sqlalchemy.sql.elements import BindParameter

from metering import programs as p
from metering.accounts.spend import key_charges
from metering.accounts.windows import window_bounds
from metering.kit.timeutil import format_timestamp
from metering.models import SpendLimitNotice, table
from metering.models.base import UTCDateTime
from metering.notifications.outbox import EVENTS, SPEND_LIMIT_REACHED, event_id, json_object_text

NOTICES = table(SpendLimitNotice)

PERCENTS = (80, 100)

# One row per limited key of the batch and percent (``limit_rows``).
LIMITS_IN = p.Records(
    "p_spend_limits",
    (
        ("account_id", NOTICES.c.account_id.type),
        ("api_key_id", NOTICES.c.api_key_id.type),
        ("spend_limit_window", NOTICES.c.spend_limit_window.type),
        ("window_starts_at", UTCDateTime()),
        ("window_ends_at", UTCDateTime()),
        ("window_starts", String()),  # window_starts_at as the event shows it
        ("percent", Integer()),
        ("limit_microcents", BigInteger()),
        ("threshold_microcents", BigInteger()),
    ),
)
LIMITED = p.Var("p_spend_limited", p.Boolean())
NO_LIMITS = "[]"  # LIMITS_IN without rows, on both backends

_REACHED = p.Rows(
    "v_reached",
    (
        ("account_id", NOTICES.c.account_id.type),
        ("api_key_id", NOTICES.c.api_key_id.type),
        ("percent", Integer()),
        ("spent_microcents", BigInteger()),
    ),
)


class KeyLimit(NamedTuple):
    """A recorded charge's key with a spend limit (of a prepaid account)."""

    account_id: str
    api_key_id: str
    limit_microcents: int
    window: str


def threshold(limit_microcents: int, percent: int) -> int:
    """The least spend that reaches ``percent`` of the limit, exactly (integers: no float, and
    no product that could leave 64 bits in the database); a limit of 0 is reached by the
    first charge above 0."""
    return max(1, -(-limit_microcents * percent // 100))


def limit_rows(limits: Iterable[KeyLimit], now: datetime) -> list[dict[str, Any]]:
    """``LIMITS_IN``'s rows for the keys of ``limits`` (duplicates allowed), each in the window
    that contains ``now``."""
    rows = []
    for limit in sorted(set(limits)):
        start, end = window_bounds(limit.window, now)
        for percent in PERCENTS:
            rows.append(
                {
                    "account_id": limit.account_id,
                    "api_key_id": limit.api_key_id,
                    "spend_limit_window": limit.window,
                    "window_starts_at": start,
                    "window_ends_at": end,
                    "window_starts": format_timestamp(start),
                    "percent": percent,
                    "limit_microcents": limit.limit_microcents,
                    "threshold_microcents": threshold(limit.limit_microcents, percent),
                }
            )
    return rows


def limit_params(limits: Iterable[KeyLimit], now: datetime, on: p.Backend) -> dict[str, Any]:
    """The two parameters ``threshold_steps`` reads, for the programs' callers."""
    rows = limit_rows(limits, now)
    if not rows:
        return {LIMITS_IN.name: NO_LIMITS, LIMITED.name: False}
    return {LIMITS_IN.name: p.records_json(LIMITS_IN, rows, on), LIMITED.name: True}


def threshold_steps(on: p.Backend, now: BindParameter[Any]) -> list[p.Step]:
    """Write the notices and events of the thresholds the batch's limited keys have reached
    (after the batch's rollup rows are added, under the accounts' row locks)."""
    limits = on.records(LIMITS_IN, "sl")
    spent = key_charges(
        limits.c.account_id, limits.c.api_key_id, limits.c.window_starts_at, limits.c.window_ends_at
    )
    measured = select(limits, spent.label("spent")).subquery("measured")
    columns = [
        "account_id",
        "api_key_id",
        "spend_limit_window",
        "window_starts_at",
        "percent",
        "limit_microcents",
        "spent_microcents",
        "created_at",
    ]
    reached = (
        on.insert(NOTICES)
        .from_select(
            columns,
            select(*(measured.c[name] for name in columns[:6]), measured.c.spent, now).where(
                measured.c.spent >= measured.c.threshold_microcents
            ),
        )
        .on_conflict_do_nothing()
        .returning(*(NOTICES.c[name] for name, _ in _REACHED.columns))
    )
    fired = on.rows(_REACHED, "fired")
    shown = on.records(LIMITS_IN, "shown")
    events = insert(EVENTS).from_select(
        ["public_id", "account_id", "type", "data", "created_at"],
        select(
            event_id(),
            fired.c.account_id,
            literal(SPEND_LIMIT_REACHED, String()),
            json_object_text(
                literal("api_key_id", String()),
                fired.c.api_key_id,
                literal("window", String()),
                shown.c.spend_limit_window,
                literal("window_starts_at", String()),
                shown.c.window_starts,
                literal("spent_microcents", String()),
                fired.c.spent_microcents,
                literal("limit_microcents", String()),
                shown.c.limit_microcents,
                literal("percent", String()),
                fired.c.percent,
            ),
            now,
        )
        .select_from(
            fired.join(
                shown,
                and_(
                    shown.c.account_id == fired.c.account_id,
                    shown.c.api_key_id == fired.c.api_key_id,
                    shown.c.percent == fired.c.percent,
                ),
            )
        )
        # 80 before 100: the events' ids in that order.
        .order_by(
            p.byte_order(fired.c.account_id), p.byte_order(fired.c.api_key_id), fired.c.percent
        ),
    )
    return [
        p.When(
            LIMITED.ref,
            (
                p.Collect(reached, into=_REACHED, order_by=("account_id", "api_key_id", "percent")),
                p.When(on.count(_REACHED) > 0, (p.Run(events),)),
            ),
        )
    ]
