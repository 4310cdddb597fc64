"""The gateway's lean request path (metering.web.fastlane): it answers well-formed gateway
requests itself, passes everything else to FastAPI, and both give the same answers."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from metering.app import create_app
from metering.web.fastlane import FastLane
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, NOW, Api
from tests.factories import (
    Key,
    assert_error,
    authorization_request,
    create_account,
    create_key,
    grant,
    priced_model,
    usage_event,
)

GATEWAY = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}


@contextmanager
def _app(api: Api, *, fast_lane: bool = True) -> Iterator[TestClient]:
    """Another app on the shared database and clock, with or without the lane."""
    app: FastAPI = create_app(api.settings, database=api.database, clock=api.clock)
    if not fast_lane:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not FastLane]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _passed_on(client: TestClient) -> list[str]:
    """Records the requests the lane passes on to FastAPI (``METHOD path``)."""
    layer: Any = client.app.middleware_stack  # type: ignore[attr-defined]
    while not isinstance(layer, FastLane):
        layer = layer.app
    inner, passed = layer.app, []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            passed.append(f"{scope['method']} {scope['path']}")
        await inner(scope, receive, send)

    layer.app = recording
    return passed


@dataclass
class Setup:
    key: Key
    model: str
    poor_key: Key  # an account with no credit: its authorizations are 402


@pytest.fixture
def setup(api: Api) -> Setup:
    model = priced_model(api, NOW)
    account = create_account(api)
    grant(api, account, 1000)
    return Setup(create_key(api, account), model, create_key(api, create_account(api)))


def _answer(response: Any) -> tuple[int, Any, str | None]:
    """Status, body without the request id (each request has its own), content type."""
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        assert body["error"].pop("request_id") == response.headers["x-request-id"]
    assert response.headers.get("x-request-id")
    return response.status_code, body, response.headers.get("content-type")


def _raw(client: TestClient, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    content = (
        body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    )
    return client.request(method, path, content=content, headers=headers)


class TestWhichPathAnswers:
    def test_well_formed_gateway_requests_are_answered_by_the_lane(
        self, api: Api, setup: Setup
    ) -> None:
        with _app(api) as client:
            passed = _passed_on(client)
            body = authorization_request(setup.key, setup.model)
            response = client.post("/v1/authorizations", json=body, headers=GATEWAY)
            assert response.status_code == 200, response.text
            hold = response.json()
            assert hold["status"] == "active" and hold["request_id"] == body["request_id"]

            voided = client.delete(f"/v1/authorizations/{hold['id']}", headers=GATEWAY)
            assert voided.status_code == 200 and voided.json()["status"] == "voided"

            event = usage_event(setup.key, setup.model, NOW)
            ingested = client.post("/v1/usage/events", json={"events": [event]}, headers=GATEWAY)
            assert ingested.status_code == 200 and ingested.json()["recorded"] == 1

            # The service's own refusals are the lane's answers too, in the error body.
            poor = authorization_request(setup.poor_key, setup.model)
            refused = client.post("/v1/authorizations", json=poor, headers=GATEWAY)
            assert_error(refused, 402, "insufficient_credits")
            unknown = client.delete("/v1/authorizations/auth_nothing", headers=GATEWAY)
            assert_error(unknown, 404, "not_found", param="authorization_id")
            assert passed == []

            # Anything else is FastAPI's, for instance the admin routes.
            client.get("/admin/v1/authorizations", headers={"Authorization": "Bearer x"})
            assert passed == ["GET /admin/v1/authorizations"]

    @pytest.mark.parametrize(
        ("method", "path", "body", "headers"),
        [
            ("POST", "/v1/authorizations", "VALID", {}),
            ("POST", "/v1/authorizations", "VALID", {"Authorization": "Bearer wrong"}),
            ("POST", "/v1/authorizations", "VALID", {"Authorization": f"Basic {GATEWAY_TOKEN}"}),
            ("POST", "/v1/authorizations", "VALID", {"Authorization": f"Bearer {ADMIN_TOKEN}"}),
            ("POST", "/v1/authorizations?x=1", "VALID", GATEWAY),
            ("POST", "/v1/authorizations", b"{not json", GATEWAY),
            ("POST", "/v1/authorizations", b"", GATEWAY),
            ("POST", "/v1/authorizations", b"[]", GATEWAY),
            ("POST", "/v1/authorizations", "VALID", {**GATEWAY, "Content-Type": "text/plain"}),
            ("POST", "/v1/authorizations", {"model": "m"}, GATEWAY),
            ("POST", "/v1/authorizations", "EXTRA", GATEWAY),
            ("POST", "/v1/usage/events", {"events": "no"}, GATEWAY),
            ("DELETE", "/v1/authorizations/auth_x", None, {}),
            ("DELETE", "/v1/authorizations/auth%00x", None, GATEWAY),
            ("DELETE", "/v1/authorizations/", None, GATEWAY),
            ("GET", "/v1/authorizations/auth_x", None, GATEWAY),
        ],
    )
    def test_anything_else_is_passed_to_fastapi(
        self, api: Api, setup: Setup, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> None:
        if body == "VALID":
            body = authorization_request(setup.key, setup.model)
        elif body == "EXTRA":
            body = {**authorization_request(setup.key, setup.model), "temperature": 1}
        with _app(api) as client:
            passed = _passed_on(client)
            response = _raw(
                client, method, path, body, {"Content-Type": "application/json", **headers}
            )
        assert response.status_code < 500, response.text
        # (The first: FastAPI answers a trailing slash with a redirect, which the client follows.)
        assert passed[0] == f"{method} {path.partition('?')[0].replace('%00', chr(0))}"


class TestSameAnswers:
    """The app with the lane and the app without it give the same answers to the same
    requests: status, body (apart from each request's own id), content type."""

    def _both(
        self, api: Api, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> tuple[Any, Any]:
        with _app(api) as lane, _app(api, fast_lane=False) as fastapi:
            first = _answer(_raw(lane, method, path, body, headers))
            second = _answer(_raw(fastapi, method, path, body, headers))
        return first, second

    def test_authorization_granted_then_replayed(self, api: Api, setup: Setup) -> None:
        # The second app sees the same request id: the same authorization, as it now stands.
        lane, fastapi = self._both(
            api,
            "POST",
            "/v1/authorizations",
            authorization_request(setup.key, setup.model),
            GATEWAY,
        )
        assert lane[0] == 200 and lane == fastapi

    def test_the_services_refusals(self, api: Api, setup: Setup) -> None:
        poor = authorization_request(setup.poor_key, setup.model)
        unknown_model = authorization_request(setup.key, "no-such-model")
        with _app(api) as client:
            first = authorization_request(setup.key, setup.model)
            placed = client.post("/v1/authorizations", json=first, headers=GATEWAY)
            assert placed.status_code == 200, placed.text
            assert placed.json()["status"] == "active", placed.text
        conflict = {**first, "max_tokens": 7}
        for body, status in ((poor, 402), (unknown_model, 404), (conflict, 409)):
            lane, fastapi = self._both(api, "POST", "/v1/authorizations", body, GATEWAY)
            assert lane[0] == status and lane == fastapi

    def test_void_then_void_again(self, api: Api, setup: Setup) -> None:
        with _app(api) as client:
            body = authorization_request(setup.key, setup.model)
            hold = client.post("/v1/authorizations", json=body, headers=GATEWAY).json()
        lane, fastapi = self._both(api, "DELETE", f"/v1/authorizations/{hold['id']}", b"", GATEWAY)
        assert lane[0] == 200 and lane[1]["status"] == "voided" and lane == fastapi

    def test_a_duplicate_event(self, api: Api, setup: Setup) -> None:
        event = usage_event(setup.key, setup.model, NOW)
        with _app(api) as client:
            first = client.post("/v1/usage/events", json={"events": [event]}, headers=GATEWAY)
            assert first.json()["recorded"] == 1
        lane, fastapi = self._both(api, "POST", "/v1/usage/events", {"events": [event]}, GATEWAY)
        assert lane[1]["duplicates"] == 1 and lane == fastapi

    @settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data())
    def test_any_authorization_request(self, api: Api, setup: Setup, data: st.DataObject) -> None:
        """A well-formed request with up to three of its fields changed, dropped or wrong."""
        body: dict[str, Any] = {
            **authorization_request(setup.key, setup.model, max_tokens=256),
            "request_id": data.draw(st.from_regex(r"\A[a-z0-9]{12}\Z"), label="request_id"),
        }
        changes: dict[str, Any] = {
            "api_key": st.sampled_from([setup.poor_key.secret, "sk-unknown", "", 7]),
            "request_id": st.sampled_from(["", "bad id", "x" * 65, 5]),
            "model": st.sampled_from([setup.model.upper(), "no-such-model", "", 3]),
            "api": st.sampled_from(["responses", "messages", "other", None]),
            "prompt_tokens": st.one_of(
                st.integers(-5, 200_000), st.sampled_from(["100", 1.5, True])
            ),
            "max_tokens": st.one_of(st.integers(-5, 300_000), st.sampled_from([1.0, "5", False])),
            "n": st.one_of(st.integers(-1, 200), st.sampled_from([2.0, "2"])),
            "reasoning": st.sampled_from([True, "yes", 1]),
            "temperature": st.just(0.5),
        }
        for name in data.draw(
            st.lists(st.sampled_from(sorted(changes)), max_size=3, unique=True), label="changed"
        ):
            if data.draw(st.booleans(), label=f"drop {name}"):
                body.pop(name, None)
            else:
                body[name] = data.draw(changes[name], label=name)
        headers = data.draw(
            st.sampled_from(
                [
                    GATEWAY,
                    GATEWAY,
                    GATEWAY,
                    {**GATEWAY, "Content-Type": "application/json; charset=utf-8"},
                    {**GATEWAY, "Content-Type": "text/plain"},
                    {"x-api-key": GATEWAY_TOKEN},
                    {"Authorization": "Bearer wrong"},
                    {},
                ]
            ),
            label="headers",
        )
        lane, fastapi = self._both(api, "POST", "/v1/authorizations", body, headers)
        event(f"status {lane[0]}")
        if lane[0] == 200 and "request_id" not in body:
            # Without a request id each app made a hold of its own: the same but for the id.
            assert lane[1].pop("id") != fastapi[1].pop("id")
        assert lane == fastapi

    @pytest.mark.parametrize(
        ("method", "path", "body", "headers"),
        [
            ("POST", "/v1/authorizations", b"{not json", GATEWAY),
            ("POST", "/v1/authorizations", b"\xff\xfe", GATEWAY),
            ("POST", "/v1/authorizations", b"", GATEWAY),
            ("POST", "/v1/authorizations", b"[1, 2]", GATEWAY),
            ("POST", "/v1/authorizations", b'"text"', GATEWAY),
            ("POST", "/v1/authorizations", b'{"api_key": "k"}', {}),
            ("POST", "/v1/authorizations?debug=%00", b"{}", GATEWAY),
            ("POST", "/v1/usage/events", b'{"events": []}', GATEWAY),
            ("POST", "/v1/usage/events", b'{"events": [{}]}', GATEWAY),
            ("POST", "/v1/usage/events", b'{"events": [{"request_id": "x"}]}', {}),
            ("POST", "/v1/usage/events", b'{"events": {}}', GATEWAY),
            ("DELETE", "/v1/authorizations/auth_unknown", b"", GATEWAY),
            ("DELETE", "/v1/authorizations/auth_unknown", b"", {"x-api-key": GATEWAY_TOKEN}),
            ("DELETE", "/v1/authorizations/auth_unknown", b"", {"Authorization": "Bearer x"}),
            ("DELETE", "/v1/authorizations/auth%00", b"", GATEWAY),
            ("DELETE", "/v1/authorizations/a/b", b"", GATEWAY),
            ("PUT", "/v1/authorizations/auth_unknown", b"", GATEWAY),
        ],
    )
    def test_odd_requests(
        self, api: Api, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> None:
        lane, fastapi = self._both(
            api, method, path, body, {"Content-Type": "application/json", **headers}
        )
        assert lane[0] < 500 and lane == fastapi

    def test_a_body_over_the_limit_sent_in_chunks(self, api: Api, setup: Setup) -> None:
        """Without a Content-Length the limit is found while the lane reads the body."""
        limit = api.settings.max_body_bytes
        padding = " " * limit
        body = json.dumps(authorization_request(setup.key, setup.model)) + padding

        def chunks() -> Iterator[bytes]:
            yield body.encode()

        with _app(api) as lane, _app(api, fast_lane=False) as fastapi:
            answers = [
                _answer(client.post("/v1/authorizations", content=chunks(), headers=GATEWAY))
                for client in (lane, fastapi)
            ]
        assert answers[0][0] == 413 and answers[0] == answers[1]


class TestSeveralLoops:
    def test_each_app_closes_the_pool_of_its_own_event_loop(self, pg_api: Api) -> None:
        """Two apps on one database, each on an event loop of its own (as TestSameAnswers runs
        them): each app's shutdown closes the async pool its loop opened. A pool left open when
        its loop ended left its workers to the loop's last cancellation, which could wait for
        ever (a hang seen at a TestClient's exit)."""
        model = priced_model(pg_api, NOW)
        account = create_account(pg_api)
        grant(pg_api, account, 1000)
        key = create_key(pg_api, account)

        def open_pools() -> set[int]:
            return {
                id(pool)
                for pool in gc.get_objects()
                if isinstance(pool, AsyncConnectionPool) and not pool.closed
            }

        before = open_pools()
        with _app(pg_api) as first, _app(pg_api, fast_lane=False) as second:
            for client in (first, second, first, second):
                body = authorization_request(key, model)
                response = client.post("/v1/authorizations", json=body, headers=GATEWAY)
                assert response.status_code == 200, response.text
            assert len(open_pools() - before) == 2  # one per app's loop
        assert open_pools() - before == set()
