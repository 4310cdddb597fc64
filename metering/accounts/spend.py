"""What a key, a member or a project has spent: the charges with ``occurred_at`` in a window,
from the report aggregates (the daily per-key rollup rows, written in the ingest transaction),
of the key itself or of every key of the member or the project (a key's project and member are
fixed for its life, so the per-key rows say what each spent). The ledger's spend-limit checks
ask here rather than reading the rollups themselves: one scope at a time (``key_charges``,
``owner_charges``) or several in one statement (``charges_rows``, ``per_scope``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.sql.expression import FromClause

from metering.models import ApiKey, UsageRollup, table

ROLLUPS = table(UsageRollup)
KEYS = table(ApiKey)


def _owned(column: str, owner_id: Any) -> ColumnElement[bool]:
    """Whether a key (a row of api_keys) is ``owner_id``'s (``column``: ``project_id`` or
    ``member_id``) or, with ``column`` ``id``, is that key."""
    return KEYS.c[column] == owner_id


def keys_of(account_id: Any, column: str, owner_id: Any) -> Any:
    """The ids of the account's keys whose ``column`` (``project_id`` or ``member_id``) is
    ``owner_id``, revoked ones included (what they spent still counts). Any other relation
    named is correlated to an enclosing statement, however deep (a row of the thresholds'
    limits: metering.notifications.spend_limits)."""
    return (
        select(KEYS.c.id)
        .where(KEYS.c.account_id == account_id, _owned(column, owner_id))
        .correlate_except(KEYS)
    )


def _key_days(account_id: Any) -> tuple[ColumnElement[bool], ...]:
    """The account's daily per-key rollup rows: where every spend is read from."""
    return (
        ROLLUPS.c.account_id == account_id,
        ROLLUPS.c.bucket_width == "1d",
        ROLLUPS.c.grouping == "key",
    )


def _within(day: Any, start: Any, end: Any) -> ColumnElement[bool]:
    return and_(day >= start, day < end)


def _charges(account_id: Any, start: Any, end: Any, which: ColumnElement[bool]) -> Any:
    return (
        select(func.coalesce(func.sum(ROLLUPS.c.cost_microcents), 0))
        .where(*_key_days(account_id), _within(ROLLUPS.c.bucket_start, start, end), which)
        .scalar_subquery()
    )


def key_charges(account_id: Any, api_key_id: Any, start: Any, end: Any) -> ColumnElement[Any]:
    """The key's charges in [start, end), both on UTC day boundaries (a scalar subquery)."""
    return _charges(account_id, start, end, ROLLUPS.c.api_key_id == api_key_id)


def owner_charges(
    account_id: Any, column: str, owner_id: Any, start: Any, end: Any
) -> ColumnElement[Any]:
    """The charges in [start, end) of every key of a project or a member (``column``:
    ``project_id`` or ``member_id``), a scalar subquery."""
    which = ROLLUPS.c.api_key_id.in_(keys_of(account_id, column, owner_id))
    return _charges(account_id, start, end, which)


@dataclass(frozen=True)
class Scope:
    """What one spend limit bounds, named ``name``: the key itself (``column`` ``id``,
    ``owner_id`` the key's id) or every key of a project or a member (``project_id``,
    ``member_id``), over the window [start, end) (UTC day boundaries; null for a scope
    without a limit: none of its charges is in it, and what it sums goes unread)."""

    name: str
    column: str
    owner_id: Any
    start: Any = None
    end: Any = None


def with_keys(account_id: Any, rows: FromClause) -> FromClause:
    """An account's rows that name a key (``api_key_id``), joined to the account's keys (named
    by the account, so that only its keys are read whatever the plan): a key's project and
    member are fixed for its life, so its row says whose they were."""
    return rows.join(KEYS, and_(KEYS.c.account_id == account_id, KEYS.c.id == rows.c.api_key_id))


def charges_rows(account_id: Any, scopes: Sequence[Scope]) -> Select[Any]:
    """The account's charges that any of the scopes' windows can hold, each as ``api_key_id``,
    ``amount`` and ``day`` (its UTC day): its daily per-key rows from the earliest window's
    start to the latest one's end (PostgreSQL's ``least`` and ``greatest``, which pass over
    nulls; one scope needs neither)."""
    if len(scopes) == 1:
        [only] = scopes
        start, end = only.start, only.end
    else:
        start = func.least(*(scope.start for scope in scopes))
        end = func.greatest(*(scope.end for scope in scopes))
    return select(
        ROLLUPS.c.api_key_id,
        ROLLUPS.c.cost_microcents.label("amount"),
        ROLLUPS.c.bucket_start.label("day"),
    ).where(*_key_days(account_id), _within(ROLLUPS.c.bucket_start, start, end))


def per_scope(account_id: Any, rows: FromClause, scopes: Sequence[Scope]) -> Select[Any]:
    """One row, a column per scope (by its name): the sum of the ``amount`` of the ``rows``
    (the account's, as ``charges_rows`` gives them) whose key is the scope's and whose ``day``
    is in the scope's window, or null (an amount that counts in any window: a hold in force).
    The rows are read once and joined to their keys once, whatever the number of scopes."""
    day = rows.c.day
    return select(
        *(
            func.coalesce(
                func.sum(rows.c.amount).filter(
                    or_(day.is_(None), _within(day, scope.start, scope.end)),
                    _owned(scope.column, scope.owner_id),
                ),
                0,
            ).label(scope.name)
            for scope in scopes
        )
    ).select_from(with_keys(account_id, rows))
