"""The report aggregates (``usage_rollups``), maintained in the ingest transaction.

Every recorded event adds to six rows: bucket width {1h, 1d} × grouping {key_model, key (model
''), model (api key '')}. A batch's additions are summed here per rollup key (``rows``), then
added with one multi-row upsert (metering.usage.recording), its rows sorted so concurrent
batches lock them in the same order (no deadlock).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from metering.kit import programs as p
from metering.kit.timeutil import floor_day, floor_hour
from metering.usage.events import Event
from metering.usage.recording import COUNTERS, LAST_EVENT, ROLLUP_KEY, ROLLUPS, ROLLUPS_IN

GROUPINGS = ("key_model", "key", "model")
WIDTHS = ("1h", "1d")

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


def rollup_keys(
    account_id: str, api_key_id: str, model_id: str, hour: datetime
) -> Iterator[RollupKey]:
    """The six rows that usage of one key and model in one (UTC) hour counts in."""
    for width, start in (("1h", hour), ("1d", floor_day(hour))):
        yield account_id, width, "key_model", start, api_key_id, model_id
        yield account_id, width, "key", start, api_key_id, ""
        yield account_id, width, "model", start, "", model_id


def aggregate(recorded: Iterable[tuple[int, Event]]) -> dict[RollupKey, list[int]]:
    """Counters (``COUNTERS`` order, then last_event_id) per rollup row of the recorded events
    (new id, event): summed per key, model and hour first (one step per event), then spread
    over the six row kinds."""
    hourly: dict[tuple[str, str, str, datetime], list[int]] = {}
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
    rows: dict[RollupKey, list[int]] = {}
    for group, values in hourly.items():
        for key in rollup_keys(*group):
            found = rows.get(key)
            if found is None:
                rows[key] = list(values)
            else:
                for index in range(6):
                    found[index] += values[index]
                found[6] = max(found[6], values[6])
    return rows


_NAMES = (*ROLLUP_KEY, *COUNTERS, LAST_EVENT)
assert set(_NAMES) == {c.name for c in ROLLUPS.columns}


def rows(recorded: Iterable[tuple[int, Event]]) -> list[dict[str, Any]]:
    """The rollup rows to add for the recorded events (new id, event), sorted by key."""
    return [
        dict(zip(_NAMES, (*key, *values), strict=True))
        for key, values in sorted(aggregate(recorded).items())
    ]


# The bucket width and grouping are from the lists above: no escaping needed.
ENCODE = p.records_encoder(ROLLUPS_IN, p.POSTGRESQL, verbatim=("bucket_width", "grouping"))
ENCODE_SQLITE = p.records_encoder(ROLLUPS_IN, p.SQLITE, verbatim=("bucket_width", "grouping"))
