"""The pre-flight estimate: the maximum possible cost of a request
(docs/api.md#post-v1authorizations)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metering.pricing.charge import Rates, component_microcents
from metering.pricing.usage import API_NAMES

DEFAULT_OUTPUT_CAP = 65_536


class EstimateError(ValueError):
    """A request that cannot be estimated; ``code`` and ``param`` are the API's."""

    def __init__(self, message: str, code: str, param: str | None, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.extra = extra


@dataclass(frozen=True, slots=True)
class ModelLimits:
    context_length: int
    max_output_tokens: int | None = None
    reasoning_headroom_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EstimateRequest:
    api: str
    prompt_tokens: int
    max_tokens: int | None = None
    n: int = 1
    reasoning: bool = False


@dataclass(frozen=True, slots=True)
class Estimate:
    max_tokens: int  # the effective output limit per choice
    reserved_output_tokens: int  # (limit + reasoning headroom) × n
    input_microcents: int
    output_microcents: int
    total_microcents: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_microcents", self.input_microcents + self.output_microcents)


def default_output_limit(limits: ModelLimits, prompt_tokens: int) -> int:
    """The output limit applied when ``max_tokens`` is omitted (or ignored)."""
    if limits.max_output_tokens is not None:
        default = limits.max_output_tokens
    else:
        default = min(DEFAULT_OUTPUT_CAP, limits.context_length // 2)
    return min(default, limits.context_length - prompt_tokens)


def _check_request(request: EstimateRequest) -> None:
    if request.api not in API_NAMES:
        raise EstimateError(
            f"api must be one of {', '.join(API_NAMES)}", "unsupported_value", "api"
        )
    if request.prompt_tokens < 0:
        raise EstimateError(
            "prompt_tokens must not be negative", "invalid_parameter", "prompt_tokens"
        )
    if request.n < 1:
        raise EstimateError("n must be at least 1", "invalid_parameter", "n")
    if request.max_tokens is None:
        if request.api == "messages":
            raise EstimateError(
                "max_tokens is required for the messages API", "missing_parameter", "max_tokens"
            )
    elif request.max_tokens < 1:
        raise EstimateError("max_tokens must be at least 1", "invalid_parameter", "max_tokens")


def effective_output_limit(request: EstimateRequest, limits: ModelLimits) -> int:
    """The output limit the inference API will apply to this request, or an EstimateError."""
    _check_request(request)
    context = limits.context_length
    if request.prompt_tokens >= context:
        raise EstimateError(
            f"the prompt ({request.prompt_tokens} tokens) does not fit the context window "
            f"({context} tokens)",
            "context_length_exceeded",
            "prompt_tokens",
            context_length_limit=context,
        )
    default = default_output_limit(limits, request.prompt_tokens)
    if request.max_tokens is None or request.max_tokens > context:
        return default
    limit = request.max_tokens
    if limits.max_output_tokens is not None:
        limit = min(limit, limits.max_output_tokens)
    if request.prompt_tokens + limit > context:
        if request.api == "chat_completions":
            return default  # Chat Completions retries once without max_tokens
        raise EstimateError(
            f"prompt_tokens + max_tokens ({request.prompt_tokens} + {limit}) exceed the context "
            f"window ({context} tokens)",
            "context_length_exceeded",
            "max_tokens",
            context_length_limit=context,
        )
    return limit


def estimate_cost(request: EstimateRequest, limits: ModelLimits, rates: Rates) -> Estimate:
    """The maximum cost of a request; the prompt is priced as uncached (hits are not guaranteed)."""
    limit = effective_output_limit(request, limits)
    headroom = limits.reasoning_headroom_tokens if request.reasoning else 0
    reserved = (limit + headroom) * request.n
    return Estimate(
        max_tokens=limit,
        reserved_output_tokens=reserved,
        input_microcents=component_microcents(
            request.prompt_tokens, rates.input_microcents_per_million
        ),
        output_microcents=component_microcents(reserved, rates.output_microcents_per_million),
    )


def field_beyond_range(request: EstimateRequest, estimate: Estimate, room: int) -> str:
    """The field that makes ``estimate`` too large for the ``room`` left in range
    (docs/api.md#ranges: the account's held sum stays within a signed 64-bit integer):
    ``prompt_tokens`` when the prompt alone does not fit, else ``n`` when one choice would, else
    ``max_tokens``."""
    if estimate.input_microcents > room:
        return "prompt_tokens"
    if (
        request.n > 1
        and estimate.input_microcents + estimate.output_microcents // request.n <= room
    ):
        return "n"
    return "max_tokens"
