"""What crosses the wire: an authorization (a hold) and a usage event."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from metering_client.usage import APIS, Api

Outcome = Literal["completed", "failed"]
OUTCOMES = ("completed", "failed")

# Metering keys an event by its request id within the account: 1–64 of these characters. An
# event with another id cannot be keyed and would be dropped by ingest, so it is refused here.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,64}")


def new_request_id() -> str:
    """A request id for a request the caller has none for (128 random bits)."""
    return uuid.uuid4().hex


def check_request_id(request_id: str) -> str:
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        raise ValueError(
            f"request_id must be 1-64 characters of A-Z a-z 0-9 . _ : -, not {request_id!r}"
        )
    return request_id


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with ``Z`` (an aware datetime; a naive one is refused)."""
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class UsageEvent:
    """One request's usage, as ``POST /v1/usage/events`` takes it."""

    request_id: str
    api_key_id: str
    model: str
    api: Api
    usage: Mapping[str, Any]
    occurred_at: datetime
    outcome: Outcome = "completed"
    authorization_id: str | None = None

    def __post_init__(self) -> None:
        check_request_id(self.request_id)
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {self.api!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be completed or failed, not {self.outcome!r}")
        if not isinstance(self.usage, Mapping):
            raise ValueError("usage must be the usage object the API returned")
        format_timestamp(self.occurred_at)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "request_id": self.request_id,
            "api_key_id": self.api_key_id,
            "model": self.model,
            "api": self.api,
            "usage": dict(self.usage),
            "occurred_at": format_timestamp(self.occurred_at),
            "outcome": self.outcome,
        }
        if self.authorization_id is not None:
            body["authorization_id"] = self.authorization_id
        return body


@dataclass(frozen=True)
class Authorization:
    """A granted request: its hold (``id``), and what its usage event needs.

    ``provisional`` authorizations were granted by the ``allow`` policy while metering could not
    be reached: no hold was placed (``id`` is None), the usage is recorded all the same."""

    id: str | None
    request_id: str
    api_key_id: str
    model: str
    api: Api
    received_at: datetime
    account_id: str | None = None
    max_tokens: int | None = None
    estimate_microcents: int | None = None
    expires_at: str | None = None
    provisional: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def usage_event(
        self,
        usage: Mapping[str, Any],
        *,
        outcome: Outcome = "completed",
        occurred_at: datetime | None = None,
    ) -> UsageEvent:
        """The usage event of this request (``occurred_at``: when the request was received)."""
        return UsageEvent(
            request_id=self.request_id,
            api_key_id=self.api_key_id,
            model=self.model,
            api=self.api,
            usage=usage,
            occurred_at=occurred_at or self.received_at,
            outcome=outcome,
            authorization_id=self.id,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe summary (to carry through a gateway's request metadata)."""
        return {
            "id": self.id,
            "request_id": self.request_id,
            "api_key_id": self.api_key_id,
            "model": self.model,
            "api": self.api,
            "received_at": format_timestamp(self.received_at),
            "account_id": self.account_id,
            "max_tokens": self.max_tokens,
            "estimate_microcents": self.estimate_microcents,
            "expires_at": self.expires_at,
            "provisional": self.provisional,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Authorization:
        return cls(
            id=data["id"],
            request_id=data["request_id"],
            api_key_id=data["api_key_id"],
            model=data["model"],
            api=data["api"],
            received_at=parse_timestamp(data["received_at"]),
            account_id=data.get("account_id"),
            max_tokens=data.get("max_tokens"),
            estimate_microcents=data.get("estimate_microcents"),
            expires_at=data.get("expires_at"),
            provisional=bool(data.get("provisional", False)),
        )
