"""Request bodies for accounts and keys."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from metering.kit.money import LimitCentsInput
from metering.kit.text import Text

Name = Field(min_length=1, max_length=200)


class AccountCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    billing: Literal["prepaid", "unbilled"] = "prepaid"


class AccountUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged (null is no name: refused).
    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    # §11: null clears it (no credit.balance_low).
    low_balance_threshold_cents: LimitCentsInput | None = None


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    # Cents with at most 6 decimals; null = no limit. Parsed exactly by ``parse_cents``.
    monthly_spend_limit_cents: LimitCentsInput | None = None


class ApiKeyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged (null is no name: refused).
    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    monthly_spend_limit_cents: LimitCentsInput | None = None
