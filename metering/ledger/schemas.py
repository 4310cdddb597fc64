"""Request bodies for credits (admin) and pre-flight authorizations (gateway)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from metering.kit.money import CentsInput, PositiveCentsInput
from metering.kit.text import Text
from metering.kit.timeutil import TimestampText
from metering.pricing import MAX_TOKEN_COUNT

# The characters of a request id (docs/api.md#post-v1authorizations), so a hold and its usage event
# can name each other.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:\-]{1,64}$"
# The inference API's own ceiling on ``n``; far enough below any overflow of an estimate.
MAX_CHOICES = 128
# A hold lives at most a week.
MAX_HOLD_TTL_SECONDS = 604_800

IdempotencyKey = Annotated[Text, Field(min_length=1, max_length=200)]
# Signs and positivity are the estimate's rules (metering.pricing, which names the field); the
# upper bounds here only keep absurd integers (10**30) out of 32-bit columns.
BoundedCount = Annotated[int, Strict(), Field(le=MAX_TOKEN_COUNT)]


class GrantCreate(BaseModel):
    """``POST /admin/v1/accounts/{id}/grants``: prepaid credit, in cents (> 0, ≤ 6 decimals)."""

    model_config = ConfigDict(extra="forbid")

    amount_cents: PositiveCentsInput
    idempotency_key: IdempotencyKey
    note: Text | None = Field(default=None, max_length=2000)
    # Paid (default) or promotional; priority 0–100, lower spent first (default 10 for
    # promotional, 50 for paid); expires_at later than now (checked by the route), or never.
    category: Literal["paid", "promotional"] = "paid"
    priority: Annotated[int, Strict(), Field(ge=0, le=100)] | None = None
    expires_at: TimestampText | None = None


class GrantVoid(BaseModel):
    """``POST /admin/v1/grants/{id}/void``: forfeit a grant's remainder at once."""

    model_config = ConfigDict(extra="forbid")

    reason: Text | None = Field(default=None, max_length=2000)


class AdjustmentCreate(BaseModel):
    """``POST /admin/v1/accounts/{id}/adjustments``: a signed correction, in cents (≠ 0)."""

    model_config = ConfigDict(extra="forbid")

    amount_cents: CentsInput
    idempotency_key: IdempotencyKey
    reason: Text = Field(min_length=1, max_length=2000)


class AuthorizationCreate(BaseModel):
    """``POST /v1/authorizations`` (docs/api.md#post-v1authorizations). ``api_key`` is optional
    here so that a missing key is a 401 ``missing_api_key``, not a 400."""

    model_config = ConfigDict(extra="forbid")

    api_key: str | None = None
    request_id: str | None = Field(default=None, pattern=REQUEST_ID_PATTERN)
    model: Text = Field(min_length=1, max_length=200)
    api: Literal["chat_completions", "responses", "messages"]
    # The lower bounds are the estimate's rules; the schema states them as well.
    prompt_tokens: Annotated[BoundedCount, Field(json_schema_extra={"minimum": 0})]
    max_tokens: Annotated[BoundedCount, Field(json_schema_extra={"minimum": 1})] | None = None
    n: Annotated[int, Strict(), Field(le=MAX_CHOICES, json_schema_extra={"minimum": 1})] = 1
    reasoning: Annotated[bool, Strict()] = False
    # The hold's lifetime (default METERING_HOLD_TTL_SECONDS); compared for idempotency.
    hold_ttl_seconds: Annotated[int, Strict(), Field(ge=1, le=MAX_HOLD_TTL_SECONDS)] | None = None
