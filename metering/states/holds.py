"""The credit hold's state machine, in one place: its statuses, the legal transitions, and when a
hold counts against ``available`` — as plain Python and as SQL, for every backend, the metrics and
the reports.

    active ──settle──▶ settled
      │ ╲
      │  ╲──void────▶ voided
      │
      └──expire─────▶ expired ──settle──▶ settled   (late usage: it did get its usage)

A hold counts from the moment it is placed until it is settled, voided, or reaches its
``expires_at``, at that instant, with no sweeper: an ``active`` hold at or past ``expires_at``
*reads as* ``expired`` everywhere, swept or not. The tidy-up (and a check-and-hold of its
account) later writes ``expired``; nothing depends on when.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, or_

from metering.kit.ids import random_text
from metering.states import listed

# -- A hold's id names its account ----------------------------------------------------------------
# ``auth_<its account's id after "acct_">_<16 random characters>``: whoever holds a hold's id (the
# gateway, voiding it) names its account too, so a Citus cluster finds the hold on that account's
# shard without asking every shard (docs/citus.md#what-runs-on-a-cluster). Ids of holds placed
# before name none (``auth_<20 random characters>``).
_HOLD, _ACCOUNT = "auth_", "acct_"
HOLD_RANDOM = 16  # 80 bits per account


def new_hold_id(account_id: str) -> str:
    assert account_id.startswith(_ACCOUNT) and "_" not in account_id[len(_ACCOUNT) :]
    return f"{_HOLD}{account_id[len(_ACCOUNT) :]}_{random_text(HOLD_RANDOM)}"


def account_of(hold_id: str) -> str | None:
    """The account a hold's id names, or None (an id of the earlier form, or no hold's id)."""
    if not hold_id.startswith(_HOLD):
        return None
    account, separator, random = hold_id[len(_HOLD) :].rpartition("_")
    if not separator or not account or len(random) != HOLD_RANDOM or "_" in account:
        return None
    return _ACCOUNT + account


class HoldStatus(StrEnum):
    ACTIVE = "active"
    SETTLED = "settled"
    VOIDED = "voided"
    EXPIRED = "expired"


# The status a step leads to, from the statuses it may leave. Settlement also takes an expired
# hold (usage after expiry is billed and the hold is not lost usage); a void only an active one
# in force.
SETTLE = (frozenset({HoldStatus.ACTIVE, HoldStatus.EXPIRED}), HoldStatus.SETTLED)
VOID = (frozenset({HoldStatus.ACTIVE}), HoldStatus.VOIDED)
EXPIRE = (frozenset({HoldStatus.ACTIVE}), HoldStatus.EXPIRED)
TRANSITIONS = {"settle": SETTLE, "void": VOID, "expire": EXPIRE}

# The same rules as DDL text, for the table's partial indexes (its statuses' check:
# metering.models.base ``one_of``, from ``HoldStatus``).
ACTIVE_ROWS = f"status = '{HoldStatus.ACTIVE}'"
RELEASED_ROWS = f"counted AND status <> '{HoldStatus.ACTIVE}'"
# Holds not closed (active or expired: what a settlement may still take), the rows the tidy-up
# and the expired holds' gauge read. A void or a settlement takes a hold out of them, so the
# index over them is not written again by either (one server; SQLite keeps its whole index).
OPEN_ROWS = listed("status", sorted(SETTLE[0]))
# Expired holds whose ``authorization.expired_unused`` event is still to be written.
UNNOTICED_ROWS = f"status = '{HoldStatus.EXPIRED}' AND NOT unused_noticed"


def reads_as(status: str, expires_at: datetime, now: datetime) -> HoldStatus:
    """The status a hold shows at ``now``: an active one past its expiry is expired."""
    if status == HoldStatus.ACTIVE and expires_at <= now:
        return HoldStatus.EXPIRED
    return HoldStatus(status)


# -- The same rules as SQL, over the authorizations table (or an alias of it) ---------------------


def in_force(holds: Table | Any, now: Any) -> ColumnElement[bool]:
    """The hold counts against ``available`` at ``now``: active, and ``expires_at`` after it."""
    return and_(holds.c.status == HoldStatus.ACTIVE.value, holds.c.expires_at > now)


def past_expiry(holds: Table | Any, now: Any) -> ColumnElement[bool]:
    """Still marked active but at or past ``expires_at``: it reads as expired."""
    return and_(holds.c.status == HoldStatus.ACTIVE.value, holds.c.expires_at <= now)


def may(transition: str, holds: Table | Any) -> ColumnElement[bool]:
    """The hold is in a status that ``transition`` may leave."""
    sources, _ = TRANSITIONS[transition]
    return holds.c.status.in_(sorted(status.value for status in sources))


def target(transition: str) -> str:
    return TRANSITIONS[transition][1].value


def reads_as_sql(status: HoldStatus, holds: Table | Any, now: Any) -> ColumnElement[bool]:
    """Holds that read as ``status`` at ``now`` (``reads_as`` in SQL)."""
    if status is HoldStatus.ACTIVE:
        return in_force(holds, now)
    if status is HoldStatus.EXPIRED:
        return or_(holds.c.status == HoldStatus.EXPIRED.value, past_expiry(holds, now))
    return holds.c.status == status.value


def unnoticed(holds: Table | Any) -> ColumnElement[bool]:
    """``UNNOTICED_ROWS`` in SQL: expired, its ``expired_unused`` event not yet written."""
    return and_(holds.c.status == HoldStatus.EXPIRED.value, ~holds.c.unused_noticed)


def released(holds: Table | Any) -> ColumnElement[bool]:
    """Counted in its account's held counter but no longer active: what the account's next
    check-and-hold stops counting (see metering.ledger.placement)."""
    return and_(holds.c.counted, holds.c.status != HoldStatus.ACTIVE.value)
