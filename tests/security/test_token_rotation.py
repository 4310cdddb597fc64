"""``METERING_GATEWAY_TOKENS`` and ``METERING_ADMIN_TOKENS`` are comma-separated lists, so a
token can be rotated with no downtime: every configured token is accepted on every route of its
kind, the fast gateway lane included, and nothing else is — not a third string, not the
unsplit list, not a token of the other kind. Configured through the environment, as deployed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from metering.settings import Settings
from tests.conftest import APP_BACKENDS, NOW, Api, migrated_database, running_api
from tests.factories import (
    assert_error,
    authorization_request,
    create_account,
    create_key,
    grant,
    priced_model,
    usage_event,
)

ADMIN_TOKENS = ("adm-rotation-old-7d1f", "adm-rotation-new-42c9")
GATEWAY_TOKENS = ("gw-rotation-old-0b3e", "gw-rotation-new-91aa")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=APP_BACKENDS)
def rotating(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    """The app configured, as an operator does mid-rotation, with two tokens of each kind."""
    monkeypatch.setenv("METERING_ADMIN_TOKENS", f"{ADMIN_TOKENS[0]}, {ADMIN_TOKENS[1]}")
    monkeypatch.setenv("METERING_GATEWAY_TOKENS", ",".join(GATEWAY_TOKENS))
    configured = Settings()
    assert (configured.admin_tokens, configured.gateway_tokens) == (
        list(ADMIN_TOKENS),
        list(GATEWAY_TOKENS),
    )
    with (
        migrated_database(request.param, tmp_path) as url,
        running_api(
            request.param,
            url,
            tmp_path,
            admin_tokens=configured.admin_tokens,
            gateway_tokens=configured.gateway_tokens,
        ) as api,
    ):
        yield api


def test_both_tokens_of_each_kind_work(rotating: Api) -> None:
    api = rotating
    api.admin_headers = bearer(ADMIN_TOKENS[0])
    model = priced_model(api, NOW - timedelta(days=1))
    account = create_account(api)
    api.admin_headers = bearer(ADMIN_TOKENS[1])
    key = create_key(api, account)
    grant(api, account, 100)
    for token in ADMIN_TOKENS:
        response = api.client.get(f"/admin/v1/accounts/{account}", headers=bearer(token))
        assert response.status_code == 200, response.text
        assert response.json()["id"] == account
    for token, other in (GATEWAY_TOKENS, GATEWAY_TOKENS[::-1]):
        body = authorization_request(key, model)
        held = api.client.post("/v1/authorizations", json=body, headers=bearer(token))
        assert held.status_code == 200, held.text
        assert held.json()["status"] == "active"
        path = f"/v1/authorizations/{held.json()['id']}"
        voided = api.client.delete(path, headers=bearer(other))
        assert voided.status_code == 200, voided.text
        assert voided.json()["status"] == "voided"
        events = {"events": [usage_event(key, model, NOW)]}
        ingested = api.client.post("/v1/usage/events", json=events, headers=bearer(token))
        assert ingested.status_code == 200, ingested.text
        assert ingested.json()["recorded"] == 1


@pytest.mark.parametrize(
    "token",
    [
        "gw-rotation-third-5e20",
        ",".join(GATEWAY_TOKENS),  # the list as configured is not itself a token
        GATEWAY_TOKENS[0] + "x",
        GATEWAY_TOKENS[1][:-1],
        ADMIN_TOKENS[0],  # a token of the other kind
    ],
)
def test_no_other_string_is_a_gateway_token(rotating: Api, token: str) -> None:
    api = rotating
    routes: list[tuple[str, str, Any]] = [
        (
            "POST",
            "/v1/authorizations",
            {"api_key": "mk_x", "model": "m", "api": "chat_completions", "prompt_tokens": 1},
        ),
        ("DELETE", "/v1/authorizations/auth_x", None),
        ("POST", "/v1/usage/events", {"events": []}),
    ]
    for method, path, body in routes:
        response = api.client.request(method, path, json=body, headers=bearer(token))
        # param null: the caller's own credential failed, not a customer's key in the body
        assert_error(response, 401, "invalid_api_key", param=None)


@pytest.mark.parametrize(
    "token",
    [
        "adm-rotation-third-c0de",
        f"{ADMIN_TOKENS[0]}, {ADMIN_TOKENS[1]}",
        ADMIN_TOKENS[1].upper(),  # tokens are case-sensitive
        GATEWAY_TOKENS[1],
    ],
)
def test_no_other_string_is_an_admin_token(rotating: Api, token: str) -> None:
    response = rotating.client.get("/admin/v1/accounts", headers=bearer(token))
    assert_error(response, 401, "invalid_api_key", param=None)
