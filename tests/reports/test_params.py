"""The report's parameters and window rules (docs/api.md#get-v1usage), without a database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.kit.errors import InvalidRequest
from metering.reports.params import ReportQuery, check_parameter_names, parse_report_query

NOW = datetime(2026, 11, 29, 12, 30, 5, tzinfo=UTC)


def parse(now: datetime = NOW, **given: Any) -> ReportQuery:
    values: dict[str, Any] = {
        "starting_at": None,
        "ending_at": None,
        "bucket_width": None,
        "group_by": None,
        "models": (),
        "api_key_ids": (),
        "output_format": None,
    }
    values.update(given)
    return parse_report_query(now=now, **values)


def refused(code: str, param: str, **given: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(**given)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, param)
    return caught.value


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


class TestDefaults:
    def test_only_starting_at(self) -> None:
        query = parse(starting_at="2026-11-01")
        assert query == ReportQuery(
            starting_at=utc(2026, 11, 1),
            ending_at=utc(2026, 11, 30),  # the end of the day containing now
            bucket_width="1d",
            group_by="model",
            models=None,
            api_key_ids=None,
            output_format="json",
        )
        assert query.bucket_count == 29

    def test_default_end_hourly_is_the_end_of_the_current_hour(self) -> None:
        query = parse(starting_at="2026-11-29T00:00:00Z", bucket_width="1h")
        assert query.ending_at == utc(2026, 11, 29, 13)
        assert query.bucket_count == 13

    @pytest.mark.parametrize(
        ("now", "width", "end"),
        [
            # now exactly on a boundary is inside the bucket that starts there
            (utc(2026, 11, 29, 12), "1h", utc(2026, 11, 29, 13)),
            (utc(2026, 11, 29), "1d", utc(2026, 11, 30)),
            (
                utc(2026, 11, 29, 23, 59, 59) + timedelta(microseconds=999_999),
                "1d",
                utc(2026, 11, 30),
            ),
            (utc(2026, 12, 31, 23, 0, 1), "1d", utc(2027, 1, 1)),
        ],
    )
    def test_default_end_follows_the_clock(self, now: datetime, width: str, end: datetime) -> None:
        query = parse(now=now, starting_at="2026-11-29", bucket_width=width)
        assert query.ending_at == end

    def test_date_is_midnight_utc(self) -> None:
        query = parse(starting_at="2026-09-01", ending_at="2026-10-01")
        assert (query.starting_at, query.ending_at, query.bucket_count) == (
            utc(2026, 9, 1),
            utc(2026, 10, 1),
            30,
        )

    def test_filters_and_choices(self) -> None:
        query = parse(
            starting_at="2026-11-29T00:00:00Z",
            bucket_width="1h",
            group_by="api_key",
            models=["GLM-5.3", "glm-5.3", "DeepSeek-V4.1"],
            api_key_ids=["key_a", "key_a", "key_B"],
            output_format="csv",
        )
        assert query.group_by == "api_key" and query.output_format == "csv"
        assert query.models == {"glm-5.3", "deepseek-v4.1"}  # case-insensitive on input
        assert query.api_key_ids == {"key_a", "key_B"}  # key ids are exact


class TestAlignment:
    @pytest.mark.parametrize(
        ("starting_at", "width", "expected"),
        [
            # +01:00 lands on midnight UTC: aligned for days
            ("2026-11-29T01:00:00+01:00", "1d", utc(2026, 11, 29)),
            ("2026-11-28T19:00:00-05:00", "1d", utc(2026, 11, 29)),
            ("2026-11-29T05:30:00+05:30", "1d", utc(2026, 11, 29)),
            ("2026-11-29T00:00:00.000000000Z", "1d", utc(2026, 11, 29)),
            ("2026-11-29t00:00:00z", "1d", utc(2026, 11, 29)),
            ("2026-11-29T06:00:00+05:00", "1h", utc(2026, 11, 29, 1)),
            ("1969-12-31T23:00:00Z", "1h", utc(1969, 12, 31, 23)),
        ],
    )
    def test_aligned_bounds(self, starting_at: str, width: str, expected: datetime) -> None:
        query = parse(
            starting_at=starting_at,
            ending_at=(expected + timedelta(days=1)).isoformat(),
            bucket_width=width,
        )
        assert query.starting_at == expected

    @pytest.mark.parametrize(
        ("value", "width"),
        [
            ("2026-11-29T00:00:00+01:00", "1d"),  # 23:00 UTC the day before
            ("2026-11-29T01:00:00Z", "1d"),
            ("2026-11-29T00:30:00Z", "1h"),
            ("2026-11-29T00:00:01Z", "1h"),
            ("2026-11-29T00:00:00.000001Z", "1h"),
            ("2026-11-29T00:00:00.0000001Z", "1h"),  # below the microsecond, still not aligned
            ("2026-11-29T05:00:00+05:30", "1h"),
        ],
    )
    def test_unaligned_starting_at(self, value: str, width: str) -> None:
        refused(
            "unaligned_timestamp",
            "starting_at",
            starting_at=value,
            ending_at="2026-12-01",
            bucket_width=width,
        )

    @pytest.mark.parametrize(
        ("value", "width"),
        [("2026-11-30T12:00:00Z", "1d"), ("2026-11-29T10:15:00Z", "1h")],
    )
    def test_unaligned_ending_at(self, value: str, width: str) -> None:
        refused(
            "unaligned_timestamp",
            "ending_at",
            starting_at="2026-11-29",
            ending_at=value,
            bucket_width=width,
        )

    def test_hour_boundary_is_not_a_day_boundary(self) -> None:
        # the same value is fine hourly
        assert parse(starting_at="2026-11-29T05:00:00Z", bucket_width="1h").bucket_count == 8
        refused("unaligned_timestamp", "starting_at", starting_at="2026-11-29T05:00:00Z")


class TestWindow:
    @pytest.mark.parametrize("ending_at", ["2026-11-29", "2026-11-28", "2026-11-28T23:00:00-01:00"])
    def test_ending_at_not_after_starting_at(self, ending_at: str) -> None:
        refused("invalid_window", "ending_at", starting_at="2026-11-29", ending_at=ending_at)

    def test_starting_at_after_the_default_end(self) -> None:
        refused("invalid_window", "starting_at", starting_at="2026-11-30")
        refused(
            "invalid_window", "starting_at", starting_at="2026-11-29T13:00:00Z", bucket_width="1h"
        )

    def test_93_daily_buckets_is_the_limit(self) -> None:
        start = utc(2026, 1, 1)
        ok = parse(starting_at="2026-01-01", ending_at=(start + timedelta(days=93)).isoformat())
        assert ok.bucket_count == 93 and len(ok.bucket_starts()) == 93
        error = refused(
            "too_many_buckets",
            "ending_at",
            starting_at="2026-01-01",
            ending_at=(start + timedelta(days=94)).isoformat(),
        )
        assert "93" in error.message

    def test_168_hourly_buckets_is_the_limit(self) -> None:
        ok = parse(starting_at="2026-11-01", ending_at="2026-11-08", bucket_width="1h")
        assert ok.bucket_count == 168
        refused(
            "too_many_buckets",
            "ending_at",
            starting_at="2026-11-01",
            ending_at="2026-11-08T01:00:00Z",
            bucket_width="1h",
        )

    def test_the_limit_applies_to_the_default_end(self) -> None:
        # now is 2026-11-29T12:30: the default daily end is 2026-11-30, hourly 13:00
        assert parse(starting_at="2026-08-29").bucket_count == 93
        refused("too_many_buckets", "starting_at", starting_at="2026-08-28")
        assert parse(starting_at="2026-11-22T13:00:00Z", bucket_width="1h").bucket_count == 168
        refused(
            "too_many_buckets", "starting_at", starting_at="2026-11-22T12:00:00Z", bucket_width="1h"
        )

    def test_far_bounds_do_not_crash(self) -> None:
        refused("too_many_buckets", "ending_at", starting_at="0001-01-01", ending_at="9999-12-31")
        query = parse(starting_at="9999-12-30", ending_at="9999-12-31")
        assert query.bucket_starts() == [utc(9999, 12, 30)]
        refused("invalid_timestamp", "starting_at", starting_at="0001-01-01T00:00:00+01:00")


class TestBadValues:
    def test_starting_at_is_required(self) -> None:
        refused("missing_parameter", "starting_at", ending_at="2026-11-29")

    @pytest.mark.parametrize(
        "value",
        [
            "",
            "yesterday",
            "2026-13-01",
            "2026-02-30",
            "2026-11-29T12:00:00",  # no offset
            "2026-11-29T24:00:00Z",
            "2026-11-29 ",
            "1790793243",
            "2026-W48",
            "2026-11-29T00:00:00+24:00",
            "２０２６-11-29",
        ],
    )
    @pytest.mark.parametrize("param", ["starting_at", "ending_at"])
    def test_timestamps(self, param: str, value: str) -> None:
        given = {"starting_at": "2026-11-01", param: value}
        refused("invalid_timestamp", param, **given)

    @pytest.mark.parametrize(
        ("param", "value"),
        [
            ("bucket_width", "1w"),
            ("bucket_width", "1D"),
            ("bucket_width", "day"),
            ("bucket_width", ""),
            ("bucket_width", "60m"),
            ("group_by", "key"),
            ("group_by", "api_key_id"),
            ("group_by", "Model"),
            ("group_by", ""),
            ("output_format", "xml"),
            ("output_format", "CSV"),
            ("output_format", ""),
        ],
    )
    def test_choices(self, param: str, value: str) -> None:
        error = refused(
            "unsupported_value",
            "format" if param == "output_format" else param,
            starting_at="2026-11-01",
            **{param: value},
        )
        assert repr(value) in error.message

    def test_values_are_checked_before_the_window(self) -> None:
        # an unaligned, too-long window with a bad bucket_width: the value is reported first
        refused(
            "unsupported_value",
            "bucket_width",
            starting_at="2026-01-01T00:30:00Z",
            ending_at="2027-01-01",
            bucket_width="1w",
        )


class TestParameterNames:
    def test_known_and_repeatable(self) -> None:
        check_parameter_names(["starting_at", "models", "models", "api_key_ids", "api_key_ids"])

    @pytest.mark.parametrize("name", ["api_key_id", "model", "models[]", "limit", "STARTING_AT"])
    def test_unknown(self, name: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            check_parameter_names(["starting_at", name])
        assert (caught.value.code, caught.value.param) == ("invalid_parameter", name)

    @pytest.mark.parametrize(
        "name", ["starting_at", "ending_at", "bucket_width", "group_by", "format"]
    )
    def test_single_valued_given_twice(self, name: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            check_parameter_names([name, "models", name])
        assert (caught.value.code, caught.value.param) == ("invalid_parameter", name)


WIDTHS = {"1h": (timedelta(hours=1), 168), "1d": (timedelta(days=1), 93)}


@given(
    width=st.sampled_from(sorted(WIDTHS)),
    start_index=st.integers(min_value=-200_000, max_value=200_000),
    data=st.data(),
)
def test_buckets_tile_the_window(width: str, start_index: int, data: st.DataObject) -> None:
    step, limit = WIDTHS[width]
    count = data.draw(st.integers(min_value=1, max_value=limit))
    start = datetime(1970, 1, 1, tzinfo=UTC) + start_index * step
    query = parse(
        now=start,
        starting_at=start.isoformat(),
        ending_at=(start + count * step).isoformat(),
        bucket_width=width,
    )
    starts = query.bucket_starts()
    assert len(starts) == count == query.bucket_count
    assert starts[0] == start and starts[-1] + step == query.ending_at
    assert all(b - a == step for a, b in itertools.pairwise(starts))
