"""Webhook routes (docs/api.md#endpoints): operators under /admin/v1/, account keys under /v1/
(their account's endpoints only, with the same bodies less ``account_id``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from metering.accounts.deps import AccountKeyDep
from metering.accounts.keys import KeyPrincipal
from metering.audit.deps import AuditDep
from metering.audit.service import Auditor
from metering.kit.pagination import PageParams
from metering.notifications import changes, delivery, service
from metering.notifications.addresses import system_resolver
from metering.notifications.schemas import (
    AdminEndpointCreate,
    EndpointCreate,
    EndpointUpdate,
    Resend,
)
from metering.notifications.service import Rules, Scope
from metering.web.deps import AdminDep, NowDep, SessionDep, get_settings
from metering.web.jsonio import MeteringRoute
from metering.web.middleware import request_id_of

admin_router = APIRouter(
    prefix="/admin/v1",
    route_class=MeteringRoute,
    dependencies=[AdminDep],
    tags=["admin: webhooks"],
)
router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["webhooks"])

OPERATOR = Scope(None)
assert delivery.DELIVERIES_TOTAL  # its /metrics gauges are registered with the app


def rules_of(request: Request) -> Rules:
    settings = get_settings(request)
    # Tests inject a resolver here (metering.notifications.addresses.Resolver).
    resolver = getattr(request.app.state, "webhook_resolver", None) or system_resolver
    return Rules(settings.webhooks_may_reach_private, resolver, settings.secret_key)


def _created(endpoint: Any, secret: str) -> dict[str, Any]:
    return {**service.endpoint_body(endpoint), "secret": secret}


def key_auditor(request: Request, key: KeyPrincipal) -> Auditor:
    """An account key's changes are recorded as made by that key (the ``key_…`` actor)."""
    return Auditor(key.api_key_id, request_id_of(request.scope))


# -- operators -----------------------------------------------------------------------------------


