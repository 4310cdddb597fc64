"""``spend_limit.threshold_reached`` (docs/api.md#event-types): the charges in a spend window of a
project, a member (over all of its keys) or a key reach 80%, and 100%, of its limit; a jump past
both fires 80 then 100; once per project, member or key, window and percent.

One step list (``threshold_steps``), run at the end of the usage programs
(metering.usage.recording) after the batch's rollup rows are added, so on both backends, in
the transaction that records the charges:

* **What a scope has spent** is the spend-limit check's own rule (metering.accounts.spend
  ``key_charges`` and ``owner_charges``: the charges with ``occurred_at`` in the window of the
  key, or of every key of the project or member), over the window that contains the clock's now
  (metering.accounts.windows, as the check and ``GET /v1/api-keys``); charges of an earlier
  window (late usage) move nothing in the current one.
* **Once**: a reached threshold is a row of ``spend_limit_notices``, keyed by (account, the
  scope's id, window kind, window start, percent), inserted ``ON CONFLICT DO NOTHING``; only the
  rows that insert returns become events. A new window has a new start: re-armed.
* **Exact under concurrency**: only prepaid accounts' keys are limited (the check-and-hold leaves
  unbilled accounts alone), and a prepaid batch has taken its account's row lock (the balance
  update) before these steps, so of two batches that together reach a threshold the second
  waits for the first's commit and then sees both batches' charges (READ COMMITTED: a fresh
  snapshot per statement); the notice's key does the rest.
* **Cost**: the caller says whether any recorded charge's key, project or member has a limit
  (``p_spend_limited``, from the batch's lookup): when none has, the steps are one test of that
  parameter, no statement. Limits cost one statement (the notices' insert), and one more when a
  threshold is reached (the events).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import BigInteger, Integer, String, and_, case, insert, literal, select
from sqlalchemy.sql.elements import BindParameter

from metering import programs as p
from metering.accounts.spend import key_charges, owner_charges
from metering.accounts.windows import window_bounds
from metering.kit.timeutil import format_timestamp
from metering.models import SpendLimitNotice, table
from metering.models.base import UTCDateTime
from metering.notifications.outbox import EVENTS, SPEND_LIMIT_REACHED, event_id, json_object_text

NOTICES = table(SpendLimitNotice)

PERCENTS = (80, 100)
# The key column that names a project's or a member's keys (metering.accounts.spend), by
# ``limit_scope`` (a key's own limit is the third scope, ``key``).
_OWNER_COLUMN = {"project": "project_id", "member": "member_id"}

# One row per limited scope of the batch and percent (``limit_rows``).
LIMITS_IN = p.Records(
    "p_spend_limits",
    (
        ("account_id", NOTICES.c.account_id.type),
        ("limit_scope", NOTICES.c.limit_scope.type),
        ("scope_id", NOTICES.c.scope_id.type),
        ("api_key_id", NOTICES.c.api_key_id.type),
        ("project_id", String()),
        ("member_id", String()),
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
        ("scope_id", NOTICES.c.scope_id.type),
        ("percent", Integer()),
        ("spent_microcents", BigInteger()),
    ),
)


class ScopeLimit(NamedTuple):
    """A spend limit that a recorded charge counts against (of a prepaid account): its key's,
    or its key's project's or member's (``limit_scope``; ``scope_id`` that one's id)."""

    account_id: str
    limit_scope: str
    scope_id: str
    api_key_id: str  # the charge's key
    project_id: str | None  # the key's project and member (None: a service key)
    member_id: str | None
    limit_microcents: int
    window: str


class KeyScopes(NamedTuple):
    """What a key's charges count against: its project and member, and each spend limit that
    is set, of the key, its project or its member (``limits``: (scope, id, microcents,
    window))."""

    project_id: str | None
    member_id: str | None
    limits: tuple[tuple[str, str, int, str], ...]

    @classmethod
    def of(
        cls,
        api_key_id: str,
        project_id: str | None,
        member_id: str | None,
        limits: Mapping[str, tuple[int | None, str | None]],
    ) -> KeyScopes:
        """From each scope's (limit, window) by ``limit_scope``: only the limits that are set."""
        ids = {"project": project_id, "member": member_id, "key": api_key_id}
        return cls(
            project_id,
            member_id,
            tuple(
                (scope, scope_id, limit, window)
                for scope, (limit, window) in limits.items()
                if (scope_id := ids[scope]) is not None and limit is not None and window is not None
            ),
        )

    def of_charge(self, account_id: str, api_key_id: str) -> list[ScopeLimit]:
        """The limits a charge of the key counts against."""
        return [
            ScopeLimit(
                account_id,
                scope,
                scope_id,
                api_key_id,
                self.project_id,
                self.member_id,
                limit,
                window,
            )
            for scope, scope_id, limit, window in self.limits
        ]


