"""The fast row writer (``Encoder``) writes exactly what the general one (``rows_json``) writes,
row by row (a few rows) and column by column (a batch), and refuses what the general one must
never be given (a float or a bool as an integer, a naive time)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.kit.records import Encoder, Field, postgresql_time, rows_json, sqlite_time

FIELDS = (
    ("account_id", Field.TEXT),
    ("request_id", Field.VERBATIM),
    ("occurred_at", Field.TIME),
    ("prepaid", Field.BOOLEAN),
    ("total_microcents", Field.INTEGER),
    ("authorization_id", Field.TEXT),
)
NAMES = [name for name, _ in FIELDS]
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TIMES = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
).map(lambda at: at.astimezone(timezone(timedelta(hours=5, minutes=30))))
ROWS = st.fixed_dictionaries(
    {
        "account_id": st.sampled_from(["acct_1", "acct_«2»", 'a "quoted" \\ one', "\n\t\x00"]),
        "request_id": st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True),
        "occurred_at": TIMES,
        "prepaid": st.sampled_from([True, False, None]),
        "total_microcents": st.one_of(st.none(), INT64),
        "authorization_id": st.one_of(st.none(), st.text(max_size=8)),
    }
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(ROWS, max_size=20))
def test_the_encoder_writes_what_rows_json_writes(rows: list[dict[str, Any]]) -> None:
    for time_text in (postgresql_time, sqlite_time):
        written = Encoder(FIELDS, time_text)(rows)
        assert written == rows_json(NAMES, rows, time_text)
        assert len(json.loads(written)) == len(rows)


def test_a_batch_and_a_few_rows_give_the_same_text() -> None:
    """The same rows through both paths: each row's text alike, whatever the document's size."""
    at = datetime(2026, 11, 29, 13, 5, 7, 123, tzinfo=UTC)
    row = {
        "account_id": "acct_é",
        "request_id": "req_1",
        "occurred_at": at,
        "prepaid": True,
        "total_microcents": 2**62,
        "authorization_id": None,
    }
    encode = Encoder(FIELDS, postgresql_time)
    one = encode([row])
    many = encode([row] * 50)
    assert many == "[" + ",".join([one[1:-1]] * 50) + "]"
    assert json.loads(one) == [
        {
            "account_id": "acct_é",
            "request_id": "req_1",
            "occurred_at": "2026-11-29T13:05:07.000123+00:00",
            "prepaid": True,
            "total_microcents": 2**62,
            "authorization_id": None,
        }
    ]


@pytest.mark.parametrize("count", [1, 50])
@pytest.mark.parametrize("value", [1.0, True, "1"])
def test_an_integer_column_takes_ints_only(count: int, value: Any) -> None:
    row = {"account_id": "a", "request_id": "r", "occurred_at": datetime.now(UTC)}
    row |= {"prepaid": False, "total_microcents": value, "authorization_id": None}
    with pytest.raises(AssertionError):
        Encoder(FIELDS, postgresql_time)([row] * count)


@pytest.mark.parametrize("count", [1, 50])
@pytest.mark.parametrize("time_text", [postgresql_time, sqlite_time])
def test_a_naive_time_is_refused(count: int, time_text: Any) -> None:
    row = {"account_id": "a", "request_id": "r", "occurred_at": datetime(2026, 1, 1)}
    row |= {"prepaid": False, "total_microcents": 1, "authorization_id": None}
    with pytest.raises(ValueError, match="aware"):
        Encoder(FIELDS, time_text)([row] * count)
    with pytest.raises(ValueError, match="aware"):
        rows_json(NAMES, [row], time_text)


def test_one_column() -> None:
    rows = [{"id": 7}, {"id": None}]
    encode = Encoder([("id", Field.INTEGER)], sqlite_time)
    assert encode(rows) == '[{"id":7},{"id":null}]'
    assert encode(rows * 10) == "[" + ",".join(['{"id":7}', '{"id":null}'] * 10) + "]"
