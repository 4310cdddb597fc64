"""The credit grant's state machine, in one place: its statuses as stored and as read, the legal
transitions, and when a grant is live (debits are paid from it) — as plain Python and as SQL,
for every backend, the check-and-hold, the credits and ``metering verify``.

    active ──expire──▶ expired    (its expires_at passed: the remainder forfeited, an expiry entry)
      │
      └────void────▶ voided      (an operator's void: the remainder forfeited, a void entry)

Stored, a grant is ``active``, ``expired`` or ``voided``. Read (``reads_as``: the status the API
shows, docs/api.md "Credit ledger"), the remainder and the clock decide too, in this
precedence: ``voided``; ``expired`` (stored so, or its ``expires_at`` passed, the forfeit
written or not); ``depleted`` (nothing remains); ``active``. A grant is **live** exactly when it
reads as active. A grant still stored active, past its expiry and with a remainder, has its
forfeit **pending**: the next debit of its account (or the scheduler's tidy-up) writes it and
stores ``expired``; until then the balance as the clock sees it leaves it out.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, and_, or_


class GrantStatus(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    VOIDED = "voided"
    DEPLETED = "depleted"  # read only: an active grant with nothing left


STORED = (GrantStatus.ACTIVE, GrantStatus.EXPIRED, GrantStatus.VOIDED)

# The stored status a step writes, from the stored statuses it may leave; both forfeit what
# remains. An expiry is written for a grant whose forfeit is pending (``pending_sql``), a void
# only for a live one (``is_live``): a depleted grant has nothing to forfeit and stays as it is.
EXPIRE = (frozenset({GrantStatus.ACTIVE}), GrantStatus.EXPIRED)
VOID = (frozenset({GrantStatus.ACTIVE}), GrantStatus.VOIDED)
TRANSITIONS = {"expire": EXPIRE, "void": VOID}

# The same rule as DDL text, for the table's partial index.
ACTIVE_ROWS = f"status = '{GrantStatus.ACTIVE}'"


def reads_as(
    stored: str, remaining: int, expires_at: datetime | None, now: datetime
) -> GrantStatus:
    """The status a grant shows at ``now`` (precedence: voided, expired, depleted)."""
    if stored == GrantStatus.VOIDED:
        return GrantStatus.VOIDED
    if stored == GrantStatus.EXPIRED or (expires_at is not None and expires_at <= now):
        return GrantStatus.EXPIRED
    if remaining == 0:
        return GrantStatus.DEPLETED
    return GrantStatus.ACTIVE


def is_live(stored: str, remaining: int, expires_at: datetime | None, now: datetime) -> bool:
    """Debits are paid from the grant at ``now``: it reads as active."""
    return reads_as(stored, remaining, expires_at, now) is GrantStatus.ACTIVE


def target(transition: str) -> str:
    return TRANSITIONS[transition][1].value


# -- The same rules as SQL, over the credit_grants table (or an alias of it) ----------------------


def live_sql(grants: Any, now: Any) -> ColumnElement[bool]:
    """``is_live`` over ``grants``' columns: stored active, a remainder, not expired at ``now``."""
    return and_(
        grants.c.status == GrantStatus.ACTIVE.value,
        grants.c.remaining_microcents > 0,
        or_(grants.c.expires_at.is_(None), grants.c.expires_at > now),
    )


def pending_sql(grants: Any, now: Any) -> ColumnElement[bool]:
    """Grants expired at ``now`` whose forfeit is not yet written (``metering verify``'s
    pending, and what the check-and-hold and credits leave out of the balance)."""
    return and_(
        grants.c.status == GrantStatus.ACTIVE.value,
        grants.c.remaining_microcents > 0,
        grants.c.expires_at.isnot(None),
        grants.c.expires_at <= now,
    )


def stored_active(grants: Any) -> ColumnElement[bool]:
    """Stored active (live, depleted, or with its forfeit pending): the grants whose remainders
    the balance holds, as written."""
    return grants.c.status == GrantStatus.ACTIVE.value
