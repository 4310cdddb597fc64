"""One recorded event with its charge and price version, for support questions."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.catalog.service import account_rate_body, price_version_body
from metering.kit.errors import NotFound
from metering.kit.timeutil import format_timestamp
from metering.models import AccountRate, PriceVersion, UsageEvent
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
