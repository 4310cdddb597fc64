"""Webhook endpoints: saved, listed, changed, rotated, tested; deliveries listed and resent.

``Scope`` is who asks: an operator (``account_id`` None: every endpoint) or an account key (its
account's endpoints only: those it made and those an operator made for it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from metering.kit.errors import InvalidRequest, NotFound
from metering.kit.ids import new_id
from metering.kit.pagination import decode_cursor, page, row_id_after
from metering.kit.timeutil import format_timestamp, parse_timestamp
from metering.models import Account, WebhookDelivery, WebhookEndpoint, WebhookEvent, table
from metering.notifications import outbox, secrets
from metering.notifications.addresses import Resolver, check_url
from metering.states import deliveries as delivery_states
from metering.states.deliveries import DeliveryStatus

DELIVERIES = table(WebhookDelivery)

# After a rotation, the previous secret signs too for this long.
ROTATION_OVERLAP = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Scope:
    account_id: str | None  # None: an operator

    @property
    def operator(self) -> bool:
        return self.account_id is None


@dataclass(frozen=True, slots=True)
class Rules:
    """What saving a URL is checked against, and the keys secrets are sealed with."""

    allow_private: bool
    resolver: Resolver
    secret_keys: Sequence[str]


def check_types(types: Sequence[str], scope: Scope) -> list[str]:
    unknown = sorted(set(types) - outbox.EVENT_TYPES)
    if unknown:
        raise InvalidRequest(
            f"unknown event type {unknown[0][:64]!r}; known: "
            f"{', '.join(sorted(outbox.EVENT_TYPES))}",
            param="event_types",
        )
    repeated = sorted({t for t in types if types.count(t) > 1})
    if repeated:
        raise InvalidRequest(
            f"event type {repeated[0]!r} is listed more than once", param="event_types"
        )
    if not scope.operator:
        private = sorted(set(types) & outbox.OPERATOR_ONLY)
        if private:
            raise InvalidRequest(
                f"event type {private[0]!r} is for operators only", param="event_types"
            )
    return sorted(set(types))


def endpoint_body(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {
        "id": endpoint.id,
        "object": "webhook_endpoint",
        "url": endpoint.url,
        "event_types": json.loads(endpoint.event_types),
        "account_id": endpoint.account_id,
        "enabled": endpoint.enabled,
        "description": endpoint.description,
        "created_at": format_timestamp(endpoint.created_at),
    }


def create_endpoint(
    session: Session,
    scope: Scope,
    rules: Rules,
    *,
    url: str,
    event_types: Sequence[str],
    account_id: str | None,
    description: str | None,
    now: datetime,
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its secret (in clear here only; stored sealed)."""
    if not scope.operator:
        account_id = scope.account_id
    elif account_id is not None and session.get(Account, account_id) is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    types = check_types(event_types, scope)
    check_url(url, rules.allow_private, rules.resolver)
    endpoint_id = new_id("whep")
    secret = secrets.new_secret()
    endpoint = WebhookEndpoint(
        id=endpoint_id,
        account_id=account_id,
        url=url,
        event_types=json.dumps(types),
        enabled=True,
        description=description,
        secret_sealed=secrets.seal(rules.secret_keys, secret, endpoint_id),
        created_at=now,
    )
    session.add(endpoint)
    session.flush()
    return endpoint, secret


def get_endpoint(session: Session, scope: Scope, endpoint_id: str) -> WebhookEndpoint:
    query = select(WebhookEndpoint).where(
        WebhookEndpoint.id == endpoint_id, WebhookEndpoint.deleted_at.is_(None)
    )
    if not scope.operator:
        query = query.where(WebhookEndpoint.account_id == scope.account_id)
    endpoint = session.execute(query).scalar_one_or_none()
    if endpoint is None:
        raise NotFound(f"no webhook endpoint {endpoint_id}", param="endpoint_id")
    return endpoint


def list_endpoints(session: Session, scope: Scope, limit: int, after: str | None) -> dict[str, Any]:
    query = (
        select(WebhookEndpoint)
        .where(WebhookEndpoint.deleted_at.is_(None))
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
        .limit(limit + 1)
    )
    if not scope.operator:
        query = query.where(WebhookEndpoint.account_id == scope.account_id)
    if after:
        created, last_id = decode_cursor(after, 2)
        created_at = parse_timestamp(created, "after")
        query = query.where(
            or_(
                WebhookEndpoint.created_at > created_at,
                and_(WebhookEndpoint.created_at == created_at, WebhookEndpoint.id > str(last_id)),
            )
        )
    rows = session.execute(query).scalars().all()
    return page(rows, limit, endpoint_body, lambda e: (format_timestamp(e.created_at), e.id))


