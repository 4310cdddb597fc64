"""Every change to a webhook endpoint, with its audit event in the same transaction.

Operators (``/admin/v1/``), account keys (``/v1/webhook-endpoints``) and the portal's forms all
change endpoints through these functions, so each change is recorded once, the same way,
whoever makes it; the caller's ``Auditor`` says who (a token's name, ``key_…`` or
``portal:<acct_…>``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from metering.audit.service import Auditor
from metering.models import WebhookEndpoint
from metering.notifications import service
from metering.notifications.service import Rules, Scope

ENDPOINT = "webhook_endpoint"


def create(
    session: Session,
    auditor: Auditor,
    scope: Scope,
    rules: Rules,
    *,
    url: str,
    event_types: Sequence[str],
    account_id: str | None,
    description: str | None,
    now: datetime,
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its signing secret (the secret is redacted in the audit event)."""
    endpoint, secret = service.create_endpoint(
        session,
        scope,
        rules,
        url=url,
        event_types=event_types,
        account_id=account_id,
        description=description,
        now=now,
    )
    shown = service.endpoint_body(endpoint)
    changes = {k: shown[k] for k in ("url", "event_types", "account_id", "description")}
    auditor.record(
        session, now, "webhook_endpoint.create", ENDPOINT, endpoint.id, endpoint.account_id,
        {**changes, "secret": secret},
    )  # fmt: skip
    return endpoint, secret


def update(
    session: Session,
    auditor: Auditor,
    scope: Scope,
    rules: Rules,
    endpoint_id: str,
    changes: dict[str, Any],
    now: datetime,
) -> WebhookEndpoint:
    """Change an endpoint's fields; a change that changes nothing records nothing."""
    endpoint, changed = service.update_endpoint(session, scope, rules, endpoint_id, changes)
    if changed:
        auditor.record(
            session, now, "webhook_endpoint.update", ENDPOINT, endpoint.id, endpoint.account_id,
            changed,
        )  # fmt: skip
    return endpoint


def delete(
    session: Session, auditor: Auditor, scope: Scope, endpoint_id: str, now: datetime
) -> WebhookEndpoint:
    """Delete an endpoint; its undelivered messages are dropped (their count is recorded)."""
    endpoint = service.get_endpoint(session, scope, endpoint_id)
    dropped = service.delete_endpoint(session, scope, endpoint_id, now)
    auditor.record(
        session, now, "webhook_endpoint.delete", ENDPOINT, endpoint.id, endpoint.account_id,
        {"deleted_at": now, "dropped_messages": dropped},
    )  # fmt: skip
    return endpoint


def rotate(
    session: Session, auditor: Auditor, scope: Scope, rules: Rules, endpoint_id: str, now: datetime
) -> tuple[WebhookEndpoint, str]:
    """A new signing secret; the old one still signs for 24 hours."""
    endpoint, secret = service.rotate_secret(session, scope, rules, endpoint_id, now)
    auditor.record(
        session, now, "webhook_endpoint.rotate", ENDPOINT, endpoint.id, endpoint.account_id,
        {"secret": secret, "previous_until": endpoint.previous_until},
    )  # fmt: skip
    return endpoint, secret


def send_test(
    session: Session, auditor: Auditor, scope: Scope, endpoint_id: str, now: datetime
) -> dict[str, Any]:
    """Queue a ``webhook.test`` event for the endpoint."""
    event = service.send_test(session, scope, endpoint_id, now)
    auditor.record(
        session, now, "webhook_endpoint.test", "webhook_event", event["id"], event["account_id"],
        {"endpoint_id": endpoint_id},
    )  # fmt: skip
    return event


def resend(
    session: Session, auditor: Auditor, event_id: str, endpoint_id: str | None, now: datetime
) -> dict[str, Any]:
    """Send an event again (operators only)."""
    result = service.resend(session, event_id, endpoint_id, now)
    auditor.record(
        session, now, "webhook_event.resend", "webhook_event", result["id"],
        result["account_id"], {"endpoint_ids": result["endpoint_ids"]},
    )  # fmt: skip
    return result
