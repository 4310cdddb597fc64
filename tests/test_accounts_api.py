"""Accounts and API keys (docs/api.md#accounts-and-keys) through the real admin API, on both
backends."""

from __future__ import annotations

import base64
import hashlib
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from metering.kit.pagination import encode_cursor
from metering.models import ApiKey
from tests.conftest import NOW, Api
from tests.factories import assert_error, create_account, create_key, expect, unique

NOW_TEXT = "2026-11-29T12:00:00Z"


def patch_key(api: Api, key_id: str, body: bytes) -> Any:
    headers = {**api.admin_headers, "Content-Type": "application/json"}
    return api.client.patch(f"/admin/v1/api-keys/{key_id}", content=body, headers=headers)


def list_all(api: Api, path: str, limit: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Every item of a paginated list, following ``next_cursor``; also each page's body."""
    ids: list[str] = []
    pages: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        response = api.admin("GET", path, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "list"
        pages.append(body)
        ids += [item["id"] for item in body["data"]]
        if not body["has_more"]:
            assert body["next_cursor"] is None
            return ids, pages
        assert body["next_cursor"]
        params = {"limit": limit, "after": body["next_cursor"]}


class TestCreateAccount:
    @pytest.mark.parametrize("billing", ["prepaid", "unbilled"])
    def test_create_and_get(self, api: Api, billing: str) -> None:
        name = unique("Acme Corp")
        response = api.admin("POST", "/admin/v1/accounts", json={"name": name, "billing": billing})
        assert response.status_code == 201, response.text
        account = response.json()
        assert account["id"].startswith("acct_") and len(account["id"]) > 10
        assert account == {
            "id": account["id"],
            "object": "account",
            "name": name,
            "billing": billing,
            "created_at": NOW_TEXT,
            "max_concurrent_requests": None,
            "model_access": None,
            "low_balance_threshold_cents": None,
            "low_balance_threshold_microcents": None,
        }
        fetched = api.admin("GET", f"/admin/v1/accounts/{account['id']}")
        assert (fetched.status_code, fetched.json()) == (200, account)

    def test_ids_are_distinct(self, api: Api) -> None:
        assert create_account(api) != create_account(api)

    @pytest.mark.parametrize(
        ("body", "code", "param"),
        [
            ({"billing": "prepaid"}, "missing_parameter", "name"),
            ({"name": "", "billing": "prepaid"}, "invalid_parameter", "name"),
            ({"name": "x" * 201, "billing": "prepaid"}, "invalid_parameter", "name"),
            ({"name": None, "billing": "prepaid"}, "invalid_parameter", "name"),
            ({"name": "a", "billing": "postpaid"}, "unsupported_value", "billing"),
            ({"name": "a", "billing": "PREPAID"}, "unsupported_value", "billing"),
            ({"name": "a", "billing": "prepaid", "balance": 5}, "invalid_parameter", "balance"),
        ],
    )
    def test_validation(self, api: Api, body: dict[str, Any], code: str, param: str) -> None:
        response = api.admin("POST", "/admin/v1/accounts", json=body)
        assert_error(response, 400, code, param=param)

    def test_unknown_account_is_404(self, api: Api) -> None:
        response = api.admin("GET", "/admin/v1/accounts/acct_doesnotexist")
        assert_error(response, 404, "not_found", param="account_id")


class TestListAccounts:
    def test_pagination_walks_every_account_once_oldest_first(self, fresh_api: Api) -> None:
        created = []
        for _ in range(5):
            created.append(create_account(fresh_api))
            fresh_api.clock.advance(seconds=1)
        # Two created in the same instant are still both listed (ties broken by id).
        created += sorted([create_account(fresh_api), create_account(fresh_api)])

        ids, pages = list_all(fresh_api, "/admin/v1/accounts", limit=2)
        assert ids == created
        assert [len(page["data"]) for page in pages] == [2, 2, 2, 1]
        assert [page["has_more"] for page in pages] == [True, True, True, False]

        everything = fresh_api.admin("GET", "/admin/v1/accounts").json()
        assert [a["id"] for a in everything["data"]] == created
        assert everything["has_more"] is False and everything["next_cursor"] is None

        exactly = fresh_api.admin("GET", "/admin/v1/accounts", params={"limit": 7}).json()
        assert len(exactly["data"]) == 7 and exactly["has_more"] is False

    @pytest.mark.parametrize("limit", [1, 1000])
    def test_limit_bounds_accepted(self, api: Api, limit: int) -> None:
        response = api.admin("GET", "/admin/v1/accounts", params={"limit": limit})
        assert response.status_code == 200, response.text
        assert len(response.json()["data"]) <= limit

    @pytest.mark.parametrize("limit", [0, 1001])
    def test_limit_out_of_bounds(self, api: Api, limit: int) -> None:
        response = api.admin("GET", "/admin/v1/accounts", params={"limit": limit})
        assert_error(response, 400, "invalid_parameter", param="limit")

    @pytest.mark.parametrize(
        ("cursor", "code"),
        [
            pytest.param("not a cursor!", "invalid_parameter", id="garbage"),
            pytest.param("e30", "invalid_parameter", id="base64-of-object"),
            pytest.param(encode_cursor("GLM-5.3"), "invalid_parameter", id="other-lists-cursor"),
            pytest.param(encode_cursor("yesterday", "a"), "invalid_timestamp", id="bad-timestamp"),
            pytest.param("x" * 501, "invalid_parameter", id="too-long"),
        ],
    )
    def test_bad_cursor_is_400_naming_after(self, api: Api, cursor: str, code: str) -> None:
        response = api.admin("GET", "/admin/v1/accounts", params={"after": cursor})
        assert_error(response, 400, code, param="after")


class TestCreateKey:
    def test_secret_is_shown_once_and_only_its_hash_is_stored(self, api: Api) -> None:
        account_id = create_account(api)
        name = unique("ci")
        response = api.admin(
            "POST", f"/admin/v1/accounts/{account_id}/api-keys", json={"name": name}
        )
        assert response.status_code == 201, response.text
        body = response.json()
        secret = body["key"]
        assert body["id"].startswith("key_")
        assert body["account_id"] == account_id and body["name"] == name
        assert body["monthly_spend_limit_cents"] is None
        assert body["created_at"] == NOW_TEXT and body["revoked_at"] is None
        # A recognisable prefix and at least 128 random bits.
        assert secret.startswith("mk_")
        random_part = secret.removeprefix("mk_")
        assert len(base64.urlsafe_b64decode(random_part + "=" * (-len(random_part) % 4))) >= 16
        assert secret.startswith(body["prefix"]) and len(body["prefix"]) < len(secret) // 2

        # Never shown again.
        listed = api.admin("GET", f"/admin/v1/accounts/{account_id}/api-keys").json()["data"]
        assert [k["id"] for k in listed] == [body["id"]]
        assert "key" not in listed[0] and secret not in str(listed)
        assert secret not in api.admin("PATCH", f"/admin/v1/api-keys/{body['id']}", json={}).text

        # Only the SHA-256 hash is in the database.
        with api.database.unit_of_work() as session:
            row = session.execute(
                select(*ApiKey.__table__.columns).where(ApiKey.id == body["id"])
            ).one()
        stored = [str(value) for value in row]
        assert not any(secret in value for value in stored)
        assert not any(secret.removeprefix("mk_") in value for value in stored)
        assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()

    def test_keys_are_distinct(self, api: Api) -> None:
        account_id = create_account(api)
        first, second = create_key(api, account_id), create_key(api, account_id)
        assert first.id != second.id and first.secret != second.secret

    def test_key_authenticates_its_account(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        assert api.as_key(key.secret, "GET", "/v1/models").status_code == 200
        assert api.client.get("/v1/models", headers={"x-api-key": key.secret}).status_code == 200

    def test_unknown_account_is_404(self, api: Api) -> None:
        response = api.admin("POST", "/admin/v1/accounts/acct_nope/api-keys", json={"name": "k"})
        assert_error(response, 404, "not_found", param="account_id")

    def test_validation(self, api: Api) -> None:
        path = f"/admin/v1/accounts/{create_account(api)}/api-keys"
        assert_error(api.admin("POST", path, json={}), 400, "missing_parameter", param="name")
        response = api.admin("POST", path, json={"name": "k", "monthly_spend_limit_cents": -1})
        assert_error(response, 400, "invalid_parameter", param="monthly_spend_limit_cents")
        response = api.admin("POST", path, json={"name": "k", "scopes": ["all"]})
        assert_error(response, 400, "invalid_parameter", param="scopes")
        assert api.admin("GET", path).json()["data"] == []

    def test_list_keys_paginated_revoked_included(self, api: Api) -> None:
        account_id = create_account(api)
        created = []
        for _ in range(3):
            created.append(create_key(api, account_id).id)
            api.clock.advance(seconds=1)
        expect(api.admin("DELETE", f"/admin/v1/api-keys/{created[0]}"), 200)
        other = create_key(api, create_account(api))

        ids, pages = list_all(api, f"/admin/v1/accounts/{account_id}/api-keys", limit=2)
        assert ids == created and other.id not in ids
        assert [page["has_more"] for page in pages] == [True, False]
        assert pages[0]["data"][0]["revoked_at"] is not None

        response = api.admin("GET", "/admin/v1/accounts/acct_nope/api-keys")
        assert_error(response, 404, "not_found", param="account_id")
        response = api.admin("GET", f"/admin/v1/accounts/{account_id}/api-keys?after=zz")
        assert_error(response, 400, "invalid_parameter", param="after")


class TestRevokeKey:
    def test_revoked_key_is_refused_from_then_on(self, api: Api) -> None:
        account_id = create_account(api)
        key, sibling = create_key(api, account_id), create_key(api, account_id)
        assert api.as_key(key.secret, "GET", "/v1/models").status_code == 200

        api.clock.advance(minutes=5)
        response = api.admin("DELETE", f"/admin/v1/api-keys/{key.id}")
        assert response.status_code == 200, response.text
        revoked = response.json()
        assert revoked["id"] == key.id and revoked["revoked_at"] == "2026-11-29T12:05:00Z"

        assert_error(api.as_key(key.secret, "GET", "/v1/models"), 401, "invalid_api_key")
        response = api.client.get("/v1/models", headers={"x-api-key": key.secret})
        assert_error(response, 401, "invalid_api_key")
        # The account's other keys are unaffected.
        assert api.as_key(sibling.secret, "GET", "/v1/models").status_code == 200

        # Revoking twice is harmless and keeps the original revocation time.
        api.clock.advance(minutes=5)
        again = api.admin("DELETE", f"/admin/v1/api-keys/{key.id}")
        assert (again.status_code, again.json()) == (200, revoked)
        assert_error(api.as_key(key.secret, "GET", "/v1/models"), 401, "invalid_api_key")

    def test_unknown_key_is_404(self, api: Api) -> None:
        response = api.admin("DELETE", "/admin/v1/api-keys/key_doesnotexist")
        assert_error(response, 404, "not_found", param="key_id")


class TestPatchKey:
    def test_rename_keeps_the_limit(self, api: Api) -> None:
        key = create_key(api, create_account(api), limit_cents=250)
        response = api.admin("PATCH", f"/admin/v1/api-keys/{key.id}", json={"name": "renamed"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["name"] == "renamed"
        assert (body["monthly_spend_limit_cents"], body["monthly_spend_limit_microcents"]) == (
            250,
            250_000_000,
        )
        listed = api.admin("GET", f"/admin/v1/accounts/{key.account_id}/api-keys").json()
        assert listed["data"][0]["name"] == "renamed"

    def test_limit_set_kept_and_removed(self, api: Api) -> None:
        key = create_key(api, create_account(api), name="original")
        response = patch_key(api, key.id, b'{"monthly_spend_limit_cents": 1.5}')
        assert response.status_code == 200, response.text
        # Rendered exactly, as a JSON number, with the exact microcents beside it.
        assert '"monthly_spend_limit_cents":1.5,' in response.text
        assert response.json()["monthly_spend_limit_microcents"] == 1_500_000
        assert response.json()["name"] == "original"

        unchanged = patch_key(api, key.id, b"{}")
        assert unchanged.json()["monthly_spend_limit_microcents"] == 1_500_000
        renamed = patch_key(api, key.id, b'{"name": "n2"}')
        assert renamed.json()["monthly_spend_limit_microcents"] == 1_500_000

        removed = patch_key(api, key.id, b'{"monthly_spend_limit_cents": null}')
        assert removed.status_code == 200, removed.text
        body = removed.json()
        assert body["monthly_spend_limit_cents"] is None
        assert body["monthly_spend_limit_microcents"] is None
        assert body["name"] == "n2"

    @pytest.mark.parametrize(
        ("sent", "text", "microcents"),
        [
            ("0.000001", "0.000001", 1),
            ("1234567.891011", "1234567.891011", 1_234_567_891_011),
            ("2.50", "2.5", 2_500_000),
            ("1e2", "100", 100_000_000),
            ("0", "0", 0),
            ("9000000000000", "9000000000000", 9 * 10**18),
            ("9e12", "9000000000000", 9 * 10**18),
        ],
    )
    def test_limit_is_exact(self, api: Api, sent: str, text: str, microcents: int) -> None:
        key = create_key(api, create_account(api))
        response = patch_key(api, key.id, f'{{"monthly_spend_limit_cents": {sent}}}'.encode())
        assert response.status_code == 200, response.text
        assert f'"monthly_spend_limit_cents":{text},' in response.text
        assert response.json()["monthly_spend_limit_microcents"] == microcents
        created = api.admin(
            "POST",
            f"/admin/v1/accounts/{key.account_id}/api-keys",
            content=f'{{"name": "k", "monthly_spend_limit_cents": {sent}}}'.encode(),
        )
        assert created.status_code == 201 and f'"monthly_spend_limit_cents":{text},' in created.text

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param("1.1234567", id="7-decimals"),
            pytest.param("0.0000001", id="below-a-microcent"),
            pytest.param('"5"', id="string"),
            pytest.param("true", id="boolean"),
            pytest.param("NaN", id="nan"),
            pytest.param("Infinity", id="infinity"),
            pytest.param("-1", id="negative"),
            pytest.param("9000000000000.000001", id="just-over-9e12"),
            pytest.param("1e400", id="huge"),
            pytest.param("[5]", id="array"),
        ],
    )
    def test_invalid_limit_is_400_and_changes_nothing(self, api: Api, value: str) -> None:
        key = create_key(api, create_account(api), limit_cents=7)
        response = patch_key(api, key.id, f'{{"monthly_spend_limit_cents": {value}}}'.encode())
        assert_error(response, 400, "invalid_parameter", param="monthly_spend_limit_cents")
        listed = api.admin("GET", f"/admin/v1/accounts/{key.account_id}/api-keys").json()
        assert listed["data"][0]["monthly_spend_limit_microcents"] == 7_000_000

    def test_invalid_name(self, api: Api) -> None:
        key = create_key(api, create_account(api), name="keep")
        for body in (b'{"name": null}', b'{"name": ""}', b'{"name": 3}'):
            assert_error(patch_key(api, key.id, body), 400, "invalid_parameter", param="name")
        assert_error(
            patch_key(api, key.id, b'{"revoked_at": null}'),
            400,
            "invalid_parameter",
            param="revoked_at",
        )
        listed = api.admin("GET", f"/admin/v1/accounts/{key.account_id}/api-keys").json()
        assert listed["data"][0]["name"] == "keep"

    def test_patch_does_not_revive_a_revoked_key(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        expect(api.admin("DELETE", f"/admin/v1/api-keys/{key.id}"), 200)
        response = api.admin("PATCH", f"/admin/v1/api-keys/{key.id}", json={"name": "again"})
        assert response.status_code == 200 and response.json()["revoked_at"] == NOW_TEXT
        assert_error(api.as_key(key.secret, "GET", "/v1/models"), 401, "invalid_api_key")

    def test_unknown_key_is_404(self, api: Api) -> None:
        response = api.admin("PATCH", "/admin/v1/api-keys/key_nope", json={"name": "x"})
        assert_error(response, 404, "not_found", param="key_id")


def test_admin_routes_need_the_admin_token(api: Api) -> None:
    account_id = create_account(api)
    key = create_key(api, account_id, name="original")
    calls = [
        ("POST", "/admin/v1/accounts", {"name": "x"}),
        ("GET", "/admin/v1/accounts", None),
        ("GET", f"/admin/v1/accounts/{account_id}", None),
        ("POST", f"/admin/v1/accounts/{account_id}/api-keys", {"name": "x"}),
        ("GET", f"/admin/v1/accounts/{account_id}/api-keys", None),
        ("PATCH", f"/admin/v1/api-keys/{key.id}", {"name": "x"}),
        ("DELETE", f"/admin/v1/api-keys/{key.id}", None),
    ]
    for method, path, body in calls:
        assert_error(api.client.request(method, path, json=body), 401, "missing_api_key")
        for token in ("nope", key.secret, api.gateway_headers["Authorization"].split()[1]):
            response = api.as_key(token, method, path, json=body)
            assert_error(response, 401, "invalid_api_key")
    # Nothing above took effect.
    assert api.as_key(key.secret, "GET", "/v1/models").status_code == 200
    keys = api.admin("GET", f"/admin/v1/accounts/{account_id}/api-keys").json()["data"]
    assert [(k["name"], k["revoked_at"]) for k in keys] == [("original", None)]


def test_clock_drives_created_at(api: Api) -> None:
    api.clock.set(NOW + timedelta(days=3, microseconds=250_000))
    account = api.admin("POST", "/admin/v1/accounts", json={"name": "later"}).json()
    assert account["created_at"] == "2026-12-02T12:00:00.25Z"