@admin_router.post("/webhook-endpoints", status_code=201)
def admin_create_endpoint(
    body: AdminEndpointCreate, request: Request, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Add a webhook endpoint (account_id null: every account's events and operator-only ones);
    its signing secret is in this response only."""
    endpoint, secret = changes.create(
        session,
        audit,
        OPERATOR,
        rules_of(request),
        url=body.url,
        event_types=body.event_types,
        account_id=body.account_id,
        description=body.description,
        now=now,
    )
    return _created(endpoint, secret)


@admin_router.get("/webhook-endpoints")
def admin_list_endpoints(session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """List webhook endpoints, oldest first."""
    return service.list_endpoints(session, OPERATOR, *paging)


@admin_router.get("/webhook-endpoints/{endpoint_id}")
def admin_get_endpoint(endpoint_id: str, session: SessionDep) -> dict[str, Any]:
    """One webhook endpoint (never its secret)."""
    return service.endpoint_body(service.get_endpoint(session, OPERATOR, endpoint_id))


@admin_router.patch("/webhook-endpoints/{endpoint_id}")
def admin_update_endpoint(
    endpoint_id: str,
    body: EndpointUpdate,
    request: Request,
    session: SessionDep,
    now: NowDep,
    audit: AuditDep,
) -> dict[str, Any]:
    """Change an endpoint's url, event types, enabled flag or description."""
    fields = {k: getattr(body, k) for k in body.model_fields_set}
    endpoint = changes.update(session, audit, OPERATOR, rules_of(request), endpoint_id, fields, now)
    return service.endpoint_body(endpoint)


@admin_router.delete("/webhook-endpoints/{endpoint_id}")
def admin_delete_endpoint(
    endpoint_id: str, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Delete an endpoint; its undelivered messages are dropped."""
    endpoint = changes.delete(session, audit, OPERATOR, endpoint_id, now)
    return {"id": endpoint.id, "object": "webhook_endpoint", "deleted": True}


@admin_router.post("/webhook-endpoints/{endpoint_id}/rotate-secret")
def admin_rotate_secret(
    endpoint_id: str, request: Request, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """A new signing secret (shown once); messages carry both signatures for 24 hours."""
    return _created(*changes.rotate(session, audit, OPERATOR, rules_of(request), endpoint_id, now))


@admin_router.post("/webhook-endpoints/{endpoint_id}/test")
def admin_test_endpoint(
    endpoint_id: str, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Send a ``webhook.test`` event to this endpoint (by the delivery loop, within seconds)."""
    return changes.send_test(session, audit, OPERATOR, endpoint_id, now)


@admin_router.get("/webhook-endpoints/{endpoint_id}/deliveries")
def admin_list_deliveries(
    endpoint_id: str, session: SessionDep, paging: PageParams
) -> dict[str, Any]:
    """An endpoint's deliveries (attempts, last status or error, next attempt), newest first."""
    return service.list_deliveries(session, OPERATOR, endpoint_id, *paging)


@admin_router.post("/webhook-events/{event_id}/resend")
def admin_resend_event(
    event_id: str, body: Resend, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Send an event again, to one endpoint or to every endpoint it went to."""
    return changes.resend(session, audit, event_id, body.endpoint_id, now)


# -- account keys (their changes audited as the key) -------------------------------------------


@router.post("/webhook-endpoints", status_code=201)
def create_endpoint(
    body: EndpointCreate, request: Request, key: AccountKeyDep, session: SessionDep, now: NowDep
) -> dict[str, Any]:
    """Add a webhook endpoint for your account's events; its secret is in this response only."""
    endpoint, secret = changes.create(
        session,
        key_auditor(request, key),
        Scope(key.account_id),
        rules_of(request),
        url=body.url,
        event_types=body.event_types,
        account_id=None,
        description=body.description,
        now=now,
    )
    return _created(endpoint, secret)


@router.get("/webhook-endpoints")
def list_endpoints(key: AccountKeyDep, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """List your account's webhook endpoints, oldest first."""
    return service.list_endpoints(session, Scope(key.account_id), *paging)


@router.get("/webhook-endpoints/{endpoint_id}")
def get_endpoint(endpoint_id: str, key: AccountKeyDep, session: SessionDep) -> dict[str, Any]:
    """One of your account's webhook endpoints."""
    return service.endpoint_body(service.get_endpoint(session, Scope(key.account_id), endpoint_id))


@router.patch("/webhook-endpoints/{endpoint_id}")
def update_endpoint(
    endpoint_id: str,
    body: EndpointUpdate,
    request: Request,
    key: AccountKeyDep,
    session: SessionDep,
    now: NowDep,
) -> dict[str, Any]:
    """Change an endpoint's url, event types, enabled flag or description."""
    fields = {k: getattr(body, k) for k in body.model_fields_set}
    endpoint = changes.update(
        session, key_auditor(request, key), Scope(key.account_id), rules_of(request),
        endpoint_id, fields, now,
    )  # fmt: skip
    return service.endpoint_body(endpoint)


@router.delete("/webhook-endpoints/{endpoint_id}")
def delete_endpoint(
    endpoint_id: str, request: Request, key: AccountKeyDep, session: SessionDep, now: NowDep
) -> dict[str, Any]:
    """Delete an endpoint; its undelivered messages are dropped."""
    endpoint = changes.delete(
        session, key_auditor(request, key), Scope(key.account_id), endpoint_id, now
    )
    return {"id": endpoint.id, "object": "webhook_endpoint", "deleted": True}


@router.post("/webhook-endpoints/{endpoint_id}/rotate-secret")
def rotate_secret(
    endpoint_id: str, request: Request, key: AccountKeyDep, session: SessionDep, now: NowDep
) -> dict[str, Any]:
    """A new signing secret (shown once); messages carry both signatures for 24 hours."""
    return _created(
        *changes.rotate(
            session, key_auditor(request, key), Scope(key.account_id), rules_of(request),
            endpoint_id, now,
        )
    )  # fmt: skip


@router.post("/webhook-endpoints/{endpoint_id}/test")
def test_endpoint(
    endpoint_id: str, request: Request, key: AccountKeyDep, session: SessionDep, now: NowDep
) -> dict[str, Any]:
    """Send a ``webhook.test`` event to this endpoint."""
    return changes.send_test(
        session, key_auditor(request, key), Scope(key.account_id), endpoint_id, now
    )


@router.get("/webhook-endpoints/{endpoint_id}/deliveries")
def list_deliveries(
    endpoint_id: str, key: AccountKeyDep, session: SessionDep, paging: PageParams
) -> dict[str, Any]:
    """An endpoint's deliveries, newest first."""
    return service.list_deliveries(session, Scope(key.account_id), endpoint_id, *paging)
