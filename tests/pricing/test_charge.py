"""Pricing one request: three components, each rounded half up to a microcent
(docs/api.md#post-v1usageevents)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from metering.pricing import (
    MAX_TOKEN_COUNT,
    Charge,
    NormalizedUsage,
    Rates,
    component_microcents,
    normalize_usage,
    price_usage,
)

# The GLM-5.3 card of the docs: 22 and 339 cents per million, cache reads at 17.75 cents.
GLM = Rates(
    input_microcents_per_million=22_000_000,
    output_microcents_per_million=339_000_000,
    cache_read_microcents_per_million=17_750_000,
)
# "$0.0095 per million input tokens is input_microcents_per_million: 950000".
QWEN_LIKE = Rates(
    input_microcents_per_million=950_000,
    output_microcents_per_million=3_800_000,
    cache_read_microcents_per_million=95_000,
)

MAX_RATE = 10**12  # $10,000 per million tokens: far above any real price


def half_up(value: Fraction) -> int:
    """The oracle: nearest integer, halves towards +infinity, computed on exact fractions."""
    return math.floor(value + Fraction(1, 2))


def oracle(tokens: int, rate: int) -> int:
    return half_up(Fraction(tokens * rate, 10**6))


class TestDocsExample:
    def test_glm_chat_example(self) -> None:
        usage = NormalizedUsage(
            prompt_tokens=4508, cached_tokens=4352, output_tokens=20, reasoning_tokens=16
        )
        charge = price_usage(usage, GLM)
        assert charge == Charge(
            uncached_input_tokens=156,
            cache_read_tokens=4352,
            output_tokens=20,
            reasoning_tokens=16,
            input_microcents=3_432,  # 156 × 22
            cache_read_microcents=77_248,  # 4352 × 17.75
            output_microcents=6_780,  # 20 × 339, reasoning included
        )
        assert charge.total_microcents == 87_460  # $0.0008746

    def test_glm_chat_example_from_the_raw_usage_object(self) -> None:
        raw = {
            "prompt_tokens": 4508,
            "completion_tokens": 20,
            "total_tokens": 4528,
            "prompt_tokens_details": {"cached_tokens": 4352},
            "completion_tokens_details": {"reasoning_tokens": 16},
        }
        assert price_usage(normalize_usage("chat_completions", raw), GLM).total_microcents == 87_460

    def test_glm_messages_example_subtracts_cache_reads_from_input(self) -> None:
        raw = {
            "input_tokens": 338,
            "output_tokens": 29,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 256,
        }
        charge = price_usage(normalize_usage("messages", raw), GLM)
        assert charge.uncached_input_tokens == 82
        assert charge.input_microcents == 1_804  # 82 × 22
        assert charge.cache_read_microcents == 4_544  # 256 × 17.75
        assert charge.output_microcents == 9_831  # 29 × 339
        assert charge.total_microcents == 16_179

    def test_glm_responses_example(self) -> None:
        raw = {"input_tokens": 336, "output_tokens": 17, "total_tokens": 353}
        charge = price_usage(normalize_usage("responses", raw), GLM)
        assert (charge.input_microcents, charge.cache_read_microcents) == (7_392, 0)
        assert charge.output_microcents == 5_763
        assert charge.total_microcents == 13_155

    def test_cache_read_rate_is_not_the_rounded_card_value(self) -> None:
        # 17,750,000 µ¢/M shows as 18 cents on the card; billing uses the exact rate.
        one_million_cached = NormalizedUsage(1_000_000, 1_000_000, 0, 0)
        assert price_usage(one_million_cached, GLM).cache_read_microcents == 17_750_000


class TestTable:
    @pytest.mark.parametrize(
        ("tokens", "rate", "expected"),
        [
            # exact halves go up
            (1, 500_000, 1),  # 0.5
            (3, 500_000, 2),  # 1.5
            (5, 100_000, 1),  # 0.5
            (1, 1_500_000, 2),  # 1.5
            (1, 2_500_000, 3),  # 2.5 (not banker's rounding to 2)
            # just below and just above a half
            (1, 499_999, 0),
            (1, 500_001, 1),
            (1, 1_499_999, 1),
            (2, 749_999, 1),  # 1.499998
            (2, 750_000, 2),  # 1.5
            # Qwen-like $0.0095 per million input tokens
            (1, 950_000, 1),  # 0.95
            (3, 950_000, 3),  # 2.85
            (10, 950_000, 10),  # 9.5
            (1_000_000, 950_000, 950_000),
            (1_234_567, 950_000, 1_172_839),  # 1,172,838.65
            # GLM rates
            (156, 22_000_000, 3_432),
            (4352, 17_750_000, 77_248),
            (1, 17_750_000, 18),  # 17.75
            (2, 17_750_000, 36),  # 35.5
            (20, 339_000_000, 6_780),
            # zero tokens or a zero rate cost nothing
            (0, 339_000_000, 0),
            (0, 0, 0),
            (1_000_000, 0, 0),
            # huge counts stay exact
            (MAX_TOKEN_COUNT, 339_000_000, 727_996_956_333),  # 2,147,483,647 × 339
            (MAX_TOKEN_COUNT, 17_750_000, 38_117_834_734),  # × 17.75 = …734.25
            (MAX_TOKEN_COUNT, MAX_RATE, 2_147_483_647_000_000),
        ],
    )
    def test_component(self, tokens: int, rate: int, expected: int) -> None:
        result = component_microcents(tokens, rate)
        assert result == expected
        assert type(result) is int

    @pytest.mark.parametrize(
        ("usage", "rates", "expected"),
        [
            # one token of each kind at rates of half a microcent per token
            (NormalizedUsage(2, 1, 1, 0), Rates(500_000, 500_000, 500_000), (1, 1, 1)),
            # three tokens of each at 0.5 µ¢: 1.5 → 2, three times (no rounding of the sum)
            (NormalizedUsage(6, 3, 3, 3), Rates(500_000, 500_000, 500_000), (2, 2, 2)),
            (NormalizedUsage(2, 1, 1, 1), Rates(499_999, 499_999, 499_999), (0, 0, 0)),
            (NormalizedUsage(0, 0, 0, 0), GLM, (0, 0, 0)),
            (NormalizedUsage(1, 0, 1, 1), QWEN_LIKE, (1, 0, 4)),  # 0.95 → 1, 3.8 → 4
            (NormalizedUsage(10, 10, 0, 0), QWEN_LIKE, (0, 1, 0)),  # 10 × 0.095 = 0.95 → 1
        ],
    )
    def test_each_component_rounds_on_its_own(
        self, usage: NormalizedUsage, rates: Rates, expected: tuple[int, int, int]
    ) -> None:
        charge = price_usage(usage, rates)
        components = (
            charge.input_microcents,
            charge.cache_read_microcents,
            charge.output_microcents,
        )
        assert components == expected
        assert charge.total_microcents == sum(expected)

    def test_rounding_is_per_component_not_of_the_sum(self) -> None:
        # 0.5 + 0.5 + 0.5 µ¢: each half rounds up, so 3 µ¢, not round(1.5) = 2.
        charge = price_usage(NormalizedUsage(2, 1, 1, 0), Rates(500_000, 500_000, 500_000))
        assert charge.total_microcents == 3

    def test_reasoning_tokens_are_billed_as_output_once(self) -> None:
        # reasoning is a subset of output: 20 output tokens (16 reasoning) cost 20 × 339.
        with_reasoning = price_usage(NormalizedUsage(0, 0, 20, 16), GLM)
        without = price_usage(NormalizedUsage(0, 0, 20, 0), GLM)
        assert with_reasoning.output_microcents == without.output_microcents == 6_780
        assert with_reasoning.reasoning_tokens == 16

    def test_huge_values_are_exact_where_float_is_not(self) -> None:
        tokens, rate = MAX_TOKEN_COUNT, 999_999_999_999
        # exactly 2,147,483,646,997,852.516353 µ¢
        expected = 2_147_483_646_997_853
        assert expected == oracle(tokens, rate)
        assert round(tokens * rate / 1e6) != expected  # the case a float computation gets wrong
        result = component_microcents(tokens, rate)
        assert result == expected
        assert type(result) is int

    def test_charge_is_frozen(self) -> None:
        charge = price_usage(NormalizedUsage(1, 0, 1, 0), GLM)
        with pytest.raises(AttributeError):
            charge.input_microcents = 0  # type: ignore[misc]


tokens_st = st.integers(0, MAX_TOKEN_COUNT)
rate_st = st.integers(0, MAX_RATE)
rates_st = st.builds(Rates, rate_st, rate_st, rate_st)


@st.composite
def usages(draw: st.DrawFn) -> NormalizedUsage:
    prompt = draw(tokens_st)
    output = draw(tokens_st)
    return NormalizedUsage(
        prompt, draw(st.integers(0, prompt)), output, draw(st.integers(0, output))
    )


class TestProperties:
    @settings(max_examples=200, deadline=None)
    @given(usage=usages(), rates=rates_st)
    def test_total_is_the_sum_of_the_components(self, usage: NormalizedUsage, rates: Rates) -> None:
        charge = price_usage(usage, rates)
        assert charge.total_microcents == (
            charge.input_microcents + charge.cache_read_microcents + charge.output_microcents
        )

    @settings(max_examples=150, deadline=None)
    @given(usage=usages(), rates=rates_st)
    def test_components_match_the_fraction_oracle(
        self, usage: NormalizedUsage, rates: Rates
    ) -> None:
        charge = price_usage(usage, rates)
        uncached = usage.prompt_tokens - usage.cached_tokens
        assert charge.uncached_input_tokens == uncached
        assert charge.cache_read_tokens == usage.cached_tokens
        assert charge.output_tokens == usage.output_tokens
        assert charge.reasoning_tokens == usage.reasoning_tokens
        assert charge.input_microcents == oracle(uncached, rates.input_microcents_per_million)
        assert charge.cache_read_microcents == oracle(
            usage.cached_tokens, rates.cache_read_microcents_per_million
        )
        assert charge.output_microcents == oracle(
            usage.output_tokens, rates.output_microcents_per_million
        )
        for value in (
            charge.input_microcents,
            charge.cache_read_microcents,
            charge.output_microcents,
            charge.total_microcents,
        ):
            assert type(value) is int

    @settings(max_examples=300, deadline=None)
    @given(tokens=tokens_st, rate=rate_st)
    def test_component_is_exact_half_up(self, tokens: int, rate: int) -> None:
        result = component_microcents(tokens, rate)
        assert type(result) is int
        assert result == oracle(tokens, rate)
        # within half a microcent of the exact value; an exact half always goes up
        exact = Fraction(tokens * rate, 10**6)
        assert -Fraction(1, 2) < result - exact <= Fraction(1, 2)

    @settings(max_examples=200, deadline=None)
    @given(half=st.integers(0, MAX_TOKEN_COUNT * 10**6))
    def test_exact_halves_round_up(self, half: int) -> None:
        # tokens × rate = (2·half + 1) × 500,000 is exactly half + 0.5 microcents.
        rate = 500_000
        tokens = 2 * half + 1
        assert component_microcents(tokens, rate) == half + 1

    @settings(max_examples=200, deadline=None)
    @given(a=tokens_st, b=tokens_st, rate=rate_st)
    def test_component_is_monotone_in_tokens(self, a: int, b: int, rate: int) -> None:
        low, high = sorted((a, b))
        assert component_microcents(low, rate) <= component_microcents(high, rate)

    @settings(max_examples=200, deadline=None)
    @given(tokens=tokens_st, a=rate_st, b=rate_st)
    def test_component_is_monotone_in_rate(self, tokens: int, a: int, b: int) -> None:
        low, high = sorted((a, b))
        assert component_microcents(tokens, low) <= component_microcents(tokens, high)

    @settings(max_examples=200, deadline=None)
    @given(usage=usages(), rates=rates_st, extra=st.integers(1, 10**6), which=st.integers(0, 2))
    def test_each_charge_component_is_monotone_in_its_own_count(
        self, usage: NormalizedUsage, rates: Rates, extra: int, which: int
    ) -> None:
        uncached = usage.prompt_tokens - usage.cached_tokens
        cached, output = usage.cached_tokens, usage.output_tokens
        if which == 0:
            uncached += extra
        elif which == 1:
            cached += extra
        else:
            output += extra
        assume(max(uncached + cached, output) <= MAX_TOKEN_COUNT)
        before = price_usage(usage, rates)
        after = price_usage(
            NormalizedUsage(uncached + cached, cached, output, usage.reasoning_tokens), rates
        )
        pairs = [
            (before.input_microcents, after.input_microcents),
            (before.cache_read_microcents, after.cache_read_microcents),
            (before.output_microcents, after.output_microcents),
        ]
        for index, (old, new) in enumerate(pairs):
            if index == which:
                assert new >= old
            else:
                assert new == old  # the other components do not move
        assert after.total_microcents >= before.total_microcents

    @settings(max_examples=100, deadline=None)
    @given(tokens=st.integers(2**20, MAX_TOKEN_COUNT), rate=st.integers(10**9, MAX_RATE))
    def test_large_values_never_go_through_float(self, tokens: int, rate: int) -> None:
        # Products here exceed 2**53, where a float cannot hold every integer.
        result = component_microcents(tokens, rate)
        assert type(result) is int
        assert result == oracle(tokens, rate)
        assert result * 10**6 - tokens * rate <= 500_000