def update_endpoint(
    session: Session, scope: Scope, rules: Rules, endpoint_id: str, changes: dict[str, Any]
) -> tuple[WebhookEndpoint, dict[str, Any]]:
    """Apply the given fields; returns the endpoint and what changed."""
    endpoint = get_endpoint(session, scope, endpoint_id)
    before = endpoint_body(endpoint)
    if "url" in changes:
        endpoint.url = check_url(changes["url"], rules.allow_private, rules.resolver)
    if "event_types" in changes:
        endpoint.event_types = json.dumps(check_types(changes["event_types"], scope))
    if "enabled" in changes:
        endpoint.enabled = bool(changes["enabled"])
    if "description" in changes:
        endpoint.description = changes["description"]
    session.flush()
    after = endpoint_body(endpoint)
    return endpoint, {k: after[k] for k in after if after[k] != before[k]}


def delete_endpoint(session: Session, scope: Scope, endpoint_id: str, now: datetime) -> int:
    """Delete an endpoint; its undelivered messages are dropped (returns how many)."""
    endpoint = get_endpoint(session, scope, endpoint_id)
    endpoint.deleted_at = now
    dropped = update(WebhookDelivery).where(
        WebhookDelivery.endpoint_id == endpoint.id, delivery_states.pending(DELIVERIES)
    )
    if endpoint.account_id is not None:  # its account's only (on Citus, that account's shard)
        dropped = dropped.where(WebhookDelivery.account_id == endpoint.account_id)
    result = session.execute(
        dropped.values(status=delivery_states.target("drop"), next_attempt_at=None)
    )
    session.flush()
    return int(result.rowcount)  # type: ignore[attr-defined]


def rotate_secret(
    session: Session, scope: Scope, rules: Rules, endpoint_id: str, now: datetime
) -> tuple[WebhookEndpoint, str]:
    """A new secret; the one it replaces keeps signing (beside it) for 24 hours."""
    endpoint = get_endpoint(session, scope, endpoint_id)
    secret = secrets.new_secret()
    # Re-sealed with the first key: a rotation also moves the old secret to the newest key.
    previous = secrets.open_sealed(rules.secret_keys, endpoint.secret_sealed, endpoint.id)
    endpoint.previous_secret_sealed = secrets.seal(rules.secret_keys, previous, endpoint.id)
    endpoint.previous_until = now + ROTATION_OVERLAP
    endpoint.secret_sealed = secrets.seal(rules.secret_keys, secret, endpoint.id)
    session.flush()
    return endpoint, secret


def signing_secrets(keys: Sequence[str], endpoint: Any, now: datetime) -> list[str]:
    """The secrets in force for an endpoint row at ``now``: the newest, and the previous one
    within 24 hours of a rotation."""
    found = [secrets.open_sealed(keys, endpoint.secret_sealed, endpoint.id)]
    if (
        endpoint.previous_secret_sealed
        and endpoint.previous_until
        and now < endpoint.previous_until
    ):
        found.append(secrets.open_sealed(keys, endpoint.previous_secret_sealed, endpoint.id))
    return found


def send_test(session: Session, scope: Scope, endpoint_id: str, now: datetime) -> dict[str, Any]:
    """A ``webhook.test`` event for this endpoint only (delivered by the loop, like any)."""
    endpoint = get_endpoint(session, scope, endpoint_id)
    # Its one delivery is made here, not by the fan-out.
    event_public_id = outbox.emit(
        session, outbox.TEST, endpoint.account_id, {}, now, dispatched=True
    )
    event = session.execute(
        select(WebhookEvent).where(
            WebhookEvent.account_id == outbox.stored_account(endpoint.account_id),
            WebhookEvent.public_id == event_public_id,
        )
    ).scalar_one()
    _schedule(session, event, endpoint, now)
    session.flush()
    return event_body(event)


