"""A message as it is sent: the Standard Webhooks body and headers of an event."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from metering.kit import jsonenc
from metering.kit.money import cents
from metering.kit.timeutil import format_timestamp
from metering.notifications import secrets

MAX_BODY_BYTES = 64 * 1024
MICRO = "_microcents"


def render_data(account_id: str | None, stored: str) -> dict[str, Any]:
    """The event's ``data``: ``account_id`` first, then the stored fields, each integer
    ``*_microcents`` amount shown as ``*_cents`` (exact decimal) beside its exact value."""
    data: dict[str, Any] = {"account_id": account_id}
    for name, value in json.loads(stored).items():
        if name.endswith(MICRO) and isinstance(value, int) and not isinstance(value, bool):
            data[name[: -len(MICRO)] + "_cents"] = cents(value)
        data[name] = value
    return data


def body(public_id: str, type_: str, account_id: str | None, stored: str, at: datetime) -> bytes:
    """The JSON body (the same bytes on every attempt of every endpoint)."""
    return jsonenc.dumps(
        {
            "id": public_id,
            "type": type_,
            "created_at": format_timestamp(at),
            "data": render_data(account_id, stored),
        }
    )


def headers(public_id: str, payload: bytes, signing: list[str], now: datetime) -> dict[str, str]:
    timestamp = int(now.timestamp())
    return {
        "content-type": "application/json",
        "user-agent": "metering-webhooks/1",
        "webhook-id": public_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": secrets.signature_header(signing, public_id, timestamp, payload),
    }
