"""The pre-flight estimate: the maximum possible cost of a request
(docs/api.md#post-v1authorizations)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from metering.pricing import (
    Estimate,
    EstimateError,
    EstimateRequest,
    ModelLimits,
    NormalizedUsage,
    Rates,
    default_output_limit,
    estimate_cost,
    price_usage,
)
from metering.pricing.estimate import effective_output_limit

APIS = ["chat_completions", "responses", "messages"]

GLM_LIMITS = ModelLimits(context_length=1_048_576)
GLM_RATES = Rates(
    input_microcents_per_million=22_000_000,
    output_microcents_per_million=339_000_000,
    cache_read_microcents_per_million=17_750_000,
)
SMALL = ModelLimits(context_length=32_768)  # default output: min(65536, 16384) = 16384
CAPPED = ModelLimits(context_length=131_072, max_output_tokens=8_192)
# Like DeepSeek-V4-Pro: up to 24,576 extra tokens of room when reasoning is on.
HEADROOM = ModelLimits(context_length=1_048_576, reasoning_headroom_tokens=24_576)


def half_up(value: Fraction) -> int:
    return math.floor(value + Fraction(1, 2))


def priced(tokens: int, rate: int) -> int:
    """Independent oracle: tokens at a per-million microcent rate, rounded half up."""
    return half_up(Fraction(tokens * rate, 10**6))


def request(
    api: str = "chat_completions",
    prompt: int = 1000,
    max_tokens: int | None = None,
    n: int = 1,
    reasoning: bool = False,
) -> EstimateRequest:
    return EstimateRequest(
        api=api, prompt_tokens=prompt, max_tokens=max_tokens, n=n, reasoning=reasoning
    )


class TestDefaultOutputLimit:
    @pytest.mark.parametrize(
        ("limits", "prompt", "expected"),
        [
            (GLM_LIMITS, 1_000, 65_536),  # min(65536, 524288)
            (GLM_LIMITS, 1_000_000, 48_576),  # never more than context − prompt
            (ModelLimits(8_192), 0, 4_096),  # half the context when that is smaller
            (ModelLimits(8_192), 6_000, 2_192),
            (ModelLimits(9), 0, 4),  # half, rounded down
            (ModelLimits(131_072), 0, 65_536),  # exactly 65536 either way
            (ModelLimits(131_074), 0, 65_536),
            (CAPPED, 1_000, 8_192),  # max_output_tokens when the model has one
            (CAPPED, 125_000, 6_072),
            # a cap above 65536 wins over the 65536 default
            (ModelLimits(200_000, max_output_tokens=128_000), 0, 128_000),
            (ModelLimits(200_000, max_output_tokens=128_000), 100_000, 100_000),
            (ModelLimits(2, max_output_tokens=1), 1, 1),
        ],
    )
    def test_default(self, limits: ModelLimits, prompt: int, expected: int) -> None:
        assert default_output_limit(limits, prompt) == expected


class TestEffectiveLimit:
    @pytest.mark.parametrize(
        ("api", "prompt", "max_tokens", "limits", "expected"),
        [
            # omitted → the default
            ("chat_completions", 1_000, None, SMALL, 16_384),
            ("responses", 1_000, None, SMALL, 16_384),
            ("chat_completions", 30_000, None, SMALL, 2_768),
            ("responses", 32_767, None, SMALL, 1),
            # given and fitting → as given
            ("chat_completions", 1_000, 512, SMALL, 512),
            ("responses", 1_000, 512, SMALL, 512),
            ("messages", 1_000, 512, SMALL, 512),
            ("messages", 1_000, 1, SMALL, 1),
            # larger than the whole context window → ignored, the default applies (every API)
            ("chat_completions", 1_000, 32_769, SMALL, 16_384),
            ("responses", 1_000, 40_000, SMALL, 16_384),
            ("messages", 1_000, 10**9, SMALL, 16_384),
            ("responses", 30_000, 32_769, SMALL, 2_768),
            # above max_output_tokens → lowered to it
            ("chat_completions", 1_000, 10_000, CAPPED, 8_192),
            ("responses", 1_000, 131_072, CAPPED, 8_192),
            ("messages", 1_000, 8_193, CAPPED, 8_192),
            ("messages", 1_000, 8_192, CAPPED, 8_192),
            # prompt + limit exactly the context window fits
            ("responses", 20_000, 12_768, SMALL, 12_768),
            ("messages", 122_880, 8_192, CAPPED, 8_192),
            ("responses", 122_880, 9_000, CAPPED, 8_192),  # lowered first, then it fits
            # chat_completions retries without max_tokens when it does not fit
            ("chat_completions", 20_000, 12_769, SMALL, 12_768),
            ("chat_completions", 1_000, 32_768, SMALL, 16_384),
            ("chat_completions", 125_000, 8_000, CAPPED, 6_072),
            ("chat_completions", 125_000, 10_000, CAPPED, 6_072),
        ],
    )
    def test_limit(
        self, api: str, prompt: int, max_tokens: int | None, limits: ModelLimits, expected: int
    ) -> None:
        req = request(api, prompt, max_tokens)
        assert effective_output_limit(req, limits) == expected
        assert estimate_cost(req, limits, GLM_RATES).max_tokens == expected

    @pytest.mark.parametrize(
        ("api", "prompt", "max_tokens", "limits"),
        [
            ("responses", 20_000, 12_769, SMALL),
            ("messages", 20_000, 12_769, SMALL),
            ("responses", 1_000, 32_768, SMALL),  # == context: not ignored, and does not fit
            ("messages", 125_000, 8_000, CAPPED),
            ("responses", 125_000, 10_000, CAPPED),  # lowered to 8192, still does not fit
        ],
    )
    def test_prompt_plus_limit_over_context_on_responses_and_messages(
        self, api: str, prompt: int, max_tokens: int, limits: ModelLimits
    ) -> None:
        with pytest.raises(EstimateError) as caught:
            estimate_cost(request(api, prompt, max_tokens), limits, GLM_RATES)
        assert caught.value.code == "context_length_exceeded"
        assert caught.value.param == "max_tokens"
        assert caught.value.extra == {"context_length_limit": limits.context_length}

    @pytest.mark.parametrize("api", APIS)
    @pytest.mark.parametrize("prompt", [32_768, 32_769, 10**9])
    def test_prompt_that_fills_the_context(self, api: str, prompt: int) -> None:
        with pytest.raises(EstimateError) as caught:
            estimate_cost(request(api, prompt, max_tokens=16), SMALL, GLM_RATES)
        assert caught.value.code == "context_length_exceeded"
        assert caught.value.extra["context_length_limit"] == 32_768

    def test_prompt_one_below_the_context_leaves_one_token(self) -> None:
        estimate = estimate_cost(request(prompt=32_767), SMALL, GLM_RATES)
        assert estimate.max_tokens == 1


class TestInvalidRequests:
    def test_messages_requires_max_tokens(self) -> None:
        with pytest.raises(EstimateError) as caught:
            estimate_cost(request("messages", 1_000, None), SMALL, GLM_RATES)
        assert (caught.value.code, caught.value.param) == ("missing_parameter", "max_tokens")

    @pytest.mark.parametrize("api", ["chat_completions", "responses"])
    def test_other_apis_do_not_require_max_tokens(self, api: str) -> None:
        assert estimate_cost(request(api, 1_000, None), SMALL, GLM_RATES).max_tokens == 16_384

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": -1}, "max_tokens"),
            ({"n": 0}, "n"),
            ({"n": -3}, "n"),
            ({"prompt": -1}, "prompt_tokens"),
        ],
    )
    @pytest.mark.parametrize("api", APIS)
    def test_invalid_parameter(self, api: str, fields: dict[str, int], param: str) -> None:
        values = {"api": api, "prompt": 1_000, "max_tokens": 64, **fields}
        with pytest.raises(EstimateError) as caught:
            estimate_cost(request(**values), SMALL, GLM_RATES)  # type: ignore[arg-type]
        assert (caught.value.code, caught.value.param) == ("invalid_parameter", param)

    def test_unknown_api(self) -> None:
        with pytest.raises(EstimateError) as caught:
            estimate_cost(request("completions"), SMALL, GLM_RATES)
        assert (caught.value.code, caught.value.param) == ("unsupported_value", "api")

    def test_zero_prompt_is_valid(self) -> None:
        estimate = estimate_cost(request(prompt=0, max_tokens=10), SMALL, GLM_RATES)
        assert (estimate.input_microcents, estimate.output_microcents) == (0, 3_390)


class TestAmounts:
    def test_glm_chat_request(self) -> None:
        estimate = estimate_cost(request(prompt=4_508, max_tokens=512), GLM_LIMITS, GLM_RATES)
        assert estimate == Estimate(
            max_tokens=512,
            reserved_output_tokens=512,
            input_microcents=99_176,  # 4508 × 22: the prompt priced as uncached
            output_microcents=173_568,  # 512 × 339
        )
        assert estimate.total_microcents == 272_744

    def test_default_limit_on_glm(self) -> None:
        estimate = estimate_cost(request(prompt=4_508), GLM_LIMITS, GLM_RATES)
        assert estimate.reserved_output_tokens == 65_536
        assert estimate.output_microcents == 22_216_704  # 65536 × 339
        assert estimate.total_microcents == 22_315_880

    @pytest.mark.parametrize(
        ("reasoning", "n", "reserved"),
        [
            (False, 1, 4_096),
            (True, 1, 28_672),  # 4096 + 24576
            (False, 3, 12_288),
            (True, 3, 86_016),  # (4096 + 24576) × 3
        ],
    )
    def test_reasoning_headroom_and_n(self, reasoning: bool, n: int, reserved: int) -> None:
        req = request(prompt=1_000, max_tokens=4_096, n=n, reasoning=reasoning)
        estimate = estimate_cost(req, HEADROOM, GLM_RATES)
        assert estimate.max_tokens == 4_096  # the limit per choice, headroom not included
        assert estimate.reserved_output_tokens == reserved
        assert estimate.output_microcents == reserved * 339
        assert estimate.input_microcents == 22_000  # the prompt once, whatever n

    def test_headroom_is_ignored_on_a_model_without_it(self) -> None:
        req = request(prompt=1_000, max_tokens=4_096, reasoning=True)
        assert estimate_cost(req, GLM_LIMITS, GLM_RATES).reserved_output_tokens == 4_096

    def test_n_multiplies_the_fallback_default(self) -> None:
        req = request(prompt=20_000, max_tokens=20_000, n=2)
        estimate = estimate_cost(req, SMALL, GLM_RATES)
        assert (estimate.max_tokens, estimate.reserved_output_tokens) == (12_768, 25_536)

    def test_each_part_rounds_half_up_on_its_own(self) -> None:
        # 3 × 0.95 = 2.85 → 3 and 3 × 0.5 = 1.5 → 2; rounding the sum (4.35) would give 4.
        rates = Rates(950_000, 500_000, 95_000)
        estimate = estimate_cost(request(prompt=3, max_tokens=3), SMALL, rates)
        assert (estimate.input_microcents, estimate.output_microcents) == (3, 2)
        assert estimate.total_microcents == 5

    @pytest.mark.parametrize(
        ("prompt", "max_tokens", "rate", "expected_input", "expected_output"),
        [
            (1, 1, 500_000, 1, 1),  # 0.5 → 1
            (1, 1, 499_999, 0, 0),
            (3, 3, 500_000, 2, 2),  # 1.5 → 2
        ],
    )
    def test_halves(
        self, prompt: int, max_tokens: int, rate: int, expected_input: int, expected_output: int
    ) -> None:
        req = request(prompt=prompt, max_tokens=max_tokens)
        estimate = estimate_cost(req, SMALL, Rates(rate, rate, 0))
        assert (estimate.input_microcents, estimate.output_microcents) == (
            expected_input,
            expected_output,
        )

    def test_estimate_is_frozen(self) -> None:
        estimate = estimate_cost(request(), SMALL, GLM_RATES)
        with pytest.raises(AttributeError):
            estimate.total_microcents = 0  # type: ignore[misc]


def contract_limit(req: EstimateRequest, limits: ModelLimits) -> int | str:
    """The estimate's output limit written out again, step by step: the limit, or the error code it
    calls for."""
    if req.api == "messages" and req.max_tokens is None:
        return "missing_parameter"
    context = limits.context_length
    if req.prompt_tokens >= context:
        return "context_length_exceeded"
    if limits.max_output_tokens is not None:
        default = limits.max_output_tokens
    else:
        default = min(65_536, context // 2)
    default = min(default, context - req.prompt_tokens)
    if req.max_tokens is None or req.max_tokens > context:
        return default
    limit = req.max_tokens
    if limits.max_output_tokens is not None and limit > limits.max_output_tokens:
        limit = limits.max_output_tokens
    if req.prompt_tokens + limit > context:
        return default if req.api == "chat_completions" else "context_length_exceeded"
    return limit


@st.composite
def model_limits(draw: st.DrawFn) -> ModelLimits:
    # From 2: a 1-token window would leave a default output limit of 1 // 2 = 0.
    context = draw(st.integers(2, 2**21))
    cap = draw(st.none() | st.integers(1, 2 * context))
    headroom = draw(st.sampled_from([0, 0, 24_576]) | st.integers(0, 50_000))
    return ModelLimits(context, cap, headroom)


@st.composite
def requests_for(draw: st.DrawFn, limits: ModelLimits) -> EstimateRequest:
    context = limits.context_length
    prompt = draw(st.integers(0, context + 2) | st.integers(0, 100))
    room = context - prompt  # around the edge where prompt + max_tokens stops fitting
    max_tokens = draw(
        st.none()
        | st.integers(1, 2 * context + 2)
        | st.integers(max(1, room - 2), max(1, room + 2))
    )
    return EstimateRequest(
        api=draw(st.sampled_from(APIS)),
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        n=draw(st.integers(1, 8)),
        reasoning=draw(st.booleans()),
    )


rate_st = st.integers(0, 10**12)


class TestProperties:
    @settings(max_examples=200, deadline=None)
    @given(data=st.data())
    def test_limit_follows_the_contract(self, data: st.DataObject) -> None:
        limits = data.draw(model_limits(), label="limits")
        req = data.draw(requests_for(limits), label="request")
        expected = contract_limit(req, limits)
        if isinstance(expected, str):
            with pytest.raises(EstimateError) as caught:
                effective_output_limit(req, limits)
            assert caught.value.code == expected
            return
        limit = effective_output_limit(req, limits)
        assert limit == expected
        assert 1 <= limit <= limits.context_length - req.prompt_tokens
        if limits.max_output_tokens is not None:
            assert limit <= limits.max_output_tokens

    @settings(max_examples=200, deadline=None)
    @given(data=st.data(), rates=st.builds(Rates, rate_st, rate_st, rate_st))
    def test_amounts_follow_the_contract(self, data: st.DataObject, rates: Rates) -> None:
        limits = data.draw(model_limits(), label="limits")
        req = data.draw(requests_for(limits), label="request")
        expected_limit = contract_limit(req, limits)
        if isinstance(expected_limit, str):
            return
        estimate = estimate_cost(req, limits, rates)
        headroom = limits.reasoning_headroom_tokens if req.reasoning else 0
        reserved = (expected_limit + headroom) * req.n
        assert estimate.max_tokens == expected_limit
        assert estimate.reserved_output_tokens == reserved
        assert estimate.input_microcents == priced(
            req.prompt_tokens, rates.input_microcents_per_million
        )
        assert estimate.output_microcents == priced(reserved, rates.output_microcents_per_million)
        assert estimate.total_microcents == estimate.input_microcents + estimate.output_microcents
        assert type(estimate.total_microcents) is int


@st.composite
def priced_requests(
    draw: st.DrawFn, whole_microcent_input: bool
) -> tuple[ModelLimits, EstimateRequest, Rates]:
    """A model, a request it accepts, and rates where cache reads cost no more than input."""
    limits = draw(model_limits())
    req = draw(requests_for(limits))
    assume(not isinstance(contract_limit(req, limits), str))
    # whole microcents per token (like 22 and 339), or any rate at all
    whole = st.integers(0, 10**6).map(lambda per_token: per_token * 10**6)
    input_rate = draw(whole if whole_microcent_input else rate_st)
    cache_rate = draw(st.integers(0, input_rate))  # cache reads never cost more than input
    rates = Rates(input_rate, draw(rate_st), cache_rate)
    return limits, req, rates


def legitimate_usage(draw: st.DrawFn, req: EstimateRequest, reserved: int) -> NormalizedUsage:
    prompt = draw(st.integers(0, req.prompt_tokens) | st.just(req.prompt_tokens))
    cached = draw(st.integers(0, prompt) | st.sampled_from([0, prompt]))
    output = draw(st.integers(0, reserved) | st.just(reserved))
    return NormalizedUsage(prompt, cached, output, draw(st.integers(0, output)))


class TestEstimateCoversTheCharge:
    """The point of the estimate: no usage the request can produce costs more than the hold."""

    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    def test_any_cached_split_at_whole_microcent_input_rates(self, data: st.DataObject) -> None:
        limits, req, rates = data.draw(priced_requests(whole_microcent_input=True))
        estimate = estimate_cost(req, limits, rates)
        usage = legitimate_usage(data.draw, req, estimate.reserved_output_tokens)
        assert price_usage(usage, rates).total_microcents <= estimate.total_microcents

    @settings(max_examples=150, deadline=None)
    @given(data=st.data(), all_cached=st.booleans())
    def test_any_rates_when_the_prompt_is_not_split(
        self, data: st.DataObject, all_cached: bool
    ) -> None:
        limits, req, rates = data.draw(priced_requests(whole_microcent_input=False))
        estimate = estimate_cost(req, limits, rates)
        usage = legitimate_usage(data.draw, req, estimate.reserved_output_tokens)
        cached = usage.prompt_tokens if all_cached else 0
        usage = NormalizedUsage(
            usage.prompt_tokens, cached, usage.output_tokens, usage.reasoning_tokens
        )
        assert price_usage(usage, rates).total_microcents <= estimate.total_microcents

    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    def test_output_part_covers_any_output(self, data: st.DataObject) -> None:
        limits, req, rates = data.draw(priced_requests(whole_microcent_input=False))
        estimate = estimate_cost(req, limits, rates)
        usage = legitimate_usage(data.draw, req, estimate.reserved_output_tokens)
        assert price_usage(usage, rates).output_microcents <= estimate.output_microcents

    def test_split_prompt_at_sub_microcent_rates_can_exceed_the_hold_by_rounding(self) -> None:
        """The estimate rounds the prompt once; the charge rounds its uncached and cached
        parts separately. At sub-microcent-per-token rates a split prompt can therefore cost
        1 µ¢ more than the hold. That is by design: usage is always billed in full."""
        rates = Rates(700_000, 1_000_000, 690_000)  # 0.7 and 0.69 µ¢ per token
        estimate = estimate_cost(request(prompt=2, max_tokens=1), SMALL, rates)
        charge = price_usage(NormalizedUsage(2, 1, 1, 0), rates)
        # charge: round(0.7) + round(0.69) + round(1.0) = 3; estimate: round(1.4) + 1 = 2
        assert (charge.total_microcents, estimate.total_microcents) == (3, 2)
