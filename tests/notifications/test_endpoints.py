"""Webhook endpoint management (docs/api.md#endpoints): bodies, validation, who sees what, the
address rules at save time, and no signing secret in clear in the database, a dump or the logs."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.conftest import Api, citus_nodes
from tests.factories import assert_error, create_account, create_key, expect
from tests.notifications.conftest import Hooks

PUBLIC = "https://11.22.33.44/hook"  # public for the address rules (TEST-NETs are reserved)


def _create(api: Api, **body: object) -> object:
    return api.admin("POST", "/admin/v1/webhook-endpoints", json=body)


class TestLifecycle:
    def test_create_get_list_patch_rotate_delete(self, hooks: Hooks) -> None:
        api = hooks.api
        account = create_account(api)
        made = _create(
            api,
            url=PUBLIC,
            event_types=["credit.balance_low", "webhook.test"],
            account_id=account,
            description="ops",
        )
        assert made.status_code == 201, made.text
        body = made.json()
        secret = body.pop("secret")
        assert secret.startswith("whsec_") and len(secret) > 40
        assert body == {
            "id": body["id"],
            "object": "webhook_endpoint",
            "url": PUBLIC,
            "event_types": ["credit.balance_low", "webhook.test"],
            "account_id": account,
            "enabled": True,
            "description": "ops",
            "created_at": body["created_at"],
        }
        path = f"/admin/v1/webhook-endpoints/{body['id']}"
        assert api.admin("GET", path).json() == body
        listed = api.admin("GET", "/admin/v1/webhook-endpoints", params={"limit": 1000}).json()
        assert body in listed["data"] and all("secret" not in e for e in listed["data"])
        patched = api.admin("PATCH", path, json={"enabled": False, "event_types": ["webhook.test"]})
        assert patched.status_code == 200, patched.text
        assert (patched.json()["enabled"], patched.json()["event_types"]) == (
            False,
            ["webhook.test"],
        )
        rotated = api.admin("POST", f"{path}/rotate-secret").json()
        assert rotated["secret"].startswith("whsec_") and rotated["secret"] != secret
        assert api.admin("DELETE", path).status_code == 200
        assert_error(api.admin("GET", path), 404, "not_found", param="endpoint_id")
        assert_error(
            api.admin("PATCH", path, json={"enabled": True}), 404, "not_found", param="endpoint_id"
        )

    def test_unknown_types_and_bad_bodies_are_400(self, hooks: Hooks) -> None:
        api = hooks.api
        assert_error(
            _create(api, url=PUBLIC, event_types=["credit.nope"]),
            400,
            "invalid_parameter",
            param="event_types",
        )
        response = _create(api, url=PUBLIC, event_types=[])
        assert response.status_code == 400 and response.json()["error"]["param"] == "event_types"
        response = _create(api, url="x" * 2049, event_types=["webhook.test"])
        assert response.status_code == 400 and response.json()["error"]["param"] == "url"
        assert_error(
            _create(api, url=PUBLIC, event_types=["webhook.test"], account_id="acct_nope"),
            404,
            "not_found",
            param="account_id",
        )
        assert_error(
            _create(api, url="ftp://11.22.33.44/", event_types=["webhook.test"]),
            400,
            "invalid_parameter",
            param="url",
        )

    def test_an_event_type_listed_twice_is_refused_on_every_route(self, hooks: Hooks) -> None:
        api = hooks.api
        account = create_account(api)
        key = create_key(api, account)
        twice = ["webhook.test", "credit.balance_low", "webhook.test"]
        made = _create(api, url=PUBLIC, event_types=["webhook.test"], account_id=account)
        assert made.status_code == 201, made.text
        endpoint = made.json()["id"]
        for response in (
            _create(api, url=PUBLIC, event_types=twice, account_id=account),
            api.as_key(
                key.secret,
                "POST",
                "/v1/webhook-endpoints",
                json={"url": PUBLIC, "event_types": twice},
            ),
            api.admin(
                "PATCH", f"/admin/v1/webhook-endpoints/{endpoint}", json={"event_types": twice}
            ),
            api.as_key(
                key.secret,
                "PATCH",
                f"/v1/webhook-endpoints/{endpoint}",
                json={"event_types": twice},
            ),
        ):
            error = assert_error(response, 400, "invalid_parameter", param="event_types")
            assert "'webhook.test' is listed more than once" in error["message"]
        listed = api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"]
        assert [(e["id"], e["event_types"]) for e in listed] == [(endpoint, ["webhook.test"])]

    def test_an_account_key_sees_and_manages_its_own_endpoints_only(self, hooks: Hooks) -> None:
        api = hooks.api
        account, other = create_account(api), create_account(api)
        key, other_key = create_key(api, account), create_key(api, other)
        by_operator = _create(api, url=PUBLIC, event_types=["webhook.test"], account_id=account)
        made = api.as_key(
            key.secret,
            "POST",
            "/v1/webhook-endpoints",
            json={"url": PUBLIC, "event_types": ["credit.balance_low"]},
        )
        assert made.status_code == 201, made.text
        assert made.json()["account_id"] == account
        mine = api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"]
        assert {e["id"] for e in mine} == {by_operator.json()["id"], made.json()["id"]}
        assert api.as_key(other_key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []
        theirs = f"/v1/webhook-endpoints/{made.json()['id']}"
        assert_error(
            api.as_key(other_key.secret, "GET", theirs), 404, "not_found", param="endpoint_id"
        )
        assert_error(
            api.as_key(other_key.secret, "DELETE", theirs), 404, "not_found", param="endpoint_id"
        )
        assert_error(
            api.as_key(
                key.secret,
                "POST",
                "/v1/webhook-endpoints",
                json={"url": PUBLIC, "event_types": ["usage.quarantined"]},
            ),
            400,
            "invalid_parameter",
            param="event_types",
        )
        # account_id is no field of the account routes.
        response = api.as_key(
            key.secret,
            "POST",
            "/v1/webhook-endpoints",
            json={"url": PUBLIC, "event_types": ["webhook.test"], "account_id": other},
        )
        assert response.status_code == 400
        assert api.client.get("/v1/webhook-endpoints").status_code == 401


class TestAddresses:
    """The shared app refuses private addresses (METERING_WEBHOOK_ALLOW_PRIVATE=false)."""

    @pytest.mark.parametrize(
        "url",
        [
            "http://11.22.33.44/hook",
            "https://127.0.0.1/hook",
            "https://localhost:8443/hook",  # a name that resolves to loopback
            "https://10.1.2.3/",
            "https://172.16.0.1/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://224.0.0.1/",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://[fe80::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://user:pw@11.22.33.44/",
        ],
    )
    def test_refused_at_save(self, api: Api, url: str) -> None:
        assert_error(
            _create(api, url=url, event_types=["webhook.test"]),
            400,
            "invalid_parameter",
            param="url",
        )

    def test_a_public_address_and_an_unresolvable_name_are_accepted(self, api: Api) -> None:
        assert _create(api, url=PUBLIC, event_types=["webhook.test"]).status_code == 201
        response = _create(api, url="https://hooks.invalid/x", event_types=["webhook.test"])
        assert response.status_code == 201, response.text
        endpoint = response.json()["id"]
        refused = api.admin(
            "PATCH", f"/admin/v1/webhook-endpoints/{endpoint}", json={"url": "https://127.0.0.1/"}
        )
        assert_error(refused, 400, "invalid_parameter", param="url")
        expect(api.admin("DELETE", f"/admin/v1/webhook-endpoints/{endpoint}"), 200)


class TestSecretsAtRest:
    def test_no_signing_secret_in_clear_in_the_database_dump_or_logs(
        self, hooks: Hooks, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        api = hooks.api
        caplog.set_level(logging.DEBUG)
        made = _create(api, url=PUBLIC, event_types=["webhook.test"]).json()
        path = f"/admin/v1/webhook-endpoints/{made['id']}"
        rotated = api.admin("POST", f"{path}/rotate-secret").json()
        secrets = [made["secret"], rotated["secret"]]
        raw = [s.removeprefix("whsec_") for s in secrets]
        if api.backend in ("postgresql", "citus"):
            # On a cluster, every node's database (the workers' shards too).
            urls = [make_url(api.url)]
            if api.backend == "citus":
                urls = [make_url(n).set(database=urls[0].database) for n in citus_nodes()]
            dump = "".join(
                subprocess.run(
                    ["pg_dump", "-h", url.host or "127.0.0.1", "-U", url.username or "postgres",
                     "-p", str(url.port or 5432), url.database or ""],
                    check=True, capture_output=True, text=True,
                ).stdout
                for url in urls
            )  # fmt: skip
            assert "webhook_endpoints" in dump
        else:
            dump = Path(make_url(api.url).database or "").read_bytes().decode("latin-1")
            with api.database.reading() as session:
                dump += "\n".join(
                    str(row) for row in session.execute(text("SELECT * FROM webhook_endpoints"))
                )
                dump += "\n".join(
                    str(row) for row in session.execute(text("SELECT * FROM audit_events"))
                )
        for value in secrets + raw:
            assert value not in dump
            assert value not in caplog.text
        audit = api.admin(
            "GET", "/admin/v1/audit-events", params={"action": "webhook_endpoint.rotate"}
        )
        assert audit.json()["data"][0]["changes"]["secret"] == "[redacted]"
