"""Shapes shared by the admin API and ``metering catalog import`` (one validation for both)."""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

MAX_RATE = 10**12  # microcents per million tokens: $10,000 per million tokens
MAX_TOKENS_LIMIT = 2**31 - 1
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,99}$")
RESERVED_MODEL_IDS = {"unavailable"}  # the report's group for hidden models

Rate = Annotated[int, Strict(), Field(ge=0, le=MAX_RATE)]
TokenCount = Annotated[int, Strict(), Field(ge=1, le=MAX_TOKENS_LIMIT)]


def check_model_id(model_id: str) -> str | None:
    """Why ``model_id`` cannot name a model, or None when it can."""
    if not MODEL_ID.match(model_id):
        return "model ids are 1–100 characters of letters, digits and . _ : + - "
    if model_id.lower() in RESERVED_MODEL_IDS:
        return f"{model_id!r} is reserved"
    return None


class ModelSpec(BaseModel):
    """``PUT /admin/v1/models/{id}``: the whole metadata of a model."""

    model_config = ConfigDict(extra="forbid")

    display_name: str = Field(min_length=1, max_length=200)
    owned_by: str = Field(default="metering", min_length=1, max_length=100)
    context_length: TokenCount
    max_output_tokens: TokenCount | None = None
    reasoning_headroom_tokens: Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS_LIMIT)] = 0
    hidden: Annotated[bool, Strict()] = False
    deprecation_date: date | None = None

    @model_validator(mode="after")
    def _output_fits_context(self) -> ModelSpec:
        if self.max_output_tokens is not None and self.max_output_tokens > self.context_length:
            raise ValueError("max_output_tokens must not exceed context_length")
        return self


class PriceSpec(BaseModel):
    """A list price version: integer microcents per million tokens."""

    model_config = ConfigDict(extra="forbid")

    effective_at: str
    input_microcents_per_million: Rate
    output_microcents_per_million: Rate
    cache_read_microcents_per_million: Rate


class AccountRateSpec(BaseModel):
    """An account override version; all three rates null ends the override."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=100)
    effective_at: str
    input_microcents_per_million: Rate | None
    output_microcents_per_million: Rate | None
    cache_read_microcents_per_million: Rate | None

    @model_validator(mode="after")
    def _all_or_none(self) -> AccountRateSpec:
        rates = (
            self.input_microcents_per_million,
            self.output_microcents_per_million,
            self.cache_read_microcents_per_million,
        )
        if any(r is None for r in rates) and not all(r is None for r in rates):
            raise ValueError("give all three rates, or all three null to end the override")
        return self

    @property
    def ends_override(self) -> bool:
        return self.input_microcents_per_million is None


class CatalogModelEntry(ModelSpec):
    """One model of a catalog file: its metadata and its price history."""

    id: str
    prices: list[PriceSpec] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        problem = check_model_id(value)
        if problem:
            raise ValueError(problem)
        return value


class CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[CatalogModelEntry]
