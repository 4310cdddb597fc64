"""Usage sent through the real ingest route, and the report it must produce, computed here in
plain Python from the events themselves (never through the code under test): each event's
charge is the price oracle's (tests/oracle.py), from its tokens and the rates the test set."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from metering.kit.timeutil import format_timestamp
from tests import oracle
from tests.conftest import Api
from tests.factories import Key, usage_object

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
PRICED_FROM = datetime(2026, 1, 1, tzinfo=UTC)
MEASURES = ("requests", "input_tokens", "cache_read_tokens", "output_tokens")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@dataclass(frozen=True)
class Pricing:
    """How an account's events must be charged, as its test set it up: each model's rates (one
    version, in force from ``PRICED_FROM``), and whether the account is billed at all."""

    rates: Mapping[str, tuple[int, int, int]]  # model (catalog spelling) -> its rates
    billed: bool = True

    def charge(self, model: str, api_name: str, usage: dict[str, Any]) -> dict[str, int]:
        """The ingest answer's charge for this usage (its price version id aside)."""
        charged = oracle.charge(oracle.tokens_of(api_name, usage), self.rates[model]).fields()
        if not self.billed:
            prices = ("input_microcents", "cache_read_microcents", "output_microcents")
            charged.update({name: 0 for name in (*prices, "total_microcents")})
        return charged


@dataclass(frozen=True)
class Sent:
    """One recorded event: what the report must count for it."""

    key: Key
    model: str  # catalog spelling
    occurred_at: datetime
    input_tokens: int  # all prompt tokens, cache reads included
    cache_read_tokens: int
    output_tokens: int  # reasoning included
    cost_microcents: int  # the price oracle's charge


def send_usage(
    api: Api,
    pricing: Pricing,
    key: Key,
    model: str,
    occurred_at: datetime,
    prompt: int = 1000,
    cached: int = 0,
    output: int = 100,
    *,
    reasoning: int = 0,
    api_name: str = "chat_completions",
    outcome: str = "completed",
    model_as_sent: str | None = None,
) -> Sent:
    """One event through ``POST /v1/usage/events``; it must be recorded at the oracle's
    charge."""
    return send_batch(
        api,
        pricing,
        [
            (key, model, occurred_at, prompt, cached, output),
        ],
        reasoning=reasoning,
        api_name=api_name,
        outcome=outcome,
        model_as_sent=model_as_sent,
    )[0]


def send_batch(
    api: Api,
    pricing: Pricing,
    specs: Iterable[tuple[Key, str, datetime, int, int, int]],
    *,
    reasoning: int = 0,
    api_name: str = "chat_completions",
    outcome: str = "completed",
    model_as_sent: str | None = None,
) -> list[Sent]:
    specs = list(specs)
    events = [
        {
            "request_id": f"req_{secrets.token_hex(8)}",
            "api_key_id": key.id,
            "model": model_as_sent or model,
            "api": api_name,
            "usage": usage_object(api_name, prompt, cached, output, reasoning),
            "occurred_at": format_timestamp(at),
            "outcome": outcome,
        }
        for key, model, at, prompt, cached, output in specs
    ]
    response = api.gateway("POST", "/v1/usage/events", json={"events": events})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["recorded"] == len(events), body
    sent = []
    for event, (key, model, at, prompt, cached, output), result in zip(
        events, specs, body["data"], strict=True
    ):
        assert result["status"] == "recorded", result
        expected = pricing.charge(model, api_name, event["usage"])
        charged = {name: result["charge"][name] for name in expected}
        assert charged == expected, (event, result)
        sent.append(Sent(key, model, at, prompt, cached, output, expected["total_microcents"]))
    return sent


def get_report(api: Api, key: Key, **params: Any) -> Any:
    response = api.as_key(key.secret, "GET", "/v1/usage", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return parse_exact(response.text)


# A JSON number (after ``:``, ``[`` or ``,``) written with an exponent.
_EXPONENT = re.compile(r"[:\[,]-?[0-9]+(\.[0-9]+)?[eE]")


def parse_exact(text: str) -> Any:
    """The body with decimals as Decimal; no number may use an exponent."""
    assert not _EXPONENT.search(text), text
    return json.loads(text, parse_float=Decimal)


def _usd(microcents: int) -> Decimal:
    return Decimal(microcents).scaleb(-8)


def _measures(events: list[Sent], billed: bool, with_usd: bool = True) -> dict[str, Any]:
    cost = sum(e.cost_microcents for e in events)
    return {
        "requests": len(events),
        "input_tokens": sum(e.input_tokens for e in events),
        "cache_read_tokens": sum(e.cache_read_tokens for e in events),
        "output_tokens": sum(e.output_tokens for e in events),
        "cost_usd": _usd(cost) if billed and with_usd else None,
        "cost_microcents": cost if billed else None,
    }


def expected_report(
    sent: Iterable[Sent],
    starting_at: datetime,
    ending_at: datetime,
    *,
    bucket_width: str = "1d",
    group_by: str = "model",
    billed: bool = True,
    hidden: Iterable[str] = (),
    key_names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``GET /v1/usage`` body for these events, summed here event by event."""
    sent = list(sent)
    hidden = set(hidden)
    width = DAY if bucket_width == "1d" else HOUR
    data = []
    start = starting_at
    while start < ending_at:
        inside = [e for e in sent if start <= e.occurred_at < start + width]
        groups: dict[str, list[Sent]] = {}
        for e in inside:
            if group_by == "api_key":
                group = e.key.id
            else:
                group = "unavailable" if e.model in hidden else e.model
            groups.setdefault(group, []).append(e)
        results = []
        for group in sorted(groups, key=str.encode):
            if group_by == "api_key":
                names = key_names or {}
                label = {"api_key": group, "api_key_name": names[group]}
                results.append({**label, **_measures(groups[group], billed, with_usd=False)})
            else:
                results.append({"model": group, **_measures(groups[group], billed)})
        data.append(
            {
                "starting_at": format_timestamp(start),
                "ending_at": format_timestamp(start + width),
                **_measures(inside, billed),
                "results": results,
            }
        )
        start += width
    in_window = [e for e in sent if starting_at <= e.occurred_at < ending_at]
    return {
        "object": "usage_report",
        "bucket_width": bucket_width,
        "group_by": group_by,
        "cost_status": "billed" if billed else "not_applicable",
        "currency": "usd",
        "totals": _measures(in_window, billed),
        "data": data,
    }