NO_SCOPES = KeyScopes(None, None, ())


def threshold(limit_microcents: int, percent: int) -> int:
    """The least spend that reaches ``percent`` of the limit, exactly (integers: no float, and
    no product that could leave 64 bits in the database); a limit of 0 is reached by the
    first charge above 0."""
    return max(1, -(-limit_microcents * percent // 100))


def limit_rows(limits: Iterable[ScopeLimit], now: datetime) -> list[dict[str, Any]]:
    """``LIMITS_IN``'s rows for the scopes of ``limits`` (duplicates allowed), each in the window
    that contains ``now``: one per scope, its key the first by id of the batch's keys charged
    against it."""
    first: dict[tuple[str, str], ScopeLimit] = {}
    for limit in sorted(set(limits)):
        first.setdefault((limit.account_id, limit.scope_id), limit)
    rows = []
    for limit in first.values():
        start, end = window_bounds(limit.window, now)
        for percent in PERCENTS:
            rows.append(
                {
                    "account_id": limit.account_id,
                    "limit_scope": limit.limit_scope,
                    "scope_id": limit.scope_id,
                    "api_key_id": limit.api_key_id,
                    "project_id": limit.project_id,
                    "member_id": limit.member_id,
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


def limit_params(limits: Iterable[ScopeLimit], now: datetime, on: p.Backend) -> dict[str, Any]:
    """The two parameters ``threshold_steps`` reads, for the programs' callers."""
    rows = limit_rows(limits, now)
    if not rows:
        return {LIMITS_IN.name: NO_LIMITS, LIMITED.name: False}
    return {LIMITS_IN.name: p.records_json(LIMITS_IN, rows, on), LIMITED.name: True}


def _spent(limits: Any) -> Any:
    """What the scope of each of ``limits``' rows has spent in its window: the spend-limit
    check's own sums."""
    account, scope_id = limits.c.account_id, limits.c.scope_id
    start, end = limits.c.window_starts_at, limits.c.window_ends_at
    return case(
        *(
            (limits.c.limit_scope == scope, owner_charges(account, column, scope_id, start, end))
            for scope, column in _OWNER_COLUMN.items()
        ),
        else_=key_charges(account, scope_id, start, end),
    )


def threshold_steps(on: p.Backend, now: BindParameter[Any]) -> list[p.Step]:
    """Write the notices and events of the thresholds the batch's limited scopes have reached
    (after the batch's rollup rows are added, under the accounts' row locks)."""
    limits = on.records(LIMITS_IN, "sl")
    measured = select(limits, _spent(limits).label("spent")).subquery("measured")
    columns = [
        "account_id",
        "limit_scope",
        "scope_id",
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
            select(*(measured.c[name] for name in columns[:8]), measured.c.spent, now).where(
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
                *(
                    item
                    for name in ("limit_scope", "api_key_id", "project_id", "member_id")
                    for item in (literal(name, String()), shown.c[name])
                ),
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
                    shown.c.scope_id == fired.c.scope_id,
                    shown.c.percent == fired.c.percent,
                ),
            )
        )
        # 80 before 100: the events' ids in that order.
        .order_by(
            p.byte_order(fired.c.account_id), p.byte_order(fired.c.scope_id), fired.c.percent
        ),
    )
    return [
        p.When(
            LIMITED.ref,
            (
                p.Collect(reached, into=_REACHED, order_by=("account_id", "scope_id", "percent")),
                p.When(on.count(_REACHED) > 0, (p.Run(events),)),
            ),
        )
    ]
