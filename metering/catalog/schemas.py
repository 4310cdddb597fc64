"""Shapes shared by the admin API and ``metering catalog import`` (one validation for both)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator

from metering.kit.text import Text
from metering.kit.timeutil import DateText, TimestampText

MAX_RATE = 10**12  # microcents per million tokens: $10,000 per million tokens
MAX_TOKENS_LIMIT = 2**31 - 1
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,99}$")
RESERVED_MODEL_IDS = {"unavailable"}  # the report's group for hidden models

Rate = Annotated[int, Strict(), Field(ge=0, le=MAX_RATE)]
TokenCount = Annotated[int, Strict(), Field(ge=1, le=MAX_TOKENS_LIMIT)]


def check_model_id(model_id: str) -> str | None:
    """Why ``model_id`` cannot name a model, or None when it can."""
    if not MODEL_ID.fullmatch(model_id):
        return "model ids are 1–100 characters of letters, digits and . _ : + - "
    if model_id.lower() in RESERVED_MODEL_IDS:
        return f"{model_id!r} is reserved"
    return None


class ModelSpec(BaseModel):
    """``PUT /admin/v1/models/{id}``: the whole metadata of a model."""

    model_config = ConfigDict(extra="forbid")

    display_name: Text = Field(min_length=1, max_length=200)
    owned_by: Text = Field(default="metering", min_length=1, max_length=100)
    context_length: TokenCount
    max_output_tokens: TokenCount | None = None
    reasoning_headroom_tokens: Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS_LIMIT)] = 0
    hidden: Annotated[bool, Strict()] = False
    deprecation_date: DateText | None = None

    # A field validator (not a model one) so the 400 names the field at fault.
    @field_validator("max_output_tokens")
    @classmethod
    def _output_fits_context(cls, value: int | None, info: ValidationInfo) -> int | None:
        context_length = info.data.get("context_length")
        if value is not None and context_length is not None and value > context_length:
            raise ValueError("max_output_tokens must not exceed context_length")
        return value


class PriceSpec(BaseModel):
    """A list price version: integer microcents per million tokens."""

    model_config = ConfigDict(extra="forbid")

    effective_at: TimestampText
    input_microcents_per_million: Rate
    output_microcents_per_million: Rate
    cache_read_microcents_per_million: Rate


class AccountRateSpec(BaseModel):
    """An account override version; all three rates null ends the override."""

    model_config = ConfigDict(extra="forbid")

    model: Text = Field(min_length=1, max_length=100)
    effective_at: TimestampText
    input_microcents_per_million: Rate | None
    output_microcents_per_million: Rate | None
    cache_read_microcents_per_million: Rate | None

    # Field validators (not a model one) so the 400 names the first rate that disagrees.
    @field_validator("output_microcents_per_million", "cache_read_microcents_per_million")
    @classmethod
    def _all_or_none(cls, value: int | None, info: ValidationInfo) -> int | None:
        if "input_microcents_per_million" in info.data and (value is None) != (
            info.data["input_microcents_per_million"] is None
        ):
            raise ValueError("give all three rates, or all three null to end the override")
        return value


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
