"""The report's query parameters (docs/api.md#get-v1usage) checked into one immutable query.

Pure: "now" is passed in (the default ``ending_at`` depends on it), nothing else is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from metering.kit.errors import InvalidRequest
from metering.kit.timeutil import format_timestamp, parse_timestamp

BUCKET_WIDTHS = {"1d": timedelta(days=1), "1h": timedelta(hours=1)}
MAX_BUCKETS = {"1d": 93, "1h": 168}
GROUP_BYS = ("model", "api_key", "project", "member")
FORMATS = ("json", "csv")
REPEATABLE = frozenset({"models", "api_key_ids", "project_ids", "member_ids"})
KNOWN_PARAMETERS = frozenset(
    {"starting_at", "ending_at", "bucket_width", "group_by", "format"} | REPEATABLE
)
# Buckets are aligned to the Unix epoch in UTC: whole hours, whole UTC days.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FRACTION = re.compile(r"\.(\d+)")


@dataclass(frozen=True, slots=True)
class ReportQuery:
    starting_at: datetime  # aware UTC, aligned to the bucket width
    ending_at: datetime  # exclusive, aligned, after starting_at
    bucket_width: str  # "1d" | "1h"
    group_by: str  # "model" | "api_key" | "project" | "member"
    models: frozenset[str] | None  # lower-cased filter values; None: no filter
    api_key_ids: frozenset[str] | None  # exact filter values; None: no filter
    output_format: str  # "json" | "csv"
    project_ids: frozenset[str] | None = None  # exact filter values; None: no filter
    member_ids: frozenset[str] | None = None  # exact filter values; None: no filter

    @property
    def width(self) -> timedelta:
        return BUCKET_WIDTHS[self.bucket_width]

    @property
    def bucket_count(self) -> int:
        return (self.ending_at - self.starting_at) // self.width

    def bucket_index(self, at: datetime) -> int:
        """The position in the window of the bucket starting at ``at``."""
        return (at - self.starting_at) // self.width

    def bucket_starts(self) -> list[datetime]:
        width = self.width
        return [self.starting_at + index * width for index in range(self.bucket_count)]


def check_parameter_names(names: Iterable[str]) -> None:
    """Unknown parameters and repeats of single-valued ones are refused rather than ignored: a
    mistyped filter (``api_key_id=``) would otherwise return the whole account's usage."""
    seen: set[str] = set()
    for name in names:
        if name not in KNOWN_PARAMETERS:
            known = ", ".join(sorted(KNOWN_PARAMETERS))
            raise InvalidRequest(
                f"unknown parameter {name!r}; the parameters are {known}", param=name
            )
        if name in seen and name not in REPEATABLE:
            raise InvalidRequest(f"{name} may be given only once", param=name)
        seen.add(name)


def _choice(value: str | None, param: str, allowed: Sequence[str], default: str) -> str:
    if value is None:
        return default
    if value not in allowed:
        options = " or ".join(repr(a) for a in allowed)
        raise InvalidRequest(
            f"{param} must be {options}, not {value!r}", code="unsupported_value", param=param
        )
    return value


def _is_aligned(text: str, at: datetime, width: timedelta) -> bool:
    # parse_timestamp keeps microseconds; a non-zero digit beyond them is still off the boundary.
    fraction = _FRACTION.search(text)
    if fraction and fraction.group(1)[6:].strip("0"):
        return False
    return (at - _EPOCH) % width == timedelta(0)


def _require_aligned(text: str, at: datetime, param: str, bucket_width: str) -> None:
    if not _is_aligned(text, at, BUCKET_WIDTHS[bucket_width]):
        boundary = "a UTC midnight" if bucket_width == "1d" else "a whole UTC hour"
        raise InvalidRequest(
            f"{param} ({format_timestamp(at)}) must fall on {boundary} for bucket_width="
            f"{bucket_width}",
            code="unaligned_timestamp",
            param=param,
        )


def floor_to_bucket(at: datetime, bucket_width: str) -> datetime:
    width = BUCKET_WIDTHS[bucket_width]
    return at - (at - _EPOCH) % width


def parse_report_query(
    *,
    starting_at: str | None,
    ending_at: str | None,
    bucket_width: str | None,
    group_by: str | None,
    models: Sequence[str],
    api_key_ids: Sequence[str],
    output_format: str | None,
    now: datetime,
    project_ids: Sequence[str] = (),
    member_ids: Sequence[str] = (),
) -> ReportQuery:
    """The checked query, or the first problem as a 400 naming its parameter: values one by one
    (missing, malformed, unsupported), then the window (alignment, order, size)."""
    if starting_at is None:
        raise InvalidRequest(
            "starting_at is required (an RFC 3339 timestamp or a YYYY-MM-DD date)",
            code="missing_parameter",
            param="starting_at",
        )
    start = parse_timestamp(starting_at, "starting_at", allow_date=True)
    end = None if ending_at is None else parse_timestamp(ending_at, "ending_at", allow_date=True)
    width = _choice(bucket_width, "bucket_width", tuple(BUCKET_WIDTHS), "1d")
    grouping = _choice(group_by, "group_by", GROUP_BYS, "model")
    fmt = _choice(output_format, "format", FORMATS, "json")

    _require_aligned(starting_at, start, "starting_at", width)
    if ending_at is not None and end is not None:
        _require_aligned(ending_at, end, "ending_at", width)
        window_param = "ending_at"
    else:
        # The end of the bucket containing now: the current bucket is always included.
        end = floor_to_bucket(now, width) + BUCKET_WIDTHS[width]
        window_param = "starting_at"
    if end <= start:
        raise InvalidRequest(
            f"ending_at ({format_timestamp(end)}) must be after starting_at "
            f"({format_timestamp(start)})",
            code="invalid_window",
            param=window_param,
        )
    count = (end - start) // BUCKET_WIDTHS[width]
    if count > MAX_BUCKETS[width]:
        raise InvalidRequest(
            f"the window from {format_timestamp(start)} to {format_timestamp(end)} has {count} "
            f"buckets of {width}; at most {MAX_BUCKETS[width]} are allowed",
            code="too_many_buckets",
            param=window_param,
        )
    return ReportQuery(
        starting_at=start,
        ending_at=end,
        bucket_width=width,
        group_by=grouping,
        models=frozenset(m.lower() for m in models) if models else None,
        api_key_ids=frozenset(api_key_ids) if api_key_ids else None,
        output_format=fmt,
        project_ids=frozenset(project_ids) if project_ids else None,
        member_ids=frozenset(member_ids) if member_ids else None,
    )
