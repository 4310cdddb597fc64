"""The conventions (docs/api.md#conventions) through the real app: the error body, request ids, JSON
parsing, the body limit, validation as 400, internal errors, credentials, and the health probes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from metering.app import create_app
from metering.settings import DEFAULT_BODY_LIMIT
from metering.web.deps import SessionDep
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, Api, make_settings, running_api
from tests.factories import REQUEST_ID, assert_error, create_account, create_key, unique


def post_raw(api: Api, path: str, body: Any, content_type: str = "application/json") -> Any:
    headers = {**api.admin_headers, "Content-Type": content_type}
    return api.client.post(path, content=body, headers=headers)


def account_body(name: str, size: int | None = None) -> bytes:
    """A valid account body, padded with JSON whitespace to exactly ``size`` bytes."""
    body = f'{{"name": "{name}", "billing": "prepaid"}}'.encode()
    if size is not None:
        assert len(body) <= size
        body = body[:-1] + b" " * (size - len(body)) + b"}"
    return body


class TestRequestIds:
    def test_every_response_has_its_own_request_id(self, api: Api) -> None:
        responses = [
            api.client.get("/healthz"),
            api.client.get("/v1/models"),
            api.admin("GET", "/admin/v1/accounts"),
            api.client.get("/no/such/path"),
        ]
        ids = [response.headers["x-request-id"] for response in responses]
        assert all(REQUEST_ID.fullmatch(request_id) for request_id in ids), ids
        assert len(set(ids)) == len(ids)

    def test_error_request_id_equals_header(self, api: Api) -> None:
        response = api.client.get("/admin/v1/accounts")
        error = assert_error(response, 401, "missing_api_key")
        assert response.headers["x-request-id"] == error["request_id"]


class TestRouting:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/nope"),
            ("GET", "/v1/model"),
            ("POST", "/v1/nothing/here"),
            ("GET", "/admin/v1/no-such-collection"),
        ],
    )
    def test_unknown_path_is_404_not_found(self, api: Api, method: str, path: str) -> None:
        response = api.admin(method, path)
        error = assert_error(response, 404, "not_found")
        assert path in error["message"]

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", "/healthz"),
            ("DELETE", "/v1/models"),
            ("PUT", "/admin/v1/accounts"),
            ("GET", "/admin/v1/api-keys/key_x"),
            ("POST", "/admin/v1/models/GLM-5.3"),
        ],
    )
    def test_wrong_method_is_405_method_not_allowed(self, api: Api, method: str, path: str) -> None:
        assert_error(api.admin(method, path), 405, "method_not_allowed")


class TestMalformedBodies:
    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(b'{"name": "a",', id="truncated"),
            pytest.param(b"{name: 'a'}", id="not-json"),
            pytest.param(b'{"name": "a"} trailing', id="trailing-garbage"),
            pytest.param(b'{"name": "\xff\xfe"}', id="invalid-utf8"),
            pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deeply-nested-array"),
            pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, id="deeply-nested-object"),
            pytest.param(b"[1, 2]", id="array"),
            pytest.param(b'"a string"', id="string"),
            pytest.param(b"42", id="number"),
            pytest.param(b"null", id="null"),
            pytest.param(b"", id="empty"),
        ],
    )
    def test_body_that_is_not_a_json_object(self, api: Api, body: bytes) -> None:
        response = post_raw(api, "/admin/v1/accounts", body)
        error = assert_error(response, 400, "invalid_json_request")
        assert "Traceback" not in error["message"]

    def test_json_is_parsed_without_a_content_type(self, api: Api) -> None:
        name = unique("no-content-type")
        response = api.admin("POST", "/admin/v1/accounts", content=account_body(name))
        assert response.status_code == 201, response.text
        assert response.json()["name"] == name

    @pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
    def test_nan_and_infinity_are_refused_naming_the_field(self, api: Api, constant: bytes) -> None:
        account_id = create_account(api)
        path = f"/admin/v1/accounts/{account_id}/api-keys"
        body = b'{"name": "k", "monthly_spend_limit_cents": ' + constant + b"}"
        assert_error(
            post_raw(api, path, body), 400, "invalid_parameter", param="monthly_spend_limit_cents"
        )
        body = b'{"name": ' + constant + b"}"
        assert_error(post_raw(api, path, body), 400, "invalid_parameter", param="name")
        keys = api.admin("GET", path).json()["data"]
        assert keys == []


class TestBodyLimit:
    LIMIT = 1024

    @pytest.fixture
    def small(self, api: Api, tmp_path: Path) -> Iterator[Api]:
        """The same database behind an app with a 1 KiB body limit."""
        with running_api(api.backend, api.url, tmp_path, max_body_bytes=self.LIMIT) as small:
            yield small

    def test_default_limit_is_16_mib(self, api: Api) -> None:
        assert api.settings.max_body_bytes == DEFAULT_BODY_LIMIT == 16 * 1024 * 1024

    def test_body_at_the_limit_is_accepted(self, small: Api) -> None:
        name = unique("at-limit")
        body = account_body(name, self.LIMIT)
        assert len(body) == self.LIMIT
        response = post_raw(small, "/admin/v1/accounts", body)
        assert response.status_code == 201, response.text
        account = response.json()
        assert (account["object"], account["name"], account["billing"]) == (
            "account",
            name,
            "prepaid",
        )
        assert _account_named(small, name)

    def test_content_length_over_the_limit_is_413(self, small: Api) -> None:
        name = unique("over-limit")
        response = post_raw(small, "/admin/v1/accounts", account_body(name, self.LIMIT + 1))
        error = assert_error(response, 413, "request_body_too_large")
        assert error["limit_bytes"] == self.LIMIT
        assert not _account_named(small, name)

    def test_over_the_limit_is_refused_before_authentication(self, small: Api) -> None:
        response = small.client.post("/admin/v1/accounts", content=b"x" * (self.LIMIT + 1))
        assert assert_error(response, 413, "request_body_too_large")["limit_bytes"] == self.LIMIT

    def test_chunked_body_over_the_limit_is_413(self, small: Api) -> None:
        name = unique("chunked")
        body = account_body(name, 4 * self.LIMIT)

        def chunks() -> Iterator[bytes]:  # no Content-Length: sent with chunked encoding
            for start in range(0, len(body), 256):
                yield body[start : start + 256]

        response = post_raw(small, "/admin/v1/accounts", chunks())
        error = assert_error(response, 413, "request_body_too_large")
        assert error["limit_bytes"] == self.LIMIT
        assert not _account_named(small, name)

    def test_chunked_body_under_the_limit_is_accepted(self, small: Api) -> None:
        name = unique("chunked-ok")
        body = account_body(name, self.LIMIT)

        def chunks() -> Iterator[bytes]:
            yield body[:500]
            yield body[500:]

        response = post_raw(small, "/admin/v1/accounts", chunks())
        assert response.status_code == 201, response.text
        assert _account_named(small, name)


def _account_named(api: Api, name: str) -> bool:
    with api.database.unit_of_work() as session:
        count = session.execute(
            text("SELECT count(*) FROM accounts WHERE name = :name"), {"name": name}
        ).scalar_one()
    return bool(count)


class TestValidationIsA400:
    def test_missing_field(self, api: Api) -> None:
        response = api.admin("POST", "/admin/v1/accounts", json={"billing": "prepaid"})
        assert_error(response, 400, "missing_parameter", param="name")

    def test_value_outside_an_enum(self, api: Api) -> None:
        response = api.admin(
            "POST", "/admin/v1/accounts", json={"name": "a", "billing": "postpaid"}
        )
        error = assert_error(response, 400, "unsupported_value", param="billing")
        assert "prepaid" in error["message"]

    def test_unknown_field(self, api: Api) -> None:
        body = {"name": "a", "billing": "prepaid", "colour": "red"}
        response = api.admin("POST", "/admin/v1/accounts", json=body)
        assert_error(response, 400, "invalid_parameter", param="colour")

    def test_wrong_type(self, api: Api) -> None:
        response = api.admin("POST", "/admin/v1/accounts", json={"name": 5})
        assert_error(response, 400, "invalid_parameter", param="name")

    def test_model_level_rule_names_its_field(self, api: Api) -> None:
        body = {"display_name": "x", "context_length": 100, "max_output_tokens": 101}
        response = api.admin("PUT", f"/admin/v1/models/{unique('M')}", json=body)
        assert_error(response, 400, "invalid_parameter", param="max_output_tokens")

    @pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten", "1.5"])
    def test_query_parameter(self, api: Api, limit: str) -> None:
        response = api.admin("GET", "/admin/v1/accounts", params={"limit": limit})
        assert_error(response, 400, "invalid_parameter", param="limit")


class TestInternalErrors:
    @pytest.fixture
    def failing(self, api: Api, tmp_path: Path) -> Iterator[TestClient]:
        """An app of the real factory with throwaway routes that fail unexpectedly."""
        app = create_app(make_settings(api.url, tmp_path), database=api.database)

        @app.get("/test/boom")
        def boom() -> None:
            raise RuntimeError("password=hunter2 in SELECT secret_hash FROM api_keys")

        @app.get("/test/bad-sql")
        def bad_sql(session: SessionDep) -> None:
            session.execute(text("SELECT secret_hash FROM no_such_table_xyz"))

        with TestClient(app, raise_server_exceptions=False) as client:
            yield client

    @pytest.mark.parametrize("path", ["/test/boom", "/test/bad-sql"])
    def test_unexpected_exception_is_500_without_internals(
        self, failing: TestClient, path: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        with caplog.at_level(logging.ERROR, logger="metering"):
            response = failing.get(path)
        error = assert_error(response, 500, "internal_error")
        for leak in ("Traceback", "SELECT", "secret_hash", "no_such_table", "hunter2", "File "):
            assert leak not in response.text
        # Logged for the operator, with the request id the client can quote.
        logged = [r for r in caplog.records if error["request_id"] in r.getMessage()]
        assert logged and logged[0].exc_info is not None

    def test_app_keeps_serving_after_a_500(self, failing: TestClient) -> None:
        assert failing.get("/test/bad-sql").status_code == 500
        assert failing.get("/readyz").status_code == 200


class TestCredentials:
    def test_missing_credential_on_admin_route(self, api: Api) -> None:
        response = api.client.get("/admin/v1/accounts")
        assert_error(response, 401, "missing_api_key", param=None)
        response = api.client.get("/admin/v1/accounts", headers={"Authorization": "Bearer "})
        assert_error(response, 401, "missing_api_key", param=None)

    @pytest.mark.parametrize(
        "token",
        [
            pytest.param("wrong-token", id="unknown"),
            pytest.param(GATEWAY_TOKEN, id="gateway-token"),
            pytest.param(ADMIN_TOKEN + "x", id="admin-token-prefix"),
        ],
    )
    def test_wrong_credential_on_admin_route(self, api: Api, token: str) -> None:
        response = api.as_key(token, "GET", "/admin/v1/accounts")
        error = assert_error(response, 401, "invalid_api_key", param=None)
        # The same answer whatever was presented: never a hint of what exists.
        assert (
            error["message"]
            == api.as_key("zz", "GET", "/admin/v1/accounts").json()["error"]["message"]
        )

    def test_account_key_is_not_an_admin_credential(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        response = api.as_key(key.secret, "POST", "/admin/v1/accounts", json={"name": "x"})
        assert_error(response, 401, "invalid_api_key", param=None)

    @pytest.mark.parametrize("token", [ADMIN_TOKEN, GATEWAY_TOKEN, "mk_not-a-key"])
    def test_service_tokens_are_not_account_keys(self, api: Api, token: str) -> None:
        response = api.as_key(token, "GET", "/v1/models")
        assert_error(response, 401, "invalid_api_key", param=None)
        response = api.client.get("/v1/models", headers={"x-api-key": token})
        assert_error(response, 401, "invalid_api_key", param=None)

    def test_account_key_in_either_header(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        assert api.as_key(key.secret, "GET", "/v1/models").status_code == 200
        assert api.client.get("/v1/models", headers={"x-api-key": key.secret}).status_code == 200


class TestHealth:
    def test_healthz_and_readyz(self, api: Api) -> None:
        response = api.client.get("/healthz")
        assert (response.status_code, response.json()) == (200, {"status": "ok"})
        response = api.client.get("/readyz")
        assert (response.status_code, response.json()) == (200, {"status": "ready"})

    def test_readyz_fails_when_the_database_is_unreachable(self, tmp_path: Path) -> None:
        unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2"
        app = create_app(make_settings(unreachable, tmp_path))
        with TestClient(app, raise_server_exceptions=False) as client:
            assert client.get("/healthz").status_code == 200
            response = client.get("/readyz")
        assert response.status_code == 503
        body = response.json()["error"]
        assert body["code"] == "database_unavailable"
        assert body["request_id"] == response.headers["x-request-id"]
        assert "127.0.0.1" not in response.text and "psycopg" not in response.text


class TestOpenAPIErrors:
    """The published schema tells clients the truth about errors: FastAPI's 422 is never
    answered (validation errors are 400), and every error has the error body."""

    def test_every_operation_declares_the_error_body_and_no_422(self, api: Api) -> None:
        spec = api.client.get("/openapi.json").json()
        operations = [op for ops in spec["paths"].values() for op in ops.values()]
        assert len(operations) >= 25
        for operation in operations:
            responses = operation["responses"]
            assert "422" not in responses, operation["operationId"]
            for status in ("4XX", "500"):
                schema = responses[status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}
        error = spec["components"]["schemas"]["ErrorObject"]
        assert set(error["required"]) == {"message", "type", "param", "code", "request_id"}

    def test_a_real_error_matches_the_declared_body(self, api: Api) -> None:
        body = {"name": "x", "billing": "postpaid"}
        response = api.admin("POST", "/admin/v1/accounts", json=body)
        assert response.status_code == 400
        spec = api.client.get("/openapi.json").json()
        declared = spec["components"]["schemas"]["ErrorObject"]["properties"]
        assert set(response.json()) == {"error"}
        assert set(declared) <= set(response.json()["error"])
