"""The report aggregates (``usage_rollups``), maintained in the ingest transaction.

Every recorded event adds to six rows: bucket width {1h, 1d} × grouping {key_model, key (model
'' ), model (api key '')}. A batch's additions are summed and encoded here first (``prepare``),
then written with one multi-row upsert, its rows sorted so concurrent batches lock them in the
same order (no deadlock).

Every concurrent batch of the same accounts adds to the same rows, so the upsert is the ingest
transaction's last statement (after the settlement locked the account rows; see
``metering.usage.service``): a row lock taken there is held only until the commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from metering.kit.timeutil import floor_day, floor_hour
from metering.models import UsageRollup, table
from metering.usage.events import Event
from metering.usage.sql import Upsert

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


def aggregate(recorded: Iterable[tuple[int, Event]]) -> dict[RollupKey, list[int]]:
    """Counters (COUNTERS order, then last_event_id) per rollup row of the recorded events (new
    id, event): summed per key, model and hour first (one step per event), then spread over the
    six row kinds."""
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
_UPSERT = Upsert(
    ROLLUPS,
    _COLUMNS,
    conflict=_COLUMNS[:6],
    update={**dict.fromkeys(COUNTERS, "add"), "last_event_id": "greatest"},
)


# A row of the upsert's JSON document (``_UPSERT.json``'s output, written by a template): the
# grouping, width and ISO timestamp need no escaping, the ids are JSON-encoded once each.
_ROW = (
    '{"account_id":%s,"bucket_width":"%s","grouping":"%s","bucket_start":"%s","api_key_id":%s,'
    '"model_id":%s,"requests":%d,"input_tokens":%d,"cache_read_tokens":%d,"output_tokens":%d,'
    '"reasoning_tokens":%d,"cost_microcents":%d,"last_event_id":%d}'
)


def _encode(rows: Sequence[Sequence[Any]]) -> str:
    quoted: dict[str, str] = {}
    parts = []
    for account, width, grouping, start, key, model, *values in rows:
        for text in (account, key, model):
            if text not in quoted:
                quoted[text] = json.dumps(text)
        parts.append(
            _ROW
            % (
                quoted[account],
                width,
                grouping,
                start.isoformat(),
                quoted[key],
                quoted[model],
                *values,
            )
        )
    return "[" + ",".join(parts) + "]"


def _rows(recorded: Iterable[tuple[int, Event]]) -> list[tuple[Any, ...]]:
    return [(*key, *values) for key, values in sorted(aggregate(recorded).items())]


def prepare(session: Session, recorded: Iterable[tuple[int, Event]]) -> Callable[[], object]:
    """The upsert adding the recorded events (new id, event) to their rollup rows, sorted by
    key, summed and encoded now; the returned call only sends it."""
    return _UPSERT.prepare(session, _rows(recorded), _encode)


def upsert_json(recorded: Iterable[tuple[int, Event]]) -> str:
    """The rows ``prepare`` would upsert, as the JSON document PostgreSQL takes (for a caller
    that sends them inside a server-side function)."""
    return _encode(_rows(recorded))
