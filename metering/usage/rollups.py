"""The report aggregates (``usage_rollups``), maintained in the ingest transaction.

Every recorded event adds to six rows: bucket width {1h, 1d} × grouping {key_model, key (model
''), model (api key '')}. A batch's usage is summed here per account, key, model and hour
(``rows``: one row per hour, not six), and the program that books it spreads each hour over its
six rows and adds them with one multi-row upsert, written in key order so concurrent batches
lock them in the same order (no deadlock): ``metering.usage.recording.rollup_upsert``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from metering import programs as p
from metering.kit.timeutil import floor_day, floor_hour
from metering.usage.events import Event
from metering.usage.recording import (
    COUNTERS,
    GROUPINGS,
    HOURLY_IN,
    LAST_EVENT,
    ROLLUP_KEY,
    WIDTHS,
)

__all__ = ["COUNTERS", "GROUPINGS", "WIDTHS", "RollupKey", "aggregate", "rows"]

# (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id): the primary key.
RollupKey = tuple[str, str, str, datetime, str, str]
assert len(ROLLUP_KEY) == 6 and COUNTERS == (
    "requests",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_microcents",
)
# (account_id, api_key_id, model_id, hour): what ``rows`` sums by.
HourKey = tuple[str, str, str, datetime]


def aggregate(recorded: Iterable[tuple[int, Event]]) -> dict[HourKey, list[int]]:
    """Counters (``COUNTERS`` order, then last_event_id) of the recorded events (new id, event)
    per account, key, model and hour (one step per event)."""
    hourly: dict[HourKey, list[int]] = {}
    hours: dict[tuple[int, int, int, int], datetime] = {}  # a batch spans a few hours at most
    for event_id, e in recorded:
        usage, charge, at = e.usage, e.charge, e.occurred_at
        assert usage is not None and charge is not None and at is not None
        assert at.tzinfo is UTC  # as parsed: the hour is the UTC hour
        hour_of = (at.year, at.month, at.day, at.hour)
        hour = hours.get(hour_of)
        if hour is None:
            hour = hours[hour_of] = floor_hour(at)
        group = (e.account_id or "", e.api_key_id or "", e.model_id or "", hour)
        found = hourly.get(group)
        if found is None:
            hourly[group] = [
                1,
                usage.prompt_tokens,  # cache reads included
                usage.cached_tokens,
                usage.output_tokens,  # reasoning included
                usage.reasoning_tokens,
                charge.total_microcents,
                event_id,
            ]
        else:
            found[0] += 1
            found[1] += usage.prompt_tokens
            found[2] += usage.cached_tokens
            found[3] += usage.output_tokens
            found[4] += usage.reasoning_tokens
            found[5] += charge.total_microcents
            if event_id > found[6]:
                found[6] = event_id
    return hourly


_NAMES = ("account_id", "api_key_id", "model_id", "hour", "day", *COUNTERS, LAST_EVENT)
assert HOURLY_IN.names == _NAMES


def rows(recorded: Iterable[tuple[int, Event]]) -> list[dict[str, Any]]:
    """The hourly rows (``HOURLY_IN``) to add for the recorded events (new id, event)."""
    return [
        dict(zip(_NAMES, (account, key, model, hour, floor_day(hour), *values), strict=True))
        for (account, key, model, hour), values in aggregate(recorded).items()
    ]


ENCODE = p.records_encoder(HOURLY_IN, p.POSTGRESQL)
ENCODE_SQLITE = p.records_encoder(HOURLY_IN, p.SQLITE)
