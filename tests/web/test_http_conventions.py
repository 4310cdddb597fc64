"""HTTP conventions on every route, generated from the app's own routes (never a hand list):
no redirects (a trailing slash is 404, whatever the Host header says), a 405 names every
allowed method in ``Allow``, and the service's tokens count only as ``Authorization: Bearer``."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta

import pytest

from metering.web.routes import http_routes
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, NOW, Api
from tests.factories import (
    assert_error,
    authorization_request,
    create_account,
    create_key,
    grant,
    priced_model,
    usage_event,
)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


def _paths(api: Api) -> dict[str, set[str]]:
    """Each route path of the app with every method some route answers on it."""
    paths: dict[str, set[str]] = defaultdict(set)
    for route in http_routes(api.client.app):  # type: ignore[arg-type]
        paths[route.path] |= route.methods
    return paths


def _assert_refused(response: object, path: str, status: int, code: str) -> None:
    """The JSON error of docs/api.md#conventions; under /billing (the portal) an HTML error page
    with the request id."""
    if path == "/billing" or path.startswith("/billing/"):
        assert response.status_code == status, (path, response.status_code)  # type: ignore[attr-defined]
        assert response.headers["content-type"].startswith("text/html"), path  # type: ignore[attr-defined]
        assert response.headers["x-request-id"] in response.text, path  # type: ignore[attr-defined]
        return
    assert_error(response, status, code)


def test_the_routes_are_found(api: Api) -> None:
    """The generated lists below are the whole API, not an empty set that passes anything."""
    paths = _paths(api)
    assert {"/v1/authorizations", "/v1/usage/events", "/admin/v1/accounts", "/metrics"} <= set(
        paths
    )
    assert paths["/admin/v1/models/{model_id}"] == {"GET", "PUT"}


@pytest.mark.parametrize("token", [ADMIN_TOKEN, GATEWAY_TOKEN])
def test_a_trailing_slash_is_404_and_never_a_redirect(api: Api, token: str) -> None:
    for path, methods in _paths(api).items():
        for method in methods:
            response = api.client.request(
                method,
                _concrete(path) + "/",
                headers={"Authorization": f"Bearer {token}", "Host": "evil.example"},
                json={},
                follow_redirects=False,
            )
            assert "location" not in response.headers, (method, path)
            if method == "HEAD":  # no body
                assert response.status_code == 404, path
                continue
            _assert_refused(response, path, 404, "not_found")
            assert "evil.example" not in response.text, (method, path)


def test_405_names_every_allowed_method(api: Api) -> None:
    routes = list(http_routes(api.client.app))  # type: ignore[arg-type]
    checked = 0
    for path in _paths(api):
        concrete = _concrete(path)
        # Every route that matches this URL answers some methods on it: a fixed path such as
        # /billing/payments/auto-recharge is also /billing/payments/{payment_id}.
        methods = {m for route in routes if route.path_regex.match(concrete) for m in route.methods}
        for method in set(METHODS) - methods:
            response = api.admin(method, concrete)
            _assert_refused(response, path, 405, "method_not_allowed")
            allowed = {m.strip() for m in response.headers["allow"].split(",")}
            assert allowed == methods, (method, path)
            checked += 1
    assert checked > 20


class TestTokensOnlyAsBearer:
    """``x-api-key`` is for account keys: a gateway or admin token there is no credential."""

    def test_admin_token_in_x_api_key_is_refused(self, api: Api) -> None:
        response = api.client.get("/admin/v1/accounts", headers={"x-api-key": ADMIN_TOKEN})
        assert_error(response, 401, "invalid_api_key")
        response = api.client.post(
            "/admin/v1/accounts", headers={"x-api-key": ADMIN_TOKEN}, json={"name": "x"}
        )
        assert_error(response, 401, "invalid_api_key")

    def test_gateway_token_in_x_api_key_is_refused(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        grant(api, account, 1000)
        model = priced_model(api, NOW - timedelta(days=1))
        headers = {"x-api-key": GATEWAY_TOKEN}
        # Well-formed requests, which the lean gateway path would answer with a good token.
        hold = api.client.post(
            "/v1/authorizations", headers=headers, json=authorization_request(key, model)
        )
        assert_error(hold, 401, "invalid_api_key")
        events = {"events": [usage_event(key, model, NOW - timedelta(minutes=1))]}
        assert_error(
            api.client.post("/v1/usage/events", headers=headers, json=events),
            401,
            "invalid_api_key",
        )
        assert_error(
            api.client.delete("/v1/authorizations/auth_x", headers=headers), 401, "invalid_api_key"
        )
        # The same requests with the token as Bearer are served.
        held = api.gateway("POST", "/v1/authorizations", json=authorization_request(key, model))
        assert held.status_code == 200, held.text
        assert held.json()["object"] == "authorization", held.text
        assert (held.json()["status"], held.json()["account_id"]) == ("active", account)
        recorded = api.gateway("POST", "/v1/usage/events", json=events)
        assert recorded.status_code == 200, recorded.text
        assert recorded.json()["recorded"] == 1, recorded.text

    def test_account_keys_still_work_in_x_api_key(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        response = api.client.get("/v1/credits", headers={"x-api-key": key.secret})
        assert response.status_code == 200, response.text
