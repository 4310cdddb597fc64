"""One recorded event with its charge and price version, for support questions."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.catalog.prices import price_in_force
from metering.catalog.service import account_rate_body, price_version_body
from metering.kit.errors import NotFound
from metering.kit.money import cents
from metering.kit.timeutil import format_timestamp
from metering.models import AccountRate, ApiKey, Authorization, PriceVersion, UsageEvent, table
from metering.usage.service import stored_charge_body


def _price_version(session: Session, event: UsageEvent) -> dict[str, Any] | None:
    version_id = event.price_version_id
    if version_id is None:
        return None  # an unbilled account's zero charge is priced by no version
    listed = session.get(PriceVersion, version_id)
    if listed is not None:
        return {**price_version_body(listed), "kind": "list"}
    rate = session.execute(
        select(AccountRate).where(
            AccountRate.id == version_id, AccountRate.account_id == event.account_id
        )
    ).scalar_one_or_none()
    return None if rate is None else {**account_rate_body(rate), "kind": "account"}


def event_body(session: Session, account_id: str, request_id: str) -> dict[str, Any]:
    event = session.execute(
        select(UsageEvent).where(
            UsageEvent.account_id == account_id, UsageEvent.request_id == request_id
        )
    ).scalar_one_or_none()
    if event is None:
        raise NotFound(
            f"no recorded event {request_id!r} in account {account_id!r}", param="request_id"
        )
    return {
        "object": "usage_event",
        "id": event.id,
        "account_id": event.account_id,
        "request_id": event.request_id,
        "api_key_id": event.api_key_id,
        "model": event.model_id,
        "api": event.api,
        "outcome": event.outcome,
        "occurred_at": format_timestamp(event.occurred_at),
        "recorded_at": format_timestamp(event.recorded_at),
        "authorization_id": event.authorization_id,
        "usage": {
            "prompt_tokens": event.prompt_tokens,
            "cached_tokens": event.cached_tokens,
            "output_tokens": event.output_tokens,
            "reasoning_tokens": event.reasoning_tokens,
        },
        "charge": stored_charge_body(event),
        "price_version": _price_version(session, event),
    }


# The priced components of a request: the name, its token count from the stored event, its rate
# column and its stored (rounded) amount.
_COMPONENTS = (
    (
        "input",
        lambda e: e.prompt_tokens - e.cached_tokens,
        "input_microcents_per_million",
        "input_microcents",
    ),
    (
        "cache_read",
        lambda e: e.cached_tokens,
        "cache_read_microcents_per_million",
        "cache_read_microcents",
    ),
    ("output", lambda e: e.output_tokens, "output_microcents_per_million", "output_microcents"),
)
EVENTS = table(UsageEvent)


def request_body(session: Session, account_id: str, request_id: str) -> dict[str, Any]:
    """What one request of the account cost, component by component: its key, project and
    member, the rates in force when it occurred (the price version stored with its charge),
    each component's exact amount (tokens × rate ÷ 10⁶, as decimal text) and its amount rounded
    half up to a microcent as it was charged, the total, and the hold it settled; 404 for a
    request id the account has no recorded event of."""
    event = session.execute(
        select(UsageEvent).where(
            UsageEvent.account_id == account_id, UsageEvent.request_id == request_id
        )
    ).scalar_one_or_none()
    if event is None:
        raise NotFound(f"no recorded request {request_id!r}", param="request_id")
    key = session.execute(
        select(ApiKey.project_id, ApiKey.member_id).where(
            ApiKey.account_id == account_id, ApiKey.id == event.api_key_id
        )
    ).first()
    # The rates in force when it occurred: the one definition, on the event's own row.
    price = price_in_force(EVENTS.c.account_id, EVENTS.c.model_id, EVENTS.c.occurred_at)
    found = session.execute(
        select(*price.labelled())
        .select_from(price.join(EVENTS))
        .where(EVENTS.c.account_id == account_id, EVENTS.c.id == event.id)
    ).first()
    rates = None if found is None or found.price_version_id != event.price_version_id else found
    components = []
    for name, tokens_of, rate_column, amount_column in _COMPONENTS:
        tokens = tokens_of(event)
        rate = None if rates is None else int(getattr(rates, rate_column))
        components.append(
            {
                "component": name,
                "tokens": tokens,
                "rate_microcents_per_million": rate,
                "exact_microcents": None if rate is None else _exact(tokens * rate),
                "microcents": getattr(event, amount_column),
            }
        )
    hold = None
    if event.authorization_id is not None:
        found_hold = session.execute(
            select(Authorization.id, Authorization.estimate_microcents, Authorization.status).where(
                Authorization.account_id == account_id, Authorization.id == event.authorization_id
            )
        ).first()
        if found_hold is not None:
            hold = {
                "id": found_hold.id,
                "estimate_microcents": found_hold.estimate_microcents,
                "estimate_cents": cents(found_hold.estimate_microcents),
                "status": found_hold.status,
            }
    return {
        "object": "request",
        "request_id": event.request_id,
        "account_id": event.account_id,
        "api_key_id": event.api_key_id,
        "project_id": None if key is None else key.project_id,
        "member_id": None if key is None else key.member_id,
        "model": event.model_id,
        "api": event.api,
        "outcome": event.outcome,
        "occurred_at": format_timestamp(event.occurred_at),
        "recorded_at": format_timestamp(event.recorded_at),
        "usage": {
            "prompt_tokens": event.prompt_tokens,
            "cached_tokens": event.cached_tokens,
            "output_tokens": event.output_tokens,
            "reasoning_tokens": event.reasoning_tokens,
        },
        "price_version_id": event.price_version_id,
        "components": components,
        "total_microcents": event.total_microcents,
        "total_cents": cents(event.total_microcents),
        "authorization": hold,
    }


def _exact(millionths: int) -> str:
    """``millionths`` ÷ 10⁶ as exact decimal text (no exponent, no trailing zeros)."""
    text = format(Decimal(millionths).scaleb(-6), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
