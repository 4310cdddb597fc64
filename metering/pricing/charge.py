"""The charge of one request: three components, each rounded half up to a microcent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from metering.kit.money import round_half_up_div
from metering.pricing.usage import NormalizedUsage

TOKENS_PER_RATE_UNIT = 1_000_000  # rates are per million tokens


@dataclass(frozen=True, slots=True)
class Rates:
    """Integer microcents per million tokens."""

    input_microcents_per_million: int
    output_microcents_per_million: int
    cache_read_microcents_per_million: int


class Charge(NamedTuple):
    # A named tuple, not a frozen dataclass: as immutable, and made by name in less than half
    # the time (a batch prices a thousand events; docs/performance.md).
    uncached_input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    reasoning_tokens: int
    input_microcents: int
    cache_read_microcents: int
    output_microcents: int

    @property
    def total_microcents(self) -> int:
        return self.input_microcents + self.cache_read_microcents + self.output_microcents


def component_microcents(tokens: int, microcents_per_million: int) -> int:
    """``tokens`` at a per-million rate, rounded to the nearest microcent, halves up."""
    return round_half_up_div(tokens * microcents_per_million, TOKENS_PER_RATE_UNIT)


def price_usage(usage: NormalizedUsage, rates: Rates) -> Charge:
    uncached, cached = usage.uncached_input_tokens, usage.cached_tokens
    return Charge(
        uncached_input_tokens=uncached,
        cache_read_tokens=cached,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        input_microcents=component_microcents(uncached, rates.input_microcents_per_million),
        cache_read_microcents=component_microcents(cached, rates.cache_read_microcents_per_million),
        output_microcents=component_microcents(
            usage.output_tokens, rates.output_microcents_per_million
        ),
    )
