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
    uncached, cached, output = usage.uncached_input_tokens, usage.cached_tokens, usage.output_tokens
    # Positionally, in ``Charge``'s order (a batch prices a thousand; by name costs twice as
    # much).
    return Charge(
        uncached,
        cached,
        output,
        usage.reasoning_tokens,
        component_microcents(uncached, rates.input_microcents_per_million),
        component_microcents(cached, rates.cache_read_microcents_per_million),
        component_microcents(output, rates.output_microcents_per_million),
    )
