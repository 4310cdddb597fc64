"""The spending order of credit grants (contract §9), defined once.

Every charge and negative adjustment is paid from the account's **live** grants (active, a
remainder, not expired at the service's clock when it is recorded) in ``SPENDING_ORDER``:
priority ascending, then ``expires_at`` ascending with never-expiring grants last, then creation
order (the id of the ledger entry that created the grant). What they cannot cover is the
account's deficit; a new grant first pays off the deficit.

Here as a pure function (``allocate``, for tests and for reasoning) and as the SQL sort key
(``order_by``) that settlement's set-based allocation (metering.ledger.spending) runs with: both
come from ``SPENDING_ORDER``, and tests hold the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, or_
from sqlalchemy.sql.elements import ColumnElement

# (column, nulls last): the sort key of the spending order, in precedence.
SPENDING_ORDER: tuple[tuple[str, bool], ...] = (
    ("priority", False),
    ("expires_at", True),
    ("entry_id", False),
)

CATEGORIES = ("paid", "promotional", "adjustment")
DEFAULT_PRIORITY = {"paid": 50, "promotional": 10, "adjustment": 50}


@dataclass(frozen=True, slots=True)
class Grant:
    """What the spending order needs of a grant."""

    id: str
    priority: int
    expires_at: datetime | None
    entry_id: int
    remaining: int
    status: str = "active"


def spending_key(grant: Any) -> tuple[Any, ...]:
    """``SPENDING_ORDER`` as a Python sort key (a null sorts after every value when so marked)."""
    key: list[Any] = []
    for name, nulls_last in SPENDING_ORDER:
        value = getattr(grant, name)
        if nulls_last:
            key += [value is None, value if value is not None else 0]
        else:
            key.append(value)
    return tuple(key)


def order_by(grants: Any) -> list[ColumnElement[Any]]:
    """``SPENDING_ORDER`` as SQL sort expressions over ``grants``' columns (portable: a
    boolean "is null" first, where it sorts last, instead of ``NULLS LAST``)."""
    expressions: list[ColumnElement[Any]] = []
    for name, nulls_last in SPENDING_ORDER:
        column = grants.c[name]
        if nulls_last:
            expressions.append(case((column.is_(None), 1), else_=0))
        expressions.append(column)
    return expressions


def is_live(grant: Grant, now: datetime) -> bool:
    return (
        grant.status == "active"
        and grant.remaining > 0
        and (grant.expires_at is None or grant.expires_at > now)
    )


def live_sql(grants: Any, now: Any) -> ColumnElement[bool]:
    """``is_live`` over ``grants``' columns."""
    return and_(
        grants.c.status == "active",
        grants.c.remaining_microcents > 0,
        or_(grants.c.expires_at.is_(None), grants.c.expires_at > now),
    )


def pending_sql(grants: Any, now: Any) -> ColumnElement[bool]:
    """Grants expired at ``now`` whose forfeit is not yet written (``metering verify``'s
    pending, and what the check-and-hold and credits leave out of the balance)."""
    return and_(
        grants.c.status == "active",
        grants.c.remaining_microcents > 0,
        grants.c.expires_at.isnot(None),
        grants.c.expires_at <= now,
    )


@dataclass(frozen=True, slots=True)
class Allocation:
    """How a debit was paid: ``takes`` (grant id, amount) in spending order, and the part no
    live grant could pay (the deficit grows by it)."""

    takes: tuple[tuple[str, int], ...]
    shortfall: int


def allocate(grants: Iterable[Grant], amount: int, now: datetime) -> Allocation:
    """Pay ``amount`` (≥ 0) from the live grants at ``now``, in spending order."""
    assert amount >= 0
    takes: list[tuple[str, int]] = []
    left = amount
    for grant in sorted((g for g in grants if is_live(g, now)), key=spending_key):
        if left == 0:
            break
        take = min(grant.remaining, left)
        takes.append((grant.id, take))
        left -= take
    return Allocation(tuple(takes), left)


def pay_off(deficit: int, amount: int) -> tuple[int, int]:
    """A new grant of ``amount`` against a ``deficit``: (paid off, its remainder)."""
    paid = min(deficit, amount)
    return paid, amount - paid


def status(stored: str, remaining: int, expires_at: datetime | None, now: datetime) -> str:
    """A grant's status as read (precedence: voided, expired, depleted)."""
    if stored == "voided":
        return "voided"
    if stored == "expired" or (expires_at is not None and expires_at <= now):
        return "expired"
    if remaining == 0:
        return "depleted"
    return "active"


def spent_in_order(grants: Sequence[Grant], now: datetime) -> list[Grant]:
    """The live grants in spending order (``GET /v1/credits``'s list)."""
    return sorted((g for g in grants if is_live(g, now)), key=spending_key)
