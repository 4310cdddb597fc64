"""The price oracle of the tests and the benchmarks: what a request must be charged, computed
from its token counts and the rates in force, independently of the code under test.

It imports nothing of ``metering`` (nor anything that does): the rule is written out again
here from the API reference (docs/api.md, ``POST /v1/usage/events``), in plain integers.
A request is charged three components, each at its rate in microcents per million tokens and
each rounded to the nearest microcent, halves up, on its own:

* uncached input = prompt tokens (cache reads included) − cached tokens, at the input rate;
* cached tokens, at the cache-read rate;
* output tokens (reasoning included), at the output rate.

Rates come either from the catalog file the project ships (``metering/data/catalog.json``,
read as JSON) or as plain values from the test or benchmark that created them through the API.
A price version is in force from its ``effective_at`` (inclusive) until the next one's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

CATALOG = Path(__file__).resolve().parent.parent / "metering" / "data" / "catalog.json"
TOKENS_PER_RATE = 1_000_000  # a rate is microcents per million tokens
MICROCENTS_PER_CENT = 1_000_000


class Rates(NamedTuple):
    """Microcents per million tokens, in the order the admin API and the factories use."""

    input: int
    output: int
    cache_read: int


class Tokens(NamedTuple):
    """A request's usage after normalisation."""

    prompt: int  # every input token, cache reads included
    cached: int
    output: int  # every generated token, reasoning included
    reasoning: int = 0


@dataclass(frozen=True)
class Charge:
    tokens: Tokens
    input_microcents: int
    cache_read_microcents: int
    output_microcents: int

    @property
    def total_microcents(self) -> int:
        return self.input_microcents + self.cache_read_microcents + self.output_microcents

    def fields(self) -> dict[str, int]:
        """The ingest answer's ``charge`` object, but for its price version id."""
        return {
            "uncached_input_tokens": self.tokens.prompt - self.tokens.cached,
            "cache_read_tokens": self.tokens.cached,
            "output_tokens": self.tokens.output,
            "reasoning_tokens": self.tokens.reasoning,
            "input_microcents": self.input_microcents,
            "cache_read_microcents": self.cache_read_microcents,
            "output_microcents": self.output_microcents,
            "total_microcents": self.total_microcents,
        }


def component(tokens: int, rate: int) -> int:
    """``tokens`` at ``rate`` microcents per million, to the nearest microcent, halves up."""
    assert tokens >= 0 and rate >= 0, (tokens, rate)
    whole, remainder = divmod(tokens * rate, TOKENS_PER_RATE)
    # A remainder of exactly half a microcent (or more) rounds up.
    return whole + 1 if 2 * remainder >= TOKENS_PER_RATE else whole


def charge(tokens: Tokens, rates: Sequence[int]) -> Charge:
    """The charge of one request at ``rates`` (input, output, cache read)."""
    rate = Rates(*rates)
    assert 0 <= tokens.cached <= tokens.prompt and 0 <= tokens.reasoning <= tokens.output, tokens
    return Charge(
        tokens,
        input_microcents=component(tokens.prompt - tokens.cached, rate.input),
        cache_read_microcents=component(tokens.cached, rate.cache_read),
        output_microcents=component(tokens.output, rate.output),
    )


def _count(usage: Mapping[str, Any], field: str, detail: str | None = None) -> int:
    """A count of the usage object; a missing or null object or field is 0."""
    holder: Any = usage
    if detail is not None:
        holder = usage.get(detail) or {}
    value = holder.get(field)
    return 0 if value is None else int(value)


def tokens_of(api: str, usage: Mapping[str, Any]) -> Tokens:
    """The usage object as ``api`` returns it, normalised. Messages' ``input_tokens`` already
    counts its cache reads, and its ``cache_creation_input_tokens`` is not charged (always 0:
    there is no separate cache-write charge)."""
    if api == "chat_completions":
        return Tokens(
            _count(usage, "prompt_tokens"),
            _count(usage, "cached_tokens", "prompt_tokens_details"),
            _count(usage, "completion_tokens"),
            _count(usage, "reasoning_tokens", "completion_tokens_details"),
        )
    if api == "responses":
        return Tokens(
            _count(usage, "input_tokens"),
            _count(usage, "cached_tokens", "input_tokens_details"),
            _count(usage, "output_tokens"),
            _count(usage, "reasoning_tokens", "output_tokens_details"),
        )
    assert api == "messages", api
    return Tokens(
        _count(usage, "input_tokens"),
        _count(usage, "cache_read_input_tokens"),
        _count(usage, "output_tokens"),
    )


def event_charge(event: Mapping[str, Any], rates: Sequence[int]) -> Charge:
    """The charge of one event of ``POST /v1/usage/events`` as it was sent."""
    return charge(tokens_of(event["api"], event["usage"]), rates)


def total(events: Iterable[Mapping[str, Any]], rates: Sequence[int]) -> int:
    """Σ of the events' charges (each rounded on its own), in microcents."""
    return sum(event_charge(event, rates).total_microcents for event in events)


# --- Rates in force --------------------------------------------------------------------------


class Version(NamedTuple):
    """A price version: its rates from ``effective_at`` on (None: an account override ended)."""

    effective_at: datetime
    rates: Rates | None


def in_force(versions: Iterable[Version], at: datetime) -> Version | None:
    """The version in force at ``at``: the latest whose ``effective_at`` is at or before it."""
    started = [v for v in versions if v.effective_at <= at]
    return max(started, key=lambda v: v.effective_at) if started else None


def rates_at(
    list_prices: Iterable[Version], at: datetime, account_rates: Iterable[Version] = ()
) -> Rates | None:
    """The rates an account pays at ``at``: its own override when one is in force, else the
    list price (None: no price in force)."""
    override = in_force(account_rates, at)
    if override is not None and override.rates is not None:
        return override.rates
    listed = in_force(list_prices, at)
    return listed.rates if listed is not None else None


def catalog_prices(model_id: str, path: Path = CATALOG) -> list[Version]:
    """The model's list price versions in the catalog file (a model id compares without case)."""
    models = json.loads(path.read_text())["models"]
    (model,) = [m for m in models if m["id"].lower() == model_id.lower()]
    return [
        Version(
            datetime.fromisoformat(price["effective_at"]),
            Rates(
                price["input_microcents_per_million"],
                price["output_microcents_per_million"],
                price["cache_read_microcents_per_million"],
            ),
        )
        for price in model["prices"]
    ]
