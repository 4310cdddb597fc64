"""JSON rendering that writes money exactly and refuses floats."""

from __future__ import annotations

import enum
import json
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.kit.jsonenc import dumps
from metering.kit.money import ExactNumber, cents, usd


def loads_exact(raw: bytes) -> Any:
    return json.loads(raw, parse_float=Decimal)


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class TestMoney:
    def test_exact_numbers_are_written_unquoted(self) -> None:
        body = {"cost_usd": usd(87_460), "cost_microcents": 87_460}
        assert dumps(body) == b'{"cost_usd":0.0008746,"cost_microcents":87460}'

    def test_large_amount_keeps_every_digit(self) -> None:
        raw = dumps({"cost_usd": usd(123_456_789_012_345_678)})
        assert raw == b'{"cost_usd":1234567890.12345678}'
        assert loads_exact(raw)["cost_usd"] == Decimal("1234567890.12345678")
        # what a float would have made of it
        assert json.loads(raw)["cost_usd"] != Decimal("1234567890.12345678")

    def test_plain_string_that_looks_like_a_number_stays_a_string(self) -> None:
        assert dumps({"v": "0.0008746"}) == b'{"v":"0.0008746"}'

    @pytest.mark.parametrize(
        "value",
        [1.5, 0.0, float("nan"), float("inf"), {"a": 0.1}, [1, 2.0], (3.0,), {"a": [{"b": 1e-7}]}],
    )
    def test_floats_are_refused(self, value: Any) -> None:
        with pytest.raises(TypeError):
            dumps(value)

    @pytest.mark.parametrize("value", [Decimal("1.5"), Fraction(1, 2), {1, 2}, b"x", object()])
    def test_other_unknown_types_are_refused(self, value: Any) -> None:
        with pytest.raises(TypeError):
            dumps({"v": value})

    @settings(max_examples=200, deadline=None)
    @given(microcents=st.integers(-(2**63), 2**63 - 1))
    def test_money_round_trips_exactly(self, microcents: int) -> None:
        raw = dumps([usd(microcents), cents(microcents), microcents])
        dollars, cents_value, exact = loads_exact(raw)
        assert Fraction(dollars) == Fraction(microcents, 10**8)
        assert Fraction(cents_value) == Fraction(microcents, 10**6)
        assert exact == microcents
        assert b"e" not in raw.lower()  # plain notation, never an exponent


class TestValues:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (None, b"null"),
            (True, b"true"),
            (False, b"false"),
            (0, b"0"),
            (-42, b"-42"),
            (2**70, b"1180591620717411303424"),
            ("", b'""'),
            ([], b"[]"),
            ({}, b"{}"),
            ((1, "a"), b'[1,"a"]'),
            ({"a": [True, None, {"b": 1}]}, b'{"a":[true,null,{"b":1}]}'),
            (Color.RED, b'"red"'),
            (Level.HIGH, b"3"),
            (datetime(2026, 11, 29, 12, 0, 3, tzinfo=UTC), b'"2026-11-29T12:00:03Z"'),
            (
                datetime(2026, 11, 29, 13, 0, 3, 250_000, tzinfo=timezone(timedelta(hours=1))),
                b'"2026-11-29T12:00:03.25Z"',
            ),
            (date(2027, 1, 31), b'"2027-01-31"'),
        ],
    )
    def test_rendering(self, value: Any, expected: bytes) -> None:
        assert dumps(value) == expected

    def test_booleans_are_not_numbers(self) -> None:
        assert loads_exact(dumps({"a": True, "b": 1})) == {"a": True, "b": 1}
        assert dumps([True, 1]) == b"[true,1]"

    def test_key_order_is_kept(self) -> None:
        assert dumps({"b": 1, "a": 2}) == b'{"b":1,"a":2}'


class TestStrings:
    @pytest.mark.parametrize(
        "text",
        [
            'say "hi"',
            "back\\slash",
            "line\nbreak\ttab\rcr",
            "nul\x00byte\x1fus",
            "café ünïcödé",
            "emoji 😀",
            "separators \u2028\u2029",
            "</script>",
        ],
    )
    def test_strings_are_escaped_and_round_trip(self, text: str) -> None:
        raw = dumps({text: text})
        assert raw.isascii()
        assert b"\n" not in raw and b"\x00" not in raw
        assert json.loads(raw) == {text: text}

    def test_quote_in_a_key_cannot_break_out(self) -> None:
        raw = dumps({'a","b":"c': 1})
        assert json.loads(raw) == {'a","b":"c': 1}

    def test_exact_number_key_is_a_string(self) -> None:
        assert json.loads(dumps({ExactNumber("1.5"): 1})) == {"1.5": 1}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.text()
    | st.integers(-(10**20), 10**20).map(usd),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


def expected_value(value: Any) -> Any:
    """What an exact reader should see: ExactNumbers as Decimals (or ints), the rest unchanged."""
    if isinstance(value, ExactNumber):
        return Decimal(value) if "." in value else int(value)
    if isinstance(value, list):
        return [expected_value(item) for item in value]
    if isinstance(value, dict):
        return {key: expected_value(item) for key, item in value.items()}
    return value


class TestRoundTrip:
    @settings(max_examples=150, deadline=None)
    @given(value=json_values)
    def test_loads_with_decimal_recovers_exact_values(self, value: Any) -> None:
        raw = dumps(value)
        assert raw.isascii()
        assert loads_exact(raw) == expected_value(value)
