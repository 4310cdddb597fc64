"""One usage event as the gateway sent it: keyed or rejected, then checked on its own.

Pure: no session, no clock (``now`` is passed in). The batch pipeline in ``service`` resolves
what needs the database (key, model, price) for every event at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, NamedTuple

from metering.kit.errors import InvalidRequest
from metering.kit.text import storable
from metering.kit.timeutil import parse_timestamp
from metering.models.usage import OUTCOMES
from metering.notifications.spend_limits import NO_SCOPES, KeyScopes
from metering.pricing import API_NAMES, Charge, InvalidUsage, NormalizedUsage, normalize_usage

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_REQUEST_ID_MATCH = REQUEST_ID.fullmatch
# occurred_at later than now + this is refused (clock skew between gateway and metering is fine).
FUTURE_TOLERANCE = timedelta(minutes=5)
# Longest authorization id stored (metering.states.holds.new_hold_id: under 50 characters).
MAX_AUTHORIZATION_ID = 64


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an event is rejected or quarantined: its result's ``error``."""

    code: str
    message: str
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param}


# Ranges (docs/api.md#ranges): billable, but its charge would take the account's balance or a report
# aggregate beyond a signed 64-bit integer (metering.kit.ranges).
OUT_OF_RANGE = Problem(
    "invalid_usage",
    "this event's charge would take the account's balance or usage totals beyond a signed 64-bit "
    "integer of microcents or tokens",
    "usage",
)


@dataclass(frozen=True, slots=True)
class Content:
    """What "same content" compares: the billing fields after normalisation — not the raw
    bytes and not ``authorization_id``. ``model_id`` is in catalog spelling."""

    api_key_id: str
    model_id: str
    api: str
    usage: NormalizedUsage
    occurred_at: datetime
    outcome: str


class ChargeValues(NamedTuple):
    """A result's ``charge`` (docs/api.md#post-v1usageevents)."""

    uncached_input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    reasoning_tokens: int
    input_microcents: int
    cache_read_microcents: int
    output_microcents: int
    total_microcents: int
    price_version_id: str | None

    @classmethod
    def of_stored(cls, event: Mapping[str, Any]) -> ChargeValues:
        """The charge of a stored event (its ``usage_events`` columns by name)."""
        return cls(
            event["prompt_tokens"] - event["cached_tokens"],
            event["cached_tokens"],
            event["output_tokens"],
            event["reasoning_tokens"],
            event["input_microcents"],
            event["cache_read_microcents"],
            event["output_microcents"],
            event["total_microcents"],
            event["price_version_id"],
        )


CHARGE_FIELDS = ChargeValues._fields
# A Charge's fields are a ChargeValues' first, in order (``Event.charge_values``).
assert CHARGE_FIELDS[: len(Charge._fields)] == Charge._fields


@dataclass(slots=True)
class Event:
    """A keyed event (it has a valid ``request_id``); ``problem`` is set once it is known to be
    unbillable now."""

    index: int
    request_id: str
    raw: Mapping[str, Any]
    api_key_id: str | None
    model: str | None
    api: str
    outcome: str
    occurred_at: datetime | None
    usage: NormalizedUsage | None
    authorization_id: str | None
    problem: Problem | None
    # Resolved against the database by the batch pipeline:
    account_id: str | None = None
    prepaid: bool = False  # the account is prepaid (unbilled: a zero charge)
    # The key's project, member and spend limits, for their thresholds
    # (spend_limit.threshold_reached).
    scopes: KeyScopes = NO_SCOPES
    model_id: str | None = None  # catalog spelling
    # Priced (billable now): the charge and the price version used (None: unbilled account).
    charge: Charge | None = None
    price_version_id: str | None = None

    def content(self) -> Content:
        assert self.api_key_id and self.model_id and self.usage and self.occurred_at
        return Content(
            self.api_key_id, self.model_id, self.api, self.usage, self.occurred_at, self.outcome
        )

    def charge_values(self) -> ChargeValues:
        charge = self.charge
        assert charge is not None
        return ChargeValues(*charge, charge.total_microcents, self.price_version_id)

    def row(self) -> dict[str, Any]:
        """The event's ``usage_events`` row (metering.usage.recording.EVENT_COLUMNS), read as
        ``ROW_ATTRIBUTES`` says."""
        assert self.usage is not None and self.charge is not None
        return dict(zip(ROW_ATTRIBUTES, _ROW_VALUES(self), strict=True))


