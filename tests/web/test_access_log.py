"""The access log: one line per request (method, path, status, duration, request id), on by
default, never a credential or a query string; ``METERING_ACCESS_LOG=false`` turns it off."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import (
    ADMIN_TOKEN,
    BACKENDS,
    GATEWAY_TOKEN,
    NOW,
    Api,
    migrated_database,
    running_api,
)
from tests.factories import authorization_request, create_account, create_key, grant, priced_model

LINE = re.compile(
    r"(GET|POST|PUT|PATCH|DELETE) (\S+) (\d{3}) (\d+\.\d)ms request_id=([0-9a-f]{12})"
)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "metering.access"]


def test_one_line_per_request_without_secrets(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    account = create_account(api)
    key = create_key(api, account)
    grant(api, account, 1000)
    model = priced_model(api, NOW - timedelta(days=1))
    caplog.clear()
    caplog.set_level(logging.INFO, logger="metering.access")
    responses = [
        api.as_key(key.secret, "GET", "/v1/usage?starting_at=2026-11-29&secret=hunter2"),
        api.gateway("POST", "/v1/authorizations", json=authorization_request(key, model)),
        api.admin("GET", "/admin/v1/accounts/nope"),
        api.client.get("/v1/credits", headers={"x-api-key": key.secret}),
    ]
    lines = access_lines(caplog)
    assert len(lines) == len(responses), lines
    expected = [
        ("GET", "/v1/usage", 400),  # an unknown parameter: logged all the same
        ("POST", "/v1/authorizations", 200),  # the gateway's lean path is logged too
        ("GET", "/admin/v1/accounts/nope", 404),
        ("GET", "/v1/credits", 200),
    ]
    for line, response, (method, path, status) in zip(lines, responses, expected, strict=True):
        match = LINE.fullmatch(line)
        assert match, line
        assert match.group(1, 2, 3) == (method, path, str(status))
        assert response.status_code == status
        assert match.group(5) == response.headers["x-request-id"]
    logged = "\n".join(lines)
    for secret in (key.secret, ADMIN_TOKEN, GATEWAY_TOKEN, "hunter2", "starting_at"):
        assert secret not in logged


@pytest.mark.parametrize("backend", BACKENDS[:1])
def test_it_can_be_turned_off(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="metering.access")
    with (
        migrated_database(backend, tmp_path) as url,
        running_api(backend, url, tmp_path, access_log=False) as api,
    ):
        assert api.client.get("/healthz").status_code == 200
        assert api.admin("GET", "/admin/v1/accounts").status_code == 200
    assert access_lines(caplog) == []
