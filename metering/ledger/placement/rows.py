"""What the backends' statements return, shared by both: a resolving row, a placement."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

from metering.pricing import Rates

# The gateway's view of a hold (metering.ledger.authorizations.hold_body), in this order.
BODY_COLUMNS = (
    "id",
    "status",
    "request_id",
    "account_id",
    "api_key_id",
    "model_id",
    "max_tokens",
    "estimate_microcents",
    "expires_at",
)
# The columns of a hold placed by an authorization.
HOLD_VALUES = (
    "id",
    "account_id",
    "api_key_id",
    "request_id",
    "request_fingerprint",
    "model_id",
    "api",
    "prompt_tokens",
    "requested_max_tokens",
    "n",
    "reasoning",
    "max_tokens",
    "estimate_microcents",
    "created_at",
    "expires_at",
)


@dataclass(frozen=True, slots=True)
class ModelRow:
    id: str
    context_length: int
    max_output_tokens: int | None
    reasoning_headroom_tokens: int
    deprecation_date: date | None


@dataclass(frozen=True, slots=True)
class Resolved:
    """The client's live key with its account, the model (None: unknown) with the account's
    rates in force (None: no price), and whether the account already has a hold with the
    request id."""

    api_key_id: str
    account_id: str
    billing: str
    spend_limit: int | None
    model: ModelRow | None
    rates: Rates | None
    known_request: bool
    # PostgreSQL: the resolution's text as ``metering_resolution`` gave it (migration 0010),
    # set on one remembered for later authorizations; the check-and-hold of a hold estimated
    # from it confirms the text is still what the database gives.
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """'granted', 'insufficient_credits', 'member_spend_limit', or 'exists' (the account
    already has a hold with this request id); ``available``: balance minus the holds in force,
    before this one."""

    outcome: str
    available: int


def rates_in_force(
    override: tuple[int | None, int | None, int | None] | None,
    listed: tuple[int | None, int | None, int | None] | None,
) -> Rates | None:
    """catalog.service.price_in_force's rule: the override in force unless it ends the
    override (all null), else the list price; None when neither is in force."""
    for source in (override, listed):
        if source is not None and source[0] is not None:
            return Rates(*source)  # type: ignore[arg-type]
    return None


def resolved_from(row: Any, known_request: bool) -> Resolved:
    """A resolving row: the key (0–3), the model (4–8), override (9–11) and list (12–14)
    rates."""
    model = None if row[4] is None else ModelRow(*row[4:9])
    return Resolved(
        api_key_id=row[0],
        account_id=row[1],
        billing=row[3],
        spend_limit=row[2],
        model=model,
        rates=rates_in_force(tuple(row[9:12]), tuple(row[12:15])) if model else None,
        known_request=known_request,
    )
