"""Request bodies of the webhook routes (§11)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from metering.kit.text import Text

Url = Field(min_length=1, max_length=2048)
Types = Field(min_length=1, max_length=20)
Description = Field(default=None, max_length=500)


class EndpointCreate(BaseModel):
    """An account key's endpoint (its own account's events)."""

    model_config = ConfigDict(extra="forbid")

    url: Text = Url
    event_types: list[Text] = Types
    description: Text | None = Description


class AdminEndpointCreate(EndpointCreate):
    account_id: Text | None = Field(default=None, max_length=32)


class EndpointUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged.
    url: Text = Field(default=None, min_length=1, max_length=2048)  # type: ignore[assignment]
    event_types: list[Text] = Field(default=None, min_length=1, max_length=20)  # type: ignore[arg-type]
    enabled: bool = Field(default=None)  # type: ignore[assignment]
    description: Text | None = Description


class Resend(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint_id: Text | None = Field(default=None, max_length=32)
