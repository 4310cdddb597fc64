"""What a key, a member or a project has spent: the charges with ``occurred_at`` in a window,
from the report aggregates (the daily per-key rollup rows, written in the ingest transaction),
of the key itself or of every key of the member or the project (a key's project and member are
fixed for its life, so the per-key rows say what each spent). The ledger's spend-limit checks
ask here rather than reading the rollups themselves."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select

from metering.models import ApiKey, UsageRollup, table

ROLLUPS = table(UsageRollup)
KEYS = table(ApiKey)


def keys_of(account_id: Any, column: str, owner_id: Any) -> Any:
    """The ids of the account's keys whose ``column`` (``project_id`` or ``member_id``) is
    ``owner_id``, revoked ones included (what they spent still counts). Any other relation
    named is correlated to an enclosing statement, however deep (a row of the thresholds'
    limits: metering.notifications.spend_limits)."""
    return (
        select(KEYS.c.id)
        .where(KEYS.c.account_id == account_id, KEYS.c[column] == owner_id)
        .correlate_except(KEYS)
    )


def _charges(account_id: Any, start: Any, end: Any, which: ColumnElement[bool]) -> Any:
    return (
        select(func.coalesce(func.sum(ROLLUPS.c.cost_microcents), 0))
        .where(
            ROLLUPS.c.account_id == account_id,
            ROLLUPS.c.bucket_width == "1d",
            ROLLUPS.c.grouping == "key",
            ROLLUPS.c.bucket_start >= start,
            ROLLUPS.c.bucket_start < end,
            which,
        )
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
