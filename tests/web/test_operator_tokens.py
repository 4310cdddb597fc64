"""Operators' tokens (docs/operations.md#operator-tokens): named tokens, read-only tokens, the
metrics token, and each secret configured once. The read-only checks run over the app's own routes
(never a hand list)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from metering.cli import main
from metering.kit.tokens import parse_token
from metering.models import Account, AuditEvent
from metering.settings import Settings
from metering.web.routes import http_routes
from tests.conftest import APP_BACKENDS, GATEWAY_TOKEN, Api, migrated_database, running_api
from tests.factories import assert_error, create_account, create_key, unique

ADMIN_SECRET = "alice-secret-0123456789"
READONLY_SECRET = "auditor-secret-0123456789"
METRICS_SECRET = "scraper-secret-0123456789"
UNNAMED_ADMIN = "Not:a-name-because-of-the-capital"


def sha8(secret: str) -> str:
    return "token:" + hashlib.sha256(secret.encode()).hexdigest()[:8]


class TestNames:
    @pytest.mark.parametrize(
        ("text", "name", "secret"),
        [
            ("ops:s3cret", "ops", "s3cret"),
            ("ops-eu_2:a:b", "ops-eu_2", "a:b"),
            ("x" * 40 + ":s", "x" * 40, "s"),
            ("x" * 41 + ":s", None, "x" * 41 + ":s"),
            ("Ops:s3cret", None, "Ops:s3cret"),
            ("ops.eu:s", None, "ops.eu:s"),
            (":s", None, ":s"),
            ("ops:", None, "ops:"),
            ("plain-secret", None, "plain-secret"),
        ],
    )
    def test_name_or_whole_secret(self, text: str, name: str | None, secret: str) -> None:
        token = parse_token(text)
        assert (token.name, token.secret) == (name or sha8(secret), secret)
        assert secret not in repr(token)


class TestEachSecretOnce:
    @pytest.fixture(autouse=True)
    def _no_metering_env(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        for name in list(os.environ):
            if name.startswith("METERING_") and not name.startswith("METERING_TEST_"):
                monkeypatch.delenv(name)
        monkeypatch.setenv("METERING_DATA_DIR", str(tmp_path))

    @pytest.mark.parametrize(
        "values",
        [
            {"admin_tokens": ["a1"], "gateway_tokens": ["a1"]},
            {"admin_tokens": ["ops:a1"], "admin_readonly_tokens": ["a1"]},
            {"admin_tokens": ["ops:a1", "other:a1"]},
            {"gateway_tokens": ["g1", "g1"]},
            {"admin_tokens": ["a1"], "metrics_token": "a1"},
            {"admin_readonly_tokens": ["ro:r1"], "metrics_token": "scrape:r1"},
        ],
    )
    def test_a_secret_twice_is_a_start_up_error(self, values: dict[str, Any]) -> None:
        with pytest.raises(ValidationError, match="configured"):
            Settings(**values)

    def test_the_same_name_twice_is_rotation(self) -> None:
        Settings(admin_tokens=["ops:old", "ops:new"], gateway_tokens=["gw:g-old", "gw:g-new"])

    def test_the_command_says_so_in_one_line(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("METERING_ADMIN_TOKENS", "ops:s3cret-value")
        monkeypatch.setenv("METERING_ADMIN_READONLY_TOKENS", "s3cret-value")
        assert main(["migrate"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("configuration error: "), err
        assert "METERING_ADMIN_TOKENS" in err and "METERING_ADMIN_READONLY_TOKENS" in err
        assert "s3cret-value" not in err

    @pytest.mark.parametrize(
        ("name", "value", "says"),
        [
            ("METERING_HOLD_TTL_SECONDS", "0", "METERING_HOLD_TTL_SECONDS"),
            ("METERING_DB_POOL_SIZE", "many", "METERING_DB_POOL_SIZE"),
            ("METERING_ACCESS_LOG", "perhaps", "METERING_ACCESS_LOG"),
            ("METERING_DEMO", "yes please", "METERING_DEMO"),
        ],
    )
    def test_a_bad_setting_is_one_line(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        name: str,
        value: str,
        says: str,
    ) -> None:
        monkeypatch.setenv(name, value)
        assert main(["migrate"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"configuration error: {says}: "), err


@pytest.fixture(params=APP_BACKENDS)
def operators(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """An app with a named admin token, an unnamed one, a read-only token and a metrics token."""
    with (
        migrated_database(request.param, tmp_path) as url,
        running_api(
            request.param,
            url,
            tmp_path,
            admin_tokens=[f"alice:{ADMIN_SECRET}", UNNAMED_ADMIN],
            admin_readonly_tokens=[f"auditor:{READONLY_SECRET}"],
            metrics_token=f"scraper:{METRICS_SECRET}",
        ) as api,
    ):
        api.admin_headers = {"Authorization": f"Bearer {ADMIN_SECRET}"}
        yield api


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _concrete(path: str, values: dict[str, str], default: str = "x1") -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: values.get(m.group(1), default), path)


def _admin_routes(api: Api) -> list[tuple[str, str]]:
    routes = []
    for route in http_routes(api.client.app):  # type: ignore[arg-type]
        if route.path.startswith("/admin/v1/"):
            routes += [(method, route.path) for method in sorted(route.methods)]
    return routes


def _counts(api: Api) -> tuple[int, int]:
    with api.database.unit_of_work() as session:
        accounts = session.execute(select(func.count()).select_from(Account)).scalar_one()
        events = session.execute(select(func.count()).select_from(AuditEvent)).scalar_one()
    return int(accounts), int(events)


class TestNamedTokens:
    def test_the_client_sends_only_the_secret(self, operators: Api) -> None:
        served = operators.client.get("/admin/v1/accounts", headers=bearer(ADMIN_SECRET))
        assert served.status_code == 200, served.text
        assert isinstance(served.json()["data"], list), served.text
        response = operators.client.get(
            "/admin/v1/accounts", headers=bearer(f"alice:{ADMIN_SECRET}")
        )
        assert_error(response, 401, "invalid_api_key")

    def test_the_actor_is_the_tokens_name(self, operators: Api) -> None:
        first = create_account(operators)
        operators.admin_headers = bearer(UNNAMED_ADMIN)
        second = create_account(operators)
        events = operators.admin("GET", "/admin/v1/audit-events").json()["data"]
        actors = {event["account_id"]: event["actor"] for event in events}
        assert actors[first] == "alice"
        assert actors[second] == sha8(UNNAMED_ADMIN)


class TestReadOnlyTokens:
    def test_every_get_under_admin_is_allowed(self, operators: Api) -> None:
        account = create_account(operators)
        key = create_key(operators, account)
        values = {"account_id": account, "key_id": key.id}
        gets = [(m, p) for m, p in _admin_routes(operators) if m == "GET"]
        assert len(gets) >= 10
        served = 0
        for _, path in gets:
            # The read-only token gets what the admin token gets: the same status and body.
            answers = [
                operators.client.get(
                    _concrete(path, values),
                    params={"account_id": account} if path.endswith("{request_id}") else None,
                    headers=bearer(secret),
                )
                for secret in (ADMIN_SECRET, READONLY_SECRET)
            ]
            admin, readonly = answers
            assert admin.status_code in (200, 404), (path, admin.text)
            assert readonly.status_code == admin.status_code, (path, readonly.text)
            if admin.status_code == 200:
                served += 1
                assert readonly.content == admin.content, path
            else:
                assert readonly.json()["error"]["code"] == admin.json()["error"]["code"], path
        assert served >= 10, served
        listed = operators.client.get("/admin/v1/accounts", headers=bearer(READONLY_SECRET))
        assert account in {a["id"] for a in listed.json()["data"]}

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(b'{"name": "valid"}', id="plausible"),
            pytest.param(b"{not json", id="malformed"),
            pytest.param(b"-2.87e-43", id="bare-scalar"),
            pytest.param(b"", id="empty"),
            pytest.param(b'{"unknown_field": [1, 2], "amount_cents": "x"}', id="invalid"),
        ],
    )
    def test_any_other_method_is_403_before_any_validation(
        self, operators: Api, body: bytes
    ) -> None:
        account = create_account(operators)
        key = create_key(operators, account)
        values = {"account_id": account, "key_id": key.id}
        changes = [(m, p) for m, p in _admin_routes(operators) if m not in ("GET", "HEAD")]
        assert len(changes) >= 10
        before = _counts(operators)
        for method, path in changes:
            for where in (_concrete(path, values), _concrete(path, {}, "x%00") + "?limit=1.5"):
                response = operators.client.request(
                    method,
                    where,
                    content=body,
                    headers={**bearer(READONLY_SECRET), "Content-Type": "application/json"},
                )
                assert_error(response, 403, "read_only_token")
        assert _counts(operators) == before
        keys = operators.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
        assert [(k["id"], k["revoked_at"]) for k in keys] == [(key.id, None)]

    def test_not_a_gateway_or_metrics_credential(self, operators: Api) -> None:
        response = operators.client.post(
            "/v1/authorizations", headers=bearer(READONLY_SECRET), json={}
        )
        assert_error(response, 401, "invalid_api_key")
        assert_error(
            operators.client.get("/metrics", headers=bearer(READONLY_SECRET)),
            401,
            "invalid_api_key",
        )

    def test_admin_tokens_still_change_things(self, operators: Api) -> None:
        before = _counts(operators)
        create_account(operators, name=unique("rw"))
        assert _counts(operators) == (before[0] + 1, before[1] + 1)


class TestMetricsToken:
    def test_set_it_asks_for_the_metrics_or_an_admin_token(self, operators: Api) -> None:
        client = operators.client
        assert_error(client.get("/metrics"), 401, "missing_api_key")
        assert_error(client.get("/metrics", headers=bearer("wrong")), 401, "invalid_api_key")
        assert_error(
            client.get("/metrics", headers={"x-api-key": METRICS_SECRET}), 401, "invalid_api_key"
        )
        assert_error(client.get("/metrics", headers=bearer(GATEWAY_TOKEN)), 401, "invalid_api_key")
        for secret in (METRICS_SECRET, ADMIN_SECRET, UNNAMED_ADMIN):
            response = client.get("/metrics", headers=bearer(secret))
            assert response.status_code == 200, response.text
            assert "metering_http_request_duration_seconds" in response.text
        # The metrics token is nothing else.
        assert_error(
            client.get("/admin/v1/accounts", headers=bearer(METRICS_SECRET)),
            401,
            "invalid_api_key",
        )

    def test_unset_it_is_open(self, api: Api) -> None:
        assert not api.settings.metrics_token
        response = api.client.get("/metrics")
        assert response.status_code == 200, response.text