def _schedule(
    session: Session, event: WebhookEvent, endpoint: WebhookEndpoint, now: datetime
) -> None:
    """The event's delivery to the endpoint, made or made due again (as new). Core statements
    that name the account: on Citus each goes to the account's shard alone (the mapper knows
    the rows by ``id`` only)."""
    again = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.account_id == event.account_id,
            WebhookDelivery.event_id == event.id,
            WebhookDelivery.endpoint_id == endpoint.id,
        )
        .values(
            status=delivery_states.target("resend"),
            attempts=0,
            next_attempt_at=now,
            delivered_at=None,
        )
    )
    if again.rowcount == 0:  # type: ignore[attr-defined]
        session.add(
            WebhookDelivery(
                event_id=event.id,
                endpoint_id=endpoint.id,
                account_id=event.account_id,
                status=DeliveryStatus.PENDING.value,
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
        )


def event_body(event: WebhookEvent) -> dict[str, Any]:
    from metering.notifications.messages import render_data

    return {
        "id": event.public_id,
        "object": "webhook_event",
        "type": event.type,
        "account_id": outbox.shown_account(event.account_id),
        "created_at": format_timestamp(event.created_at),
        "data": render_data(outbox.shown_account(event.account_id), event.data),
    }


def resend(
    session: Session, event_public_id: str, endpoint_id: str | None, now: datetime
) -> dict[str, Any]:
    """Send an event again: to one endpoint, or to every endpoint it went to."""
    event = session.execute(
        select(WebhookEvent).where(WebhookEvent.public_id == event_public_id)
    ).scalar_one_or_none()
    if event is None:
        raise NotFound(f"no webhook event {event_public_id}", param="event_id")
    operator = Scope(None)
    if endpoint_id is not None:
        endpoint = get_endpoint(session, operator, endpoint_id)
        if endpoint.account_id not in (None, outbox.shown_account(event.account_id)):
            raise InvalidRequest(
                "that endpoint does not receive this event's account", param="endpoint_id"
            )
        targets = [endpoint]
    else:
        targets = list(
            session.execute(
                select(WebhookEndpoint)
                .join(WebhookDelivery, WebhookDelivery.endpoint_id == WebhookEndpoint.id)
                .where(
                    WebhookDelivery.account_id == event.account_id,
                    WebhookDelivery.event_id == event.id,
                    WebhookEndpoint.deleted_at.is_(None),
                )
                .order_by(WebhookEndpoint.id)
            ).scalars()
        )
    for endpoint in targets:
        _schedule(session, event, endpoint, now)
    session.flush()
    return {**event_body(event), "endpoint_ids": [e.id for e in targets]}


def delivery_body(delivery: Any) -> dict[str, Any]:
    return {
        "id": str(delivery.id),
        "object": "webhook_delivery",
        "endpoint_id": delivery.endpoint_id,
        "event_id": delivery.public_id,
        "type": delivery.type,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "last_status": delivery.last_status,
        "last_error": delivery.last_error,
        "last_attempt_at": _stamp(delivery.last_attempt_at),
        "next_attempt_at": (
            _stamp(delivery.next_attempt_at)
            if delivery_states.is_pending(delivery.status)
            else None
        ),
        "delivered_at": _stamp(delivery.delivered_at),
        "created_at": format_timestamp(delivery.created_at),
    }


def _stamp(value: datetime | None) -> str | None:
    return None if value is None else format_timestamp(value)


def list_deliveries(
    session: Session, scope: Scope, endpoint_id: str, limit: int, after: str | None
) -> dict[str, Any]:
    """An endpoint's deliveries, newest first."""
    endpoint = get_endpoint(session, scope, endpoint_id)
    query = (
        select(
            WebhookDelivery.id,
            WebhookDelivery.endpoint_id,
            WebhookDelivery.status,
            WebhookDelivery.attempts,
            WebhookDelivery.last_status,
            WebhookDelivery.last_error,
            WebhookDelivery.last_attempt_at,
            WebhookDelivery.next_attempt_at,
            WebhookDelivery.delivered_at,
            WebhookDelivery.created_at,
            WebhookEvent.public_id,
            WebhookEvent.type,
        )
        .join(
            WebhookEvent,
            # The account first: on Citus, a join of colocated shards.
            (WebhookEvent.account_id == WebhookDelivery.account_id)
            & (WebhookEvent.id == WebhookDelivery.event_id),
        )
        .where(WebhookDelivery.endpoint_id == endpoint.id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit + 1)
    )
    if endpoint.account_id is not None:
        query = query.where(WebhookDelivery.account_id == endpoint.account_id)
    if after:
        query = query.where(WebhookDelivery.id < row_id_after(after))
    rows = session.execute(query).all()
    return page(rows, limit, delivery_body, lambda row: (row.id,))
