"""Strict types (docs/api.md#conventions): a date or timestamp is a string in its format (a number
never is one), an integer is a JSON integer (a float is not), and a body is a JSON object where one
is expected. Each case is a 400 naming the field, and changes nothing."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from fastapi.routing import APIRoute

from metering.web.routes import http_routes
from tests.conftest import NOW, Api
from tests.factories import (
    assert_error,
    authorization_request,
    create_account,
    create_key,
    credits_of,
    grant,
    ingest,
    priced_model,
    put_model,
    unique,
    usage_event,
)


def _api_routes(api: Api) -> list[APIRoute]:
    routes = [route.original_route for route in http_routes(api.client.app)]  # type: ignore[arg-type]
    return [route for route in routes if isinstance(route, APIRoute)]


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


# Routes an account key calls (the others under /v1/ take the gateway token).
ACCOUNT_KEY_PATHS = {
    "/v1/api-keys",
    "/v1/usage",
    "/v1/credits",
    "/v1/models",
    "/v1/projects",
    "/v1/members",
}


def _headers(api: Api, path: str) -> dict[str, str]:
    if path.startswith("/admin/"):
        return api.admin_headers
    if path in ACCOUNT_KEY_PATHS:
        return {"Authorization": f"Bearer {create_key(api, create_account(api)).secret}"}
    return api.gateway_headers


class TestDates:
    @pytest.mark.parametrize(
        "value",
        [
            0,
            "0",
            1764547200,
            "1764547200",
            20261201,
            1.5,
            True,
            "2026-12-01T00:00:00Z",
            "2026-12-1",
            " 2026-12-01",
            "2026-12-01\n",
            "2026-02-30",
            "",
        ],
    )
    def test_deprecation_date_is_a_date_string_only(self, api: Api, value: Any) -> None:
        model = put_model(api)
        body = {"display_name": "x", "context_length": 4096, "deprecation_date": value}
        response = api.admin("PUT", f"/admin/v1/models/{model}", json=body)
        assert_error(response, 400, "invalid_parameter", param="deprecation_date")
        assert api.admin("GET", f"/admin/v1/models/{model}").json()["deprecation_date"] is None
        fresh = unique("New")
        response = api.admin("PUT", f"/admin/v1/models/{fresh}", json=body)
        assert_error(response, 400, "invalid_parameter", param="deprecation_date")
        assert_error(
            api.admin("GET", f"/admin/v1/models/{fresh}"), 404, "model_not_found", param="model"
        )

    def test_a_date_string_is_a_date(self, api: Api) -> None:
        model = put_model(api)
        body = {"display_name": "x", "context_length": 4096, "deprecation_date": "2027-03-01"}
        response = api.admin("PUT", f"/admin/v1/models/{model}", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["deprecation_date"] == "2027-03-01"

    @pytest.mark.parametrize("value", [1795953600, 0, 1.5, True, None, [], {}])
    @pytest.mark.parametrize("route", ["prices", "rates"])
    def test_effective_at_is_a_timestamp_string_only(
        self, api: Api, value: Any, route: str
    ) -> None:
        model = put_model(api)
        rates = {
            "input_microcents_per_million": 1,
            "output_microcents_per_million": 1,
            "cache_read_microcents_per_million": 1,
            "effective_at": value,
        }
        if route == "prices":
            response = api.admin("POST", f"/admin/v1/models/{model}/prices", json=rates)
        else:
            account = create_account(api)
            response = api.admin(
                "POST", f"/admin/v1/accounts/{account}/rates", json={"model": model, **rates}
            )
        assert_error(response, 400, "invalid_parameter", param="effective_at")
        assert api.admin("GET", f"/admin/v1/models/{model}").json()["prices"] == []

    @pytest.mark.parametrize("value", ["", "0", "1764547200", "2026-12-01"])
    def test_effective_at_text_that_is_no_timestamp(self, api: Api, value: str) -> None:
        model = put_model(api)
        body = {
            "effective_at": value,
            "input_microcents_per_million": 1,
            "output_microcents_per_million": 1,
            "cache_read_microcents_per_million": 1,
        }
        response = api.admin("POST", f"/admin/v1/models/{model}/prices", json=body)
        assert_error(response, 400, "invalid_timestamp", param="effective_at")


class TestIntegers:
    @pytest.mark.parametrize("value", [131072.0, "131072", 1.31072e5, True])
    def test_model_limits(self, api: Api, value: Any) -> None:
        response = api.admin(
            "PUT",
            f"/admin/v1/models/{unique('M')}",
            json={"display_name": "x", "context_length": value},
        )
        assert_error(response, 400, "invalid_parameter", param="context_length")

    @pytest.mark.parametrize("field", ["prompt_tokens", "max_tokens", "n"])
    @pytest.mark.parametrize("value", [1.0, 100.0, "100", True])
    def test_authorization_counts(self, api: Api, field: str, value: Any) -> None:
        account = create_account(api)
        key = create_key(api, account)
        grant(api, account, 1000)
        model = priced_model(api, NOW - timedelta(days=1))
        body = authorization_request(key, model, **{field: value})
        assert_error(
            api.gateway("POST", "/v1/authorizations", json=body),
            400,
            "invalid_parameter",
            param=field,
        )
        assert credits_of(api, key)["held_microcents"] == 0

    @pytest.mark.parametrize("ids", [[1.0], ["1"], [True], [2.5]])
    def test_reprocess_ids(self, api: Api, ids: list[Any]) -> None:
        response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ids})
        assert_error(response, 400, "invalid_parameter", param="ids[0]")

    @pytest.mark.parametrize("limit", ["1.0", "+5", " 5", "5 ", "1_000", "1e2", "0x10", "٣"])
    def test_query_integers_on_every_paginated_route(self, api: Api, limit: str) -> None:
        schema = api.client.app.openapi()  # type: ignore[attr-defined]
        paginated = [
            path
            for path, operations in schema["paths"].items()
            if any(p["name"] == "limit" for p in operations.get("get", {}).get("parameters", []))
        ]
        assert len(paginated) >= 6
        key = create_key(api, create_account(api))
        for path in paginated:
            if path.endswith("/payments"):
                continue  # payments are off here (404); tests/payments holds their lists
            headers = _headers(api, path)
            if path.startswith("/v1/webhook-endpoints"):  # an account key's lists
                headers = {"Authorization": f"Bearer {key.secret}"}
            response = api.client.get(
                _concrete(path), params={"limit": limit, "account_id": "x1"}, headers=headers
            )
            assert_error(response, 400, "invalid_parameter", param="limit")
        response = api.admin("GET", "/admin/v1/accounts", params={"limit": "5"})
        assert response.status_code == 200, response.text


class TestBodies:
    """A bare scalar, array or null where a JSON object is expected: 400, on every route with
    a body (found from the app's routes), before anything is looked up or changed."""

    BARE = ["-2.87e-43", "[]", "null", "1", '"x"', "true", '[{"ids": [1]}]']

    @pytest.mark.parametrize("text", BARE)
    def test_every_body_route_wants_an_object(self, api: Api, text: str) -> None:
        routes = [route for route in _api_routes(api) if route.body_field is not None]
        assert len(routes) >= 9
        for route in routes:
            (method,) = route.methods
            response = api.client.request(
                method,
                _concrete(route.path),
                content=text,
                headers={**_headers(api, route.path), "Content-Type": "application/json"},
            )
            assert_error(response, 400, "invalid_json_request")

    @pytest.mark.parametrize("text", BARE)
    def test_reprocess_with_a_bare_body_retries_nothing(self, api: Api, text: str) -> None:
        key = create_key(api, create_account(api))
        model = unique("Missing")
        ingest(api, usage_event(key, model, NOW - timedelta(hours=1)))
        put_model(api, model)  # still unpriced: a retry would count one more attempt
        before = api.admin("GET", "/admin/v1/quarantine", params={"account_id": key.account_id})
        response = api.client.post(
            "/admin/v1/quarantine/reprocess",
            content=text,
            headers={**api.admin_headers, "Content-Type": "application/json"},
        )
        assert_error(response, 400, "invalid_json_request")
        after = api.admin("GET", "/admin/v1/quarantine", params={"account_id": key.account_id})
        assert after.json()["data"] == before.json()["data"] != []

    def test_reprocess_without_a_body_or_with_an_object_still_works(self, api: Api) -> None:
        assert (
            api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": [2**40]}).json()[
                "data"
            ]
            == []
        )
        response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": [2**40]})
        assert response.status_code == 200, response.text
