"""The report aggregates (``usage_rollups``), maintained in the ingest transaction: what a
rollup row is, and a batch's usage summed for them.

Every recorded event adds to six rows: bucket width {1h, 1d} × grouping {key_model, key (model
''), model (api key '')}. A batch's usage is summed here per account, key, model and hour
(``rows``: one row per hour, not six), and the program that books it spreads each hour over its
six rows and adds them with one multi-row upsert, written in key order so concurrent batches
lock them in the same order (no deadlock): ``metering.usage.recording.rollup_upsert``.

The columns come from the table: a rollup row's primary key is the rollup key and its other
columns (the counters, and the newest event's id) are added up.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

from metering import programs as p
from metering.kit.timeutil import floor_day, floor_hour
from metering.models import UsageRollup, table
from metering.models.usage import ROLLUP_GROUPINGS, ROLLUP_WIDTHS
from metering.pricing import Charge, NormalizedUsage
from metering.usage.events import Event

ROLLUPS = table(UsageRollup)

ROLLUP_KEY = tuple(c.name for c in ROLLUPS.primary_key.columns)
LAST_EVENT = "last_event_id"
COUNTERS = tuple(
    c.name for c in ROLLUPS.columns if c.name not in ROLLUP_KEY and c.name != LAST_EVENT
)
GROUPINGS, WIDTHS = ROLLUP_GROUPINGS, ROLLUP_WIDTHS
# The usage of one account, key and model in one (UTC) hour: its hour and the day that hour is
# in, its counters and its newest event's id (``rows``).
HOURLY_IN = p.Records(
    "p_rollups",
    (
        ("account_id", ROLLUPS.c.account_id.type),
        ("api_key_id", ROLLUPS.c.api_key_id.type),
        ("model_id", ROLLUPS.c.model_id.type),
        ("hour", ROLLUPS.c.bucket_start.type),
        ("day", ROLLUPS.c.bucket_start.type),
        *((name, ROLLUPS.c[name].type) for name in (*COUNTERS, LAST_EVENT)),
    ),
)


class RollupKey(NamedTuple):
    """A rollup row's primary key."""

    account_id: str
    bucket_width: str
    grouping: str
    bucket_start: datetime
    api_key_id: str
    model_id: str


assert RollupKey._fields == ROLLUP_KEY
# The counters ``_count_event`` adds to: a column added to the table is counted there too.
assert COUNTERS == (
    "requests",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_microcents",
)


def _count_event(
    row: dict[str, Any], event_id: int, usage: NormalizedUsage, charge: Charge
) -> None:
    """Count one event (its new id, normalised usage and charge) in its hour's row, by the
    counters' names."""
    row["requests"] += 1
    row["input_tokens"] += usage.prompt_tokens  # cache reads included
    row["cache_read_tokens"] += usage.cached_tokens
    row["output_tokens"] += usage.output_tokens  # reasoning included
    row["reasoning_tokens"] += usage.reasoning_tokens
    row["cost_microcents"] += charge.total_microcents
    if event_id > row[LAST_EVENT]:
        row[LAST_EVENT] = event_id


_NOTHING_COUNTED = dict.fromkeys((*COUNTERS, LAST_EVENT), 0)


def rows(recorded: Iterable[tuple[int, Event]]) -> list[dict[str, Any]]:
    """The hourly rows (``HOURLY_IN``) to add for the recorded events (new id, event): their
    usage summed per account, key, model and hour (one step per event)."""
    hourly: dict[tuple[str, str, str, datetime], dict[str, Any]] = {}
    hours: dict[tuple[int, int, int, int], datetime] = {}  # a batch spans a few hours at most
    for event_id, e in recorded:
        usage, charge, at = e.usage, e.charge, e.occurred_at
        assert usage is not None and charge is not None and at is not None
        assert at.tzinfo is UTC  # as parsed: the hour is the UTC hour
        hour_of = (at.year, at.month, at.day, at.hour)
        hour = hours.get(hour_of)
        if hour is None:
            hour = hours[hour_of] = floor_hour(at)
        account, key, model = e.account_id or "", e.api_key_id or "", e.model_id or ""
        row = hourly.get((account, key, model, hour))
        if row is None:
            row = hourly[(account, key, model, hour)] = {
                "account_id": account,
                "api_key_id": key,
                "model_id": model,
                "hour": hour,
                "day": floor_day(hour),
                **_NOTHING_COUNTED,
            }
        _count_event(row, event_id, usage, charge)
    return list(hourly.values())


ENCODE = p.records_encoder(HOURLY_IN, p.POSTGRESQL)
ENCODE_SQLITE = p.records_encoder(HOURLY_IN, p.SQLITE)
