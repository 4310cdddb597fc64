"""The report aggregates (``usage_rollups``), maintained in the ingest transaction.

Every recorded event adds to six rows: bucket width {1h, 1d} × grouping {key_model, key (model
'' ), model (api key '')}. A batch is summed in Python first and written with one multi-row
upsert, its rows sorted so concurrent batches lock them in the same order (no deadlock).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from metering.kit.timeutil import floor_day, floor_hour
from metering.models import UsageRollup, table
from metering.usage.sql import Update, insert_rows

ROLLUPS = table(UsageRollup)
GROUPINGS = ("key_model", "key", "model")
WIDTHS = ("1h", "1d")
COUNTERS = (
    "requests",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_microcents",
)

# (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id): the primary key.
RollupKey = tuple[str, str, str, datetime, str, str]


@dataclass(frozen=True, slots=True)
class RecordedUsage:
    """What one recorded event adds to the aggregates."""

    event_id: int
    account_id: str
    api_key_id: str
    model_id: str
    occurred_at: datetime
    prompt_tokens: int  # cache reads included
    cached_tokens: int
    output_tokens: int  # reasoning included
    reasoning_tokens: int
    cost_microcents: int


def rollup_keys(
    account_id: str, api_key_id: str, model_id: str, hour: datetime
) -> Iterator[RollupKey]:
    """The six rows that usage of one key and model in one (UTC) hour counts in."""
    for width, start in (("1h", hour), ("1d", floor_day(hour))):
        yield account_id, width, "key_model", start, api_key_id, model_id
        yield account_id, width, "key", start, api_key_id, ""
        yield account_id, width, "model", start, "", model_id


def _add(into: list[int], values: list[int]) -> None:
    for index in range(6):
        into[index] += values[index]
    into[6] = max(into[6], values[6])


def aggregate(events: Iterable[RecordedUsage]) -> dict[RollupKey, list[int]]:
    """Counters (COUNTERS order, then last_event_id) per rollup row: summed per key, model and
    hour first (one step per event), then spread over the six row kinds."""
    hourly: dict[tuple[str, str, str, datetime], list[int]] = {}
    for e in events:
        values = [
            1,
            e.prompt_tokens,
            e.cached_tokens,
            e.output_tokens,
            e.reasoning_tokens,
            e.cost_microcents,
            e.event_id,
        ]
        group = (e.account_id, e.api_key_id, e.model_id, floor_hour(e.occurred_at))
        found = hourly.get(group)
        if found is None:
            hourly[group] = values
        else:
            _add(found, values)
    rows: dict[RollupKey, list[int]] = {}
    for group, values in hourly.items():
        for key in rollup_keys(*group):
            found = rows.get(key)
            if found is None:
                rows[key] = list(values)
            else:
                _add(found, values)
    return rows


_COLUMNS = (
    "account_id",
    "bucket_width",
    "grouping",
    "bucket_start",
    "api_key_id",
    "model_id",
    *COUNTERS,
    "last_event_id",
)
_KEY = _COLUMNS[:6]
_ADD: dict[str, Update] = {**dict.fromkeys(COUNTERS, "add"), "last_event_id": "greatest"}


def add_to_rollups(session: Session, events: Iterable[RecordedUsage]) -> None:
    rows = aggregate(events)
    insert_rows(
        session,
        ROLLUPS,
        _COLUMNS,
        [(*key, *values) for key, values in sorted(rows.items())],
        conflict=_KEY,
        update=_ADD,
    )
