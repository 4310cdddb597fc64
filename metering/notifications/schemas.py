"""Request bodies of the webhook routes (docs/api.md#endpoints)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.json_schema import JsonDict

from metering.kit.text import Text
from metering.notifications.outbox import EVENT_TYPES

# Checked by the service (so an unknown one is 400 naming ``event_types``), listed here for the
# OpenAPI document.
EventType = Annotated[Text, WithJsonSchema({"type": "string", "enum": sorted(EVENT_TYPES)})]

Url = Field(min_length=1, max_length=2048)
# Each type once (the service refuses a repeat, naming ``event_types``; the schema says so).
UNIQUE: JsonDict = {"uniqueItems": True}
Types = Field(min_length=1, max_length=20, json_schema_extra=UNIQUE)
Description = Field(default=None, max_length=500)


class EndpointCreate(BaseModel):
    """An account key's endpoint (its own account's events)."""

    model_config = ConfigDict(extra="forbid")

    url: Text = Url
    event_types: list[EventType] = Types
    description: Text | None = Description


class AdminEndpointCreate(EndpointCreate):
    account_id: Text | None = Field(default=None, max_length=32)


class EndpointUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged.
    url: Text = Field(default=None, min_length=1, max_length=2048)  # type: ignore[assignment]
    event_types: list[EventType] = Field(
        default=None,  # type: ignore[arg-type]
        min_length=1,
        max_length=20,
        json_schema_extra=UNIQUE,
    )
    enabled: bool = Field(default=None)  # type: ignore[assignment]
    description: Text | None = Description


class Resend(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint_id: Text | None = Field(default=None, max_length=32)
