"""What a key has spent: its charges with ``occurred_at`` in a window, from the report aggregates
(the daily per-key rollup rows, written in the ingest transaction). The ledger's spend-limit
check asks here rather than reading the rollups itself."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select

from metering.models import UsageRollup, table

ROLLUPS = table(UsageRollup)


def key_charges(account_id: Any, api_key_id: Any, start: Any, end: Any) -> ColumnElement[Any]:
    """The key's charges in [start, end), both on UTC day boundaries (a scalar subquery)."""
    return (
        select(func.coalesce(func.sum(ROLLUPS.c.cost_microcents), 0))
        .where(
            ROLLUPS.c.account_id == account_id,
            ROLLUPS.c.bucket_width == "1d",
            ROLLUPS.c.grouping == "key",
            ROLLUPS.c.bucket_start >= start,
            ROLLUPS.c.bucket_start < end,
            ROLLUPS.c.api_key_id == api_key_id,
        )
        .scalar_subquery()
    )
