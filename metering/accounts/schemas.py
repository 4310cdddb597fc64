"""Request bodies for accounts and keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from metering.accounts.windows import SpendWindow
from metering.kit.money import LimitCentsInput
from metering.kit.text import Text

Name = Field(min_length=1, max_length=200)
# A model id as given (case-insensitive; checked against the catalog by the service).
ModelName = Annotated[Text, Field(min_length=1, max_length=200)]
# At most this many models in one list; requests in flight at most this many.
ModelList = Annotated[list[ModelName], Field(max_length=1000)]
ConcurrencyLimit = Annotated[int, Strict(), Field(ge=1, le=1_000_000)]


class AccountCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    billing: Literal["prepaid", "unbilled"] = "prepaid"


class AccountUpdate(BaseModel):
    """``PATCH /admin/v1/accounts/{id}``: omitted fields are unchanged."""

    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged (null is no name: refused).
    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    # null: no limit on requests in flight.
    max_concurrent_requests: ConcurrencyLimit | None = None
    # Null clears it (no credit.balance_low).
    low_balance_threshold_cents: LimitCentsInput | None = None


class ModelAccess(BaseModel):
    """``PUT /admin/v1/accounts/{id}/model-access``: null = every catalog model."""

    model_config = ConfigDict(extra="forbid")

    models: ModelList | None


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    # Cents with at most 6 decimals; null = no limit. Parsed exactly by ``parse_cents``.
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
    # The older form: the limit per month (not with the two above).
    monthly_spend_limit_cents: LimitCentsInput | None = None
    # null: every model of the key's account.
    allowed_models: ModelList | None = None


class ApiKeyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged (null is no name: refused).
    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
    monthly_spend_limit_cents: LimitCentsInput | None = None
    allowed_models: ModelList | None = None
