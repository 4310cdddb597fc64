"""A route whose body fields are all optional takes no body at all, or an empty one, as ``{}``:
the routes are found by walking the app's routes, and each is called on objects of its own with
no body, an empty JSON body and an empty form body, answered as ``{}`` is."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from metering.payments import endpoints as payment_endpoints
from metering.web.routes import http_routes
from tests.conftest import Api
from tests.factories import create_account, create_key, grant

PUBLIC = "https://11.22.33.44/hook"  # public for the address rules
NO_BODY: dict[str, dict[str, Any]] = {
    "no body": {},
    "empty JSON body": {"content": b"", "headers": {"Content-Type": "application/json"}},
    "empty form body": {
        "content": b"",
        "headers": {"Content-Type": "application/x-www-form-urlencoded"},
    },
    "{}": {"json": {}},
}


# The payment routes are unknown paths while payments are off, as they are here: a refund with no
# body is tested with payments on (tests/payments/test_refunds.py).
PAYMENT_ROUTES = {
    (method, route.path)
    for router in (payment_endpoints.router, payment_endpoints.admin_router)
    for route in router.routes
    for method in getattr(route, "methods", ())
}


def optional_body_routes(api: Api) -> list[tuple[str, str]]:
    """(method, path) of every route with a JSON body none of whose fields is required (but
    the payment routes)."""
    found = []
    for route in http_routes(api.client.app):  # type: ignore[arg-type]
        if any((method, route.path) in PAYMENT_ROUTES for method in route.methods or ()):
            continue
        body = getattr(route, "body_field", None)
        model = body.field_info.annotation if body is not None else None
        if (
            isinstance(model, type)
            and issubclass(model, BaseModel)
            and not any(f.is_required() for f in model.model_fields.values())
        ):
            found += [(method, route.path) for method in sorted(route.methods or ())]
    return found


def objects(api: Api) -> tuple[dict[str, str], str]:
    """Fresh path parameters for every such route, and the account key's secret."""
    account = create_account(api)
    key = create_key(api, account)
    endpoint = api.admin(
        "POST",
        "/admin/v1/webhook-endpoints",
        json={"url": PUBLIC, "event_types": ["webhook.test"], "account_id": account},
    ).json()["id"]
    event = api.admin("POST", f"/admin/v1/webhook-endpoints/{endpoint}/test")
    assert event.status_code == 200, event.text
    project = api.admin(
        "POST", f"/admin/v1/accounts/{account}/projects", json={"name": f"P {account}"}
    )
    assert project.status_code == 201, project.text
    member = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/members",
        json={"email": f"{account}@example.com", "name": "M", "role": "viewer"},
    )
    assert member.status_code == 201, member.text
    ids = {
        "project_id": project.json()["id"],
        "member_id": member.json()["id"],
        "account_id": account,
        "key_id": key.id,
        "grant_id": grant(api, account, 1)["id"],
        "endpoint_id": endpoint,
        "event_id": event.json()["id"],
    }
    return ids, key.secret


def test_the_walk_finds_the_routes_with_optional_bodies(api: Api) -> None:
    routes = optional_body_routes(api)
    for expected in (
        ("POST", "/admin/v1/webhook-events/{event_id}/resend"),
        ("POST", "/admin/v1/grants/{grant_id}/void"),
        ("PATCH", "/admin/v1/accounts/{account_id}"),
        ("PATCH", "/v1/webhook-endpoints/{endpoint_id}"),
    ):
        assert expected in routes


@pytest.mark.parametrize("form", list(NO_BODY))
def test_every_route_with_optional_fields_takes_no_body(api: Api, form: str) -> None:
    for method, template in optional_body_routes(api):
        ids, secret = objects(api)
        path = template.format(**ids)
        headers = {"Authorization": f"Bearer {secret}"}
        if path.startswith("/admin/"):
            headers = dict(api.admin_headers)
        request = {**NO_BODY[form], "headers": {**headers, **NO_BODY[form].get("headers", {})}}
        response = api.client.request(method, path, **request)
        assert response.status_code in (200, 201), (method, template, form, response.text)
        assert isinstance(response.json(), dict)
