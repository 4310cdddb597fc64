"""Integer microcents and their exact decimal renderings (docs/api.md#conventions)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.kit.errors import InvalidRequest
from metering.kit.money import (
    ExactNumber,
    cents,
    is_whole_cents,
    parse_cents,
    round_half_up_div,
    scaled_text,
    usd,
    usd_text,
    whole_cents,
)

MAX_MICROCENTS = 9 * 10**18  # ±9×10^12 cents


def assert_plain_number(text: str) -> None:
    """Plain decimal notation: no exponent, no trailing zeros or point, no leading zeros."""
    assert "e" not in text.lower()
    unsigned = text.removeprefix("-")
    whole, _, frac = unsigned.partition(".")
    assert whole.isdigit() and whole.isascii()
    assert whole == "0" or not whole.startswith("0")
    if "." in unsigned:
        assert frac and frac.isdigit() and not frac.endswith("0")
    assert text != "-0"


class TestRenderings:
    @pytest.mark.parametrize(
        ("microcents", "usd_expected", "cents_expected"),
        [
            (87_460, "0.0008746", "0.08746"),  # the docs' chat example
            (123_456_789_012_345_678, "1234567890.12345678", "123456789012.345678"),
            (0, "0", "0"),
            (1, "0.00000001", "0.000001"),
            (10, "0.0000001", "0.00001"),
            (1_000_000, "0.01", "1"),
            (17_750_000, "0.1775", "17.75"),
            (100_000_000, "1", "100"),
            (350_000_000, "3.5", "350"),
            (341_800_000, "3.418", "341.8"),
            (-87_460, "-0.0008746", "-0.08746"),
            (-1, "-0.00000001", "-0.000001"),
            (-100_000_000, "-1", "-100"),
            (9 * 10**18, "90000000000", "9000000000000"),
            (2**63 - 1, "92233720368.54775807", "9223372036854.775807"),
        ],
    )
    def test_exact_plain_text(
        self, microcents: int, usd_expected: str, cents_expected: str
    ) -> None:
        assert usd(microcents) == usd_expected
        assert cents(microcents) == cents_expected
        assert usd_text(microcents) == usd_expected
        assert isinstance(usd(microcents), ExactNumber)
        assert isinstance(cents(microcents), ExactNumber)

    @pytest.mark.parametrize(
        ("value", "decimals", "expected"),
        [
            (123, 0, "123"),
            (-123, 0, "-123"),
            (0, 0, "0"),
            (5, 1, "0.5"),
            (120, 2, "1.2"),
            (100, 2, "1"),
            (-5, 3, "-0.005"),
            (10**30 + 1, 30, "1.000000000000000000000000000001"),
        ],
    )
    def test_scaled_text(self, value: int, decimals: int, expected: str) -> None:
        assert scaled_text(value, decimals) == expected

    @settings(max_examples=300, deadline=None)
    @given(value=st.integers(-(10**25), 10**25), decimals=st.integers(0, 18))
    def test_scaled_text_is_exact(self, value: int, decimals: int) -> None:
        text = scaled_text(value, decimals)
        assert_plain_number(text)
        assert Fraction(Decimal(text)) == Fraction(value, 10**decimals)

    @settings(max_examples=200, deadline=None)
    @given(microcents=st.integers(-(2**63), 2**63 - 1))
    def test_usd_and_cents_are_exact(self, microcents: int) -> None:
        assert Fraction(Decimal(usd(microcents))) == Fraction(microcents, 100_000_000)
        assert Fraction(Decimal(cents(microcents))) == Fraction(microcents, 1_000_000)
        assert_plain_number(usd(microcents))
        assert_plain_number(cents(microcents))


def half_up(numerator: int, denominator: int) -> int:
    return math.floor(Fraction(numerator, denominator) + Fraction(1, 2))


class TestRounding:
    @pytest.mark.parametrize(
        ("numerator", "denominator", "expected"),
        [
            (1, 2, 1),
            (3, 2, 2),
            (5, 2, 3),  # not banker's rounding
            (499_999, 1_000_000, 0),
            (500_000, 1_000_000, 1),
            (1_499_999, 1_000_000, 1),
            (7, 3, 2),
            (8, 3, 3),
            (0, 7, 0),
            (-1, 2, 0),  # halves go towards +infinity
            (-3, 2, -1),
            (-2, 3, -1),
            (10**40 + 5, 10, 10**39 + 1),
        ],
    )
    def test_round_half_up_div(self, numerator: int, denominator: int, expected: int) -> None:
        assert round_half_up_div(numerator, denominator) == expected

    @pytest.mark.parametrize("denominator", [0, -1, -2])
    def test_denominator_must_be_positive(self, denominator: int) -> None:
        with pytest.raises(ValueError):
            round_half_up_div(1, denominator)

    @settings(max_examples=300, deadline=None)
    @given(numerator=st.integers(-(10**30), 10**30), denominator=st.integers(1, 10**15))
    def test_round_half_up_div_matches_fractions(self, numerator: int, denominator: int) -> None:
        result = round_half_up_div(numerator, denominator)
        assert type(result) is int
        assert result == half_up(numerator, denominator)

    @pytest.mark.parametrize(
        ("rate", "expected"),
        [
            (17_750_000, 18),  # the docs' cache-read rate shows as 18 cents
            (950_000, 1),  # "$0.0095 per million … input_cents_per_million: 1"
            (500_000, 1),
            (499_999, 0),
            (1_500_000, 2),
            (2_500_000, 3),
            (22_000_000, 22),
            (339_000_000, 339),
            (0, 0),
        ],
    )
    def test_whole_cents(self, rate: int, expected: int) -> None:
        assert whole_cents(rate) == expected

    @pytest.mark.parametrize(
        ("rate", "expected"),
        [(22_000_000, True), (0, True), (17_750_000, False), (950_000, False), (1, False)],
    )
    def test_is_whole_cents(self, rate: int, expected: bool) -> None:
        assert is_whole_cents(rate) is expected


class TestParseCents:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (5, 5_000_000),
            (0, 0),
            (9 * 10**12, 9 * 10**18),
            (Decimal("0.000001"), 1),
            (Decimal("12.345678"), 12_345_678),
            (Decimal("1.5"), 1_500_000),
            (Decimal("0.0000010"), 1),  # 7 written decimals, but the value has 6
            (Decimal("1." + "0" * 60), 1_000_000),
            (Decimal("1E+2"), 100_000_000),
            (Decimal("2.5E-5"), 25),
            (Decimal("-0"), 0),
            (Decimal("9000000000000.000000"), 9 * 10**18),
            (Decimal("8999999999999.999999"), 9 * 10**18 - 1),
        ],
    )
    def test_accepted(self, value: object, expected: int) -> None:
        result = parse_cents(value, "amount_cents")
        assert result == expected
        assert type(result) is int

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(Decimal("0.0000001"), id="7-decimals"),
            pytest.param(Decimal("1.0000001"), id="7-decimals-above-1"),
            pytest.param(Decimal("1E-7"), id="exponent-7-decimals"),
            pytest.param(Decimal("1.00000000000000000000000000001"), id="29-decimals"),
            pytest.param(Decimal("1E-999999999"), id="tiny-exponent"),
            pytest.param(Decimal("NaN"), id="nan"),
            pytest.param(Decimal("sNaN"), id="snan"),
            pytest.param(Decimal("Infinity"), id="infinity"),
            pytest.param(Decimal("-Infinity"), id="-infinity"),
            pytest.param(9 * 10**12 + 1, id="above-max-int"),
            pytest.param(-(9 * 10**12) - 1, id="below-min-int"),
            pytest.param(Decimal("9000000000000.000001"), id="above-max-decimal"),
            pytest.param(Decimal("9000000000000.00000000000000000001"), id="above-max-long"),
            pytest.param(Decimal("1E+13"), id="above-max-exponent"),
            pytest.param(Decimal("1E+999999999"), id="huge-exponent"),
            pytest.param(Decimal("-1E+999999999"), id="huge-negative-exponent"),
            pytest.param(True, id="true"),
            pytest.param(False, id="false"),
            pytest.param("5", id="string"),
            pytest.param(5.0, id="float"),
            pytest.param(0.5, id="float-fraction"),
            pytest.param(None, id="null"),
            pytest.param([5], id="list"),
        ],
    )
    @pytest.mark.parametrize("allow_negative", [False, True])
    def test_refused_with_param(self, value: object, allow_negative: bool) -> None:
        with pytest.raises(InvalidRequest) as caught:
            parse_cents(value, "amount_cents", allow_negative=allow_negative)
        assert caught.value.param == "amount_cents"
        assert caught.value.status == 400
        assert caught.value.type == "invalid_request_error"

    @pytest.mark.parametrize("value", [-1, Decimal("-0.000001"), Decimal("-12.5")])
    def test_negative_refused_by_default(self, value: object) -> None:
        with pytest.raises(InvalidRequest) as caught:
            parse_cents(value, "monthly_spend_limit_cents")
        assert caught.value.param == "monthly_spend_limit_cents"

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (-1, -1_000_000),
            (Decimal("-0.000001"), -1),
            (Decimal("-12.5"), -12_500_000),
            (-(9 * 10**12), -(9 * 10**18)),
        ],
    )
    def test_negative_allowed_for_adjustments(self, value: object, expected: int) -> None:
        assert parse_cents(value, "amount_cents", allow_negative=True) == expected

    @settings(max_examples=300, deadline=None)
    @given(microcents=st.integers(-MAX_MICROCENTS, MAX_MICROCENTS))
    def test_round_trip_through_cents_text(self, microcents: int) -> None:
        text = cents(microcents)
        assert parse_cents(Decimal(text), "amount_cents", allow_negative=True) == microcents

    @settings(max_examples=200, deadline=None)
    @given(
        microcents=st.integers(-MAX_MICROCENTS, MAX_MICROCENTS - 1),
        extra=st.integers(1, 9),
        more_digits=st.integers(1, 40),
    )
    def test_a_seventh_decimal_is_always_refused(
        self, microcents: int, extra: int, more_digits: int
    ) -> None:
        # A valid amount plus a non-zero digit at the 7th decimal or beyond, built exactly.
        value = Decimal(f"{microcents * 10**more_digits + extra}E-{6 + more_digits}")
        with pytest.raises(InvalidRequest, match="decimals") as caught:
            parse_cents(value, "amount_cents", allow_negative=True)
        assert caught.value.param == "amount_cents"
