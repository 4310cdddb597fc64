"""Timestamps: RFC 3339 with an offset in, UTC with Z out (docs/api.md#conventions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.kit.errors import InvalidRequest
from metering.kit.timeutil import format_timestamp, parse_timestamp


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


class TestParse:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("2026-11-29T12:00:03Z", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29t12:00:03z", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29 12:00:03Z", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29T13:00:03+01:00", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29T07:00:03-05:00", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29T17:45:03+05:45", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29T12:00:03+00:00", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29T12:00:03-00:00", utc(2026, 11, 29, 12, 0, 3)),
            ("2026-11-29T12:00:03+23:59", utc(2026, 11, 28, 12, 1, 3)),
            # the offset moves the instant across a day and a year boundary
            ("2026-12-31T23:30:00-01:00", utc(2027, 1, 1, 0, 30, 0)),
            ("2027-01-01T00:30:00+01:00", utc(2026, 12, 31, 23, 30, 0)),
            # fractions, truncated (never rounded) to microseconds
            ("2026-11-29T12:00:03.5Z", utc(2026, 11, 29, 12, 0, 3, 500_000)),
            ("2026-11-29T12:00:03.000001Z", utc(2026, 11, 29, 12, 0, 3, 1)),
            ("2026-11-29T12:00:03.123456789Z", utc(2026, 11, 29, 12, 0, 3, 123_456)),
            ("2026-11-29T12:00:03.9999999Z", utc(2026, 11, 29, 12, 0, 3, 999_999)),
            ("2026-11-29T12:00:03.0000009Z", utc(2026, 11, 29, 12, 0, 3)),
            ("2024-02-29T00:00:00Z", utc(2024, 2, 29)),
            ("0001-01-01T00:00:00Z", utc(1, 1, 1)),
            ("9999-12-31T23:59:59.999999Z", utc(9999, 12, 31, 23, 59, 59, 999_999)),
        ],
    )
    def test_accepted(self, text: str, expected: datetime) -> None:
        parsed = parse_timestamp(text, "occurred_at")
        assert parsed == expected
        assert parsed.utcoffset() == timedelta(0)
        assert parsed.tzinfo is UTC

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("2026-11-29T12:00:03", id="naive"),
            pytest.param("2026-11-29", id="date-only"),
            pytest.param("2026-11-29T12:00Z", id="no-seconds"),
            pytest.param("2026-11-29T12:00:03+0100", id="offset-without-colon"),
            pytest.param("2026-11-29T12:00:03+01", id="offset-hours-only"),
            pytest.param("2026-11-29T12:00:03.Z", id="empty-fraction"),
            pytest.param("2026-11-29T12:00:03.1234567890Z", id="ten-digit-fraction"),
            pytest.param("99999-01-01T00:00:00Z", id="year-99999"),
            pytest.param("0000-01-01T00:00:00Z", id="year-0000"),
            pytest.param("2026-13-01T00:00:00Z", id="month-13"),
            pytest.param("2026-00-10T00:00:00Z", id="month-0"),
            pytest.param("2026-02-30T00:00:00Z", id="february-30"),
            pytest.param("2025-02-29T00:00:00Z", id="not-a-leap-year"),
            pytest.param("2026-11-29T24:00:00Z", id="hour-24"),
            pytest.param("2026-11-29T12:60:00Z", id="minute-60"),
            pytest.param("2026-11-29T12:00:60Z", id="leap-second"),
            pytest.param("2026-11-29T12:00:03+24:00", id="offset-hours-24"),
            pytest.param("2026-11-29T12:00:03+05:60", id="offset-minutes-60"),
            pytest.param("9999-12-31T23:30:00-01:00", id="overflow-after-year-9999"),
            pytest.param("0001-01-01T00:30:00+01:00", id="overflow-before-year-1"),
            pytest.param("2026-11-29T12:00:03Z\n", id="trailing-newline"),
            pytest.param(" 2026-11-29T12:00:03Z", id="leading-space"),
            pytest.param("2026-11-29T12:00:03Z ", id="trailing-space"),
            pytest.param("2026-11-29T12:00:03ZZ", id="double-z"),
            pytest.param("٢٠٢٦-11-29T12:00:03Z", id="non-ascii-digits"),
            pytest.param("2026-11-29T12:00:03UTC", id="named-zone"),
            pytest.param("1790793243", id="unix-seconds-text"),
            pytest.param("", id="empty"),
        ],
    )
    def test_refused(self, text: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            parse_timestamp(text, "occurred_at")
        assert caught.value.code == "invalid_timestamp"
        assert caught.value.param == "occurred_at"
        assert caught.value.status == 400

    @pytest.mark.parametrize(
        "value", [None, 1790793243, 1790793243.5, utc(2026, 11, 29), b"2026-11-29T12:00:03Z"]
    )
    def test_non_strings_are_refused(self, value: object) -> None:
        with pytest.raises(InvalidRequest) as caught:
            parse_timestamp(value, "starting_at")
        assert (caught.value.code, caught.value.param) == ("invalid_timestamp", "starting_at")


class TestAllowDate:
    def test_date_is_midnight_utc(self) -> None:
        assert parse_timestamp("2026-09-01", "starting_at", allow_date=True) == utc(2026, 9, 1)

    def test_timestamps_are_still_accepted(self) -> None:
        parsed = parse_timestamp("2026-09-01T02:00:00+02:00", "starting_at", allow_date=True)
        assert parsed == utc(2026, 9, 1)

    @pytest.mark.parametrize(
        "text",
        [
            "2026-02-30",
            "2026-13-01",
            "0000-01-01",
            "20260901",
            "2026-9-1",
            "2026-09-01\n",
            "٢٠٢٦-09-01",
            "2026-09-01T00:00:00",
        ],
    )
    def test_bad_dates_are_refused(self, text: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            parse_timestamp(text, "starting_at", allow_date=True)
        assert (caught.value.code, caught.value.param) == ("invalid_timestamp", "starting_at")


class TestFormat:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (utc(2026, 11, 29, 12, 0, 3), "2026-11-29T12:00:03Z"),
            (utc(2026, 11, 29, 12, 0, 3, 500_000), "2026-11-29T12:00:03.5Z"),
            (utc(2026, 11, 29, 12, 0, 3, 123_456), "2026-11-29T12:00:03.123456Z"),
            (utc(2026, 11, 29, 12, 0, 3, 1), "2026-11-29T12:00:03.000001Z"),
            (
                datetime(2026, 11, 29, 7, 0, 3, tzinfo=timezone(timedelta(hours=-5))),
                "2026-11-29T12:00:03Z",
            ),
            (
                datetime(2027, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
                "2026-12-31T23:30:00Z",
            ),
            (utc(5, 1, 1), "0005-01-01T00:00:00Z"),
            (utc(999, 12, 31, 23, 59, 59), "0999-12-31T23:59:59Z"),
            (utc(9999, 12, 31, 23, 59, 59, 999_999), "9999-12-31T23:59:59.999999Z"),
        ],
    )
    def test_utc_with_z(self, value: datetime, expected: str) -> None:
        assert format_timestamp(value) == expected

    def test_naive_is_refused(self) -> None:
        with pytest.raises(ValueError):
            format_timestamp(datetime(2026, 11, 29, 12, 0, 3))


offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)


class TestRoundTrip:
    @settings(max_examples=200, deadline=None)
    @given(instant=st.datetimes(timezones=st.just(UTC)))
    def test_format_then_parse(self, instant: datetime) -> None:
        text = format_timestamp(instant)
        assert text.endswith("Z")
        assert parse_timestamp(text, "t") == instant

    @settings(max_examples=200, deadline=None)
    @given(
        instant=st.datetimes(
            min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
        ),
        offset=offsets,
    )
    def test_any_offset_names_the_same_instant(self, instant: datetime, offset: timezone) -> None:
        local = instant.astimezone(offset)
        sign = "-" if local.utcoffset() < timedelta(0) else "+"  # type: ignore[operator]
        minutes = abs(int(local.utcoffset().total_seconds())) // 60  # type: ignore[union-attr]
        text = (
            f"{local.year:04d}-{local.month:02d}-{local.day:02d}T{local.hour:02d}:"
            f"{local.minute:02d}:{local.second:02d}.{local.microsecond:06d}"
            f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
        )
        assert parse_timestamp(text, "t") == instant
