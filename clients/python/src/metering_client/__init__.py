"""metering-client: the gateway's side of metering.

``authorize`` before the model runs, ``void`` when it never ran, ``record`` its usage (batched in
the background, kept in a durable spool while metering is away), and every refusal as the error
an OpenAI or Anthropic client expects. See README.md.
"""

from metering_client.aio import AsyncMeteringClient
from metering_client.client import ClientSettings, MeteringClient
from metering_client.errors import (
    ERROR_CLASSES,
    ConcurrencyLimitExceeded,
    InsufficientCredits,
    InvalidApiKey,
    MeteringError,
    MeteringUnavailable,
    MissingApiKey,
    ModelNotAllowed,
    ModelNotFound,
    Rendering,
)
from metering_client.records import Authorization, UsageEvent, new_request_id
from metering_client.sender import SenderSettings
from metering_client.usage import (
    MissingUsage,
    UsageCollector,
    usage_from_response,
    usage_from_stream,
)

__all__ = [
    "ERROR_CLASSES",
    "AsyncMeteringClient",
    "Authorization",
    "ClientSettings",
    "ConcurrencyLimitExceeded",
    "InsufficientCredits",
    "InvalidApiKey",
    "MeteringClient",
    "MeteringError",
    "MeteringUnavailable",
    "MissingApiKey",
    "MissingUsage",
    "ModelNotAllowed",
    "ModelNotFound",
    "Rendering",
    "SenderSettings",
    "UsageCollector",
    "UsageEvent",
    "new_request_id",
    "usage_from_response",
    "usage_from_stream",
]
