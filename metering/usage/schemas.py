"""Request bodies of the ingest and quarantine routes, and the wire shapes of their results."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

MAX_BATCH = 1000

QuarantineCode = Literal[
    "unknown_api_key",
    "model_not_found",
    "price_not_found",
    "invalid_usage",
    "invalid_timestamp",
    "idempotency_conflict",
]


class EventBatch(BaseModel):
    """``POST /v1/usage/events``. Each event is checked on its own by the service (one bad
    event never fails the batch), so they arrive here as plain JSON values."""

    model_config = ConfigDict(extra="forbid")

    # 1–1000 events: the service's rule (``batch_too_large`` above), stated by the schema.
    events: Annotated[list[Any], Field(json_schema_extra={"minItems": 1, "maxItems": MAX_BATCH})]


class ReprocessRequest(BaseModel):
    """``POST /admin/v1/quarantine/reprocess``: the entries to retry, or all of them."""

    model_config = ConfigDict(extra="forbid")

    ids: (
        Annotated[list[Annotated[int, Strict()]], Field(min_length=1, max_length=MAX_BATCH)] | None
    ) = None
