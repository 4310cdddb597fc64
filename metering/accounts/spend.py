"""What a key, a member or a project has spent: the charges with ``occurred_at`` in a window,
from the report aggregates (the daily per-key rollup rows, written in the ingest transaction),
of the key itself or of every key of the member or the project (a key's project and member are
fixed for its life, so the per-key rows say what each spent). The ledger's spend-limit checks
ask here rather than reading the rollups themselves: one scope at a time (``key_charges``,
``owner_charges``) or several in one statement (``scope_charges``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select
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


def _within(start: Any, end: Any) -> ColumnElement[bool]:
    return and_(ROLLUPS.c.bucket_start >= start, ROLLUPS.c.bucket_start < end)


def _charges(account_id: Any, start: Any, end: Any, which: ColumnElement[bool]) -> Any:
    return (
        select(func.coalesce(func.sum(ROLLUPS.c.cost_microcents), 0))
        .where(*_key_days(account_id), _within(start, end), which)
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
    without a limit, which then sums nothing)."""

    name: str
    column: str
    owner_id: Any
    start: Any = None
    end: Any = None


def with_keys(rows: FromClause) -> FromClause:
    """An account's rows that name a key (``api_key_id``), joined to their keys, of the same
    account: a key's project and member are fixed for its life, so its row says whose they
    were."""
    return rows.join(
        KEYS, and_(KEYS.c.account_id == rows.c.account_id, KEYS.c.id == rows.c.api_key_id)
    )


def per_scope(
    amount: ColumnElement[Any],
    rows: FromClause,
    where: Sequence[ColumnElement[bool]],
    scopes: Sequence[tuple[Scope, ColumnElement[bool]]],
) -> Select[Any]:
    """One row, a column per scope (by its name): the sum of ``amount`` over the ``rows`` that
    meet ``where`` and the scope's own condition, and whose key is the scope's (0 for none).
    The rows are read once and joined to their keys once, whatever the number of scopes."""
    return (
        select(
            *(
                func.coalesce(
                    func.sum(amount).filter(and_(own, _owned(scope.column, scope.owner_id))), 0
                ).label(scope.name)
                for scope, own in scopes
            )
        )
        .select_from(with_keys(rows))
        .where(*where)
    )


def scope_charges(account_id: Any, scopes: Sequence[Scope]) -> Select[Any]:
    """Each scope's charges in its window (a column by the scope's name), in one scan of the
    account's daily per-key rows from the earliest window's start to the latest one's end
    (PostgreSQL's ``least`` and ``greatest``, which pass over nulls: one scope needs neither)."""
    if len(scopes) == 1:
        [only] = scopes
        start, end = only.start, only.end
    else:
        start = func.least(*(scope.start for scope in scopes))
        end = func.greatest(*(scope.end for scope in scopes))
    return per_scope(
        ROLLUPS.c.cost_microcents,
        ROLLUPS,
        (*_key_days(account_id), _within(start, end)),
        [(scope, _within(scope.start, scope.end)) for scope in scopes],
    )
