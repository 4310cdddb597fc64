"""A key's spend window (docs/api.md#accounts-and-keys): the UTC calendar day, week (from Monday
00:00) or month that contains an instant, as one pure function. Every reader of a window — the
check-and-hold, ``GET /v1/api-keys`` (``window_starts_at`` and ``spent``) — asks here."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal, get_args

from metering.kit.timeutil import floor_day, next_month, start_of_month

SpendWindow = Literal["day", "week", "month"]
SPEND_WINDOWS: tuple[str, ...] = get_args(SpendWindow)
DEFAULT_WINDOW: SpendWindow = "month"


def window_bounds(window: str, at: datetime) -> tuple[datetime, datetime]:
    """The half-open UTC period [start, end) of kind ``window`` that contains ``at`` (an aware
    instant): both ends fall on UTC midnights, so the daily rollups sum it exactly."""
    day = floor_day(at)
    if window == "day":
        return day, day + timedelta(days=1)
    if window == "week":
        start = day - timedelta(days=day.weekday())  # Monday is 0
        return start, start + timedelta(days=7)
    if window == "month":
        start = start_of_month(at)
        return start, next_month(start)
    raise ValueError(f"unknown spend window {window!r}")