# Each column of a priced event's ``usage_events`` row and the attribute of its ``Event`` that
# holds it: ``Event.row``, and a batch's arrays, read from its events without a row each
# (metering.usage.repository).
ROW_ATTRIBUTES = {
    "account_id": "account_id",
    "request_id": "request_id",
    "api_key_id": "api_key_id",
    "model_id": "model_id",
    "api": "api",
    "outcome": "outcome",
    "occurred_at": "occurred_at",
    "authorization_id": "authorization_id",
    "prompt_tokens": "usage.prompt_tokens",
    "cached_tokens": "usage.cached_tokens",
    "output_tokens": "usage.output_tokens",
    "reasoning_tokens": "usage.reasoning_tokens",
    "input_microcents": "charge.input_microcents",
    "cache_read_microcents": "charge.cache_read_microcents",
    "output_microcents": "charge.output_microcents",
    "total_microcents": "charge.total_microcents",
    "price_version_id": "price_version_id",
}
_ROW_VALUES = attrgetter(*ROW_ATTRIBUTES.values())


# The fields ``parse_event`` gives an ``Event``, in order.
_PARSED_FIELDS = (
    "index",
    "request_id",
    "raw",
    "api_key_id",
    "model",
    "api",
    "outcome",
    "occurred_at",
    "usage",
    "authorization_id",
    "problem",
)
assert tuple(f.name for f in fields(Event))[: len(_PARSED_FIELDS)] == _PARSED_FIELDS


def is_keyed(raw: object) -> bool:
    """The common case, checked first: a JSON object with a valid ``request_id``."""
    if type(raw) is not dict:
        return isinstance(raw, Mapping) and reject_reason(raw) is None
    request_id = raw.get("request_id")
    return type(request_id) is str and _REQUEST_ID_MATCH(request_id) is not None


def reject_reason(raw: object) -> Problem | None:
    """Why ``raw`` cannot even be keyed (nothing is stored for it), or None."""
    if not isinstance(raw, Mapping):
        return Problem("invalid_parameter", "an event must be a JSON object")
    request_id = raw.get("request_id")
    if request_id is None:
        return Problem("missing_parameter", "request_id is required", "request_id")
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        return Problem(
            "invalid_parameter",
            "request_id must be 1–64 characters of A–Z a–z 0–9 . _ : -",
            "request_id",
        )
    return None


def _text(value: object) -> str | None:
    """A string field as sent, or None when absent, not a string, or not storable text (a NUL
    or an unpaired surrogate names no key, model or hold, and cannot be stored in a column)."""
    return value if isinstance(value, str) and storable(value) else None


def parse_event(index: int, raw: Mapping[str, Any], now: datetime) -> Event:
    """A keyed event with the problems that need no database: timestamp, api, outcome, usage.

    An unknown ``api`` or ``outcome`` is ``invalid_usage``: the usage cannot be read (or billed)
    without knowing which API reported it and how it ended."""
    authorization_id = _text(raw.get("authorization_id"))
    if authorization_id is not None and not 0 < len(authorization_id) <= MAX_AUTHORIZATION_ID:
        # A malformed hold reference must not keep usage from being billed: it names no hold.
        authorization_id = None
    api = raw.get("api")
    outcome = raw.get("outcome")
    # Positionally (a batch parses a thousand; by name costs twice as much): in the order of
    # ``_PARSED_FIELDS``.
    event = Event(
        index,
        raw["request_id"],
        raw,
        _text(raw.get("api_key_id")),
        _text(raw.get("model")),
        api if isinstance(api, str) else "",
        outcome if isinstance(outcome, str) else "",
        None,  # occurred_at
        None,  # usage
        authorization_id,
        None,  # problem
    )
    try:
        event.occurred_at = parse_timestamp(raw.get("occurred_at"), "occurred_at")
    except InvalidRequest as exc:
        event.problem = Problem("invalid_timestamp", exc.message, "occurred_at")
        return event
    if event.occurred_at > now + FUTURE_TOLERANCE:
        event.problem = Problem(
            "invalid_timestamp",
            "occurred_at is more than 5 minutes in the future",
            "occurred_at",
        )
        return event
    if api not in API_NAMES:
        event.problem = Problem(
            "invalid_usage", f"api must be one of {', '.join(API_NAMES)}", "api"
        )
        return event
    if outcome not in OUTCOMES:
        event.problem = Problem(
            "invalid_usage", f"outcome must be one of {', '.join(OUTCOMES)}", "outcome"
        )
        return event
    try:
        event.usage = normalize_usage(event.api, raw.get("usage"))
    except InvalidUsage as exc:
        param = f"usage.{exc.field}" if exc.field else "usage"
        event.problem = Problem("invalid_usage", str(exc), param)
    return event
