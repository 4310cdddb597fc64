"""The spending order of credit grants (docs/api.md#credit-ledger), defined once.

Every charge and negative adjustment is paid from the account's **live** grants (active, a
remainder, not expired at the service's clock when it is recorded: metering.states.grants) in
``SPENDING_ORDER``: priority ascending, then ``expires_at`` ascending with never-expiring grants
last, then creation order (the id of the ledger entry that created the grant). What they cannot
cover is the account's deficit; a new grant first pays off the deficit.

Here as a pure function (``allocate``, for tests and for reasoning) and as the SQL sort key
(``order_by``) that settlement's set-based allocation (metering.ledger.spending) runs with: both
come from ``SPENDING_ORDER``, and tests hold the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import case
from sqlalchemy.sql.elements import ColumnElement

from metering.states.grants import GrantStatus, is_live

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
    status: str = GrantStatus.ACTIVE


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
    for grant in spent_in_order(grants, now):
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


def spent_in_order(grants: Iterable[Grant], now: datetime) -> list[Grant]:
    """The live grants in spending order (``GET /v1/credits``'s list)."""
    return sorted(
        (g for g in grants if is_live(g.status, g.remaining, g.expires_at, now)), key=spending_key
    )
