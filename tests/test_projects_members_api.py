"""Projects and members through the real admin API and the account key's lists, on every
backend: the Default project, keys bound to a project and a member, archiving and removing in
one transaction, the case-insensitive address, and the audit of every change."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api
from tests.factories import assert_error, create_account, create_key, put_model, unique


def post(api: Api, path: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    response = api.admin("POST", path, json=body)
    assert response.status_code == status, response.text
    return dict(response.json())


def make_project(api: Api, account: str, **body: Any) -> dict[str, Any]:
    return post(api, f"/admin/v1/accounts/{account}/projects", {"name": unique("p"), **body})


def make_member(api: Api, account: str, **body: Any) -> dict[str, Any]:
    fields = {"email": f"{unique('m')}@example.com", "name": "M", "role": "developer", **body}
    return post(api, f"/admin/v1/accounts/{account}/members", fields)


def make_key(api: Api, account: str, **body: Any) -> dict[str, Any]:
    return post(api, f"/admin/v1/accounts/{account}/api-keys", {"name": unique("k"), **body})


def audit(api: Api, account: str, action: str) -> list[dict[str, Any]]:
    response = api.admin(
        "GET", "/admin/v1/audit-events", params={"account_id": account, "action": action}
    )
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def test_an_account_has_a_default_project_its_keys_go_to(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    default = "proj_" + account.removeprefix("acct_")

    shown = api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert [(k["id"], k["project_id"], k["member_id"]) for k in shown] == [(key.id, default, None)]
    listed = api.as_key(key.secret, "GET", "/v1/projects").json()
    assert [(p["id"], p["name"], p["archived_at"]) for p in listed["data"]] == [
        (default, "Default", None)
    ]
    assert api.as_key(key.secret, "GET", "/v1/api-keys").json()["data"][0]["project_id"] == (
        default
    )
    assert api.as_key(key.secret, "GET", "/v1/members").json()["data"] == []


def test_a_project_is_made_changed_listed_and_archived_with_its_keys(api: Api) -> None:
    account = create_account(api)
    model = put_model(api)
    project = make_project(
        api, account, spend_limit_cents=250, spend_limit_window="week", allowed_models=[model]
    )
    assert project["id"].startswith("proj_") and project["object"] == "project"
    assert (project["spend_limit_cents"], project["spend_limit_window"]) == (250, "week")
    assert project["allowed_models"] == [model] and project["archived_at"] is None
    assert api.admin("GET", f"/admin/v1/projects/{project['id']}").json() == project

    changed = api.admin(
        "PATCH",
        f"/admin/v1/projects/{project['id']}",
        json={"name": "renamed", "spend_limit_cents": None, "allowed_models": None},
    ).json()
    assert (changed["name"], changed["spend_limit_cents"], changed["allowed_models"]) == (
        "renamed",
        None,
        None,
    )
    assert changed["spend_limit_window"] == "week"

    inside = make_key(api, account, project_id=project["id"])
    outside = make_key(api, account)
    assert inside["project_id"] == project["id"]

    archived = api.admin("DELETE", f"/admin/v1/projects/{project['id']}").json()
    assert archived["archived_at"] is not None
    assert api.as_key(inside["key"], "GET", "/v1/credits").status_code == 401
    assert api.as_key(outside["key"], "GET", "/v1/credits").status_code == 200
    again = api.admin("DELETE", f"/admin/v1/projects/{project['id']}").json()
    assert again == archived

    refused = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={"name": "late", "project_id": project["id"]},
    )
    assert_error(refused, 400, "invalid_parameter", param="project_id")

    ids = [
        p["id"] for p in api.admin("GET", f"/admin/v1/accounts/{account}/projects").json()["data"]
    ]
    assert sorted(ids) == sorted(["proj_" + account.removeprefix("acct_"), project["id"]])

    (created,) = audit(api, account, "project.create")
    assert created["target_id"] == project["id"]
    (updated,) = audit(api, account, "project.update")
    assert updated["changes"] == {
        "name": "renamed",
        "spend_limit_cents": None,
        "allowed_models": None,
    }
    (archive,) = audit(api, account, "project.archive")
    assert archive["changes"]["revoked_api_key_ids"] == [inside["id"]]


def test_a_member_is_unique_by_address_and_removal_revokes_its_keys(api: Api) -> None:
    account = create_account(api)
    other = create_account(api)
    member = make_member(api, account, email="Ada@Example.com", role="admin", spend_limit_cents=5)
    assert member["id"].startswith("mem_") and member["object"] == "member"
    assert (member["email"], member["role"], member["spend_limit_cents"]) == (
        "Ada@Example.com",
        "admin",
        5,
    )
    twin = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/members",
        json={"email": "ada@example.COM", "name": "twin", "role": "viewer"},
    )
    assert_error(twin, 409, "member_exists", param="email")
    make_member(api, other, email="ada@example.com")  # another account's people are its own

    owned = make_key(api, account, member_id=member["id"])
    service = make_key(api, account)
    assert (owned["member_id"], service["member_id"]) == (member["id"], None)
    foreign = api.admin(
        "POST",
        f"/admin/v1/accounts/{other}/api-keys",
        json={"name": "x", "member_id": member["id"]},
    )
    assert_error(foreign, 400, "invalid_parameter", param="member_id")

    changed = api.admin(
        "PATCH",
        f"/admin/v1/members/{member['id']}",
        json={"role": "viewer", "email": "ADA@example.com"},
    ).json()
    assert (changed["role"], changed["email"]) == ("viewer", "ADA@example.com")

    removed = api.admin("DELETE", f"/admin/v1/members/{member['id']}").json()
    assert removed["removed_at"] is not None
    assert api.as_key(owned["key"], "GET", "/v1/credits").status_code == 401
    assert api.as_key(service["key"], "GET", "/v1/credits").status_code == 200
    # The key keeps its member: what it spent stays attributed to it.
    keys = api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert {k["id"]: k["member_id"] for k in keys} == {
        owned["id"]: member["id"],
        service["id"]: None,
    }
    late = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={"name": "x", "member_id": member["id"]},
    )
    assert_error(late, 400, "invalid_parameter", param="member_id")
    # The address is free again once its member is removed.
    make_member(api, account, email="ada@example.com")

    listed = api.as_key(service["key"], "GET", "/v1/members").json()["data"]
    assert member["id"] in [m["id"] for m in listed] and len(listed) == 2
    (remove,) = audit(api, account, "member.remove")
    assert remove["changes"]["revoked_api_key_ids"] == [owned["id"]]
    assert len(audit(api, account, "member.create")) == 2
    assert len(audit(api, account, "member.update")) == 1


def test_bad_input_is_refused_and_changes_nothing(api: Api) -> None:
    account = create_account(api)
    path = f"/admin/v1/accounts/{account}/members"
    for body, param in (
        ({"email": "no-at-sign", "role": "admin"}, "email"),
        ({"email": "a@b.c", "role": "owner"}, "role"),
        ({"email": "a@b.c", "spend_limit_cents": -1}, "spend_limit_cents"),
        ({"email": "a@b.c", "spend_limit_window": "year"}, "spend_limit_window"),
    ):
        response = api.admin("POST", path, json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
    assert api.admin("GET", path).json()["data"] == []
    bad = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/projects",
        json={"name": "x", "allowed_models": ["nope"]},
    )
    assert_error(bad, 400, "invalid_parameter", param="allowed_models")
    assert len(api.admin("GET", f"/admin/v1/accounts/{account}/projects").json()["data"]) == 1
    assert_error(
        api.admin("GET", "/admin/v1/projects/proj_nope"), 404, "not_found", param="project_id"
    )
    assert_error(
        api.admin("GET", "/admin/v1/members/mem_nope"), 404, "not_found", param="member_id"
    )
    unknown = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={"name": "x", "project_id": "proj_nope"},
    )
    assert_error(unknown, 400, "invalid_parameter", param="project_id")
    assert api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"] == []


def test_a_sign_in_link_names_a_current_member_of_the_account(api: Api) -> None:
    account = create_account(api)
    other = create_account(api)
    member = make_member(api, account, role="viewer")
    path = f"/admin/v1/accounts/{account}/portal-sessions"
    made = api.admin("POST", path, json={"member_id": member["id"]})
    assert made.status_code == 201, made.text
    assert made.json()["member_id"] == member["id"]
    assert api.admin("POST", path).json()["member_id"] is None
    foreign = api.admin(
        "POST", f"/admin/v1/accounts/{other}/portal-sessions", json={"member_id": member["id"]}
    )
    assert_error(foreign, 400, "invalid_parameter", param="member_id")
    api.admin("DELETE", f"/admin/v1/members/{member['id']}")
    removed = api.admin("POST", path, json={"member_id": member["id"]})
    assert_error(removed, 400, "invalid_parameter", param="member_id")


def _pages(api: Api, secret: str, path: str, limit: int) -> list[dict[str, Any]]:
    """Every page of an account key's list, following ``next_cursor``."""
    pages: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        response = api.as_key(secret, "GET", path, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "list"
        pages.append(body)
        if not body["has_more"]:
            assert body["next_cursor"] is None
            return pages
        params = {"limit": limit, "after": body["next_cursor"]}


def test_the_account_keys_lists_of_projects_and_members_are_paginated(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    other = create_account(api)
    make_project(api, other)
    make_member(api, other)
    default = api.admin("GET", f"/admin/v1/projects/proj_{account.removeprefix('acct_')}").json()
    made_projects = [default] + [make_project(api, account) for _ in range(4)]
    made_members = [make_member(api, account) for _ in range(5)]
    archived = api.admin("DELETE", f"/admin/v1/projects/{made_projects[2]['id']}")
    removed = api.admin("DELETE", f"/admin/v1/members/{made_members[1]['id']}")
    assert archived.status_code == 200 and archived.json()["archived_at"] is not None
    assert removed.status_code == 200 and removed.json()["removed_at"] is not None
    made_projects[2], made_members[1] = archived.json(), removed.json()

    for path, made in (("/v1/projects", made_projects), ("/v1/members", made_members)):
        # Oldest first (ties by id); archived and removed ones included; the bodies the
        # operator's routes answer.
        expected = sorted(made, key=lambda row: (row["created_at"], row["id"]))
        pages = _pages(api, key.secret, path, limit=2)
        assert [len(page["data"]) for page in pages] == [2, 2, 1]
        assert [page["has_more"] for page in pages] == [True, True, False]
        assert [row for page in pages for row in page["data"]] == expected
        whole = api.as_key(key.secret, "GET", path, params={"limit": 5})
        assert whole.status_code == 200, whole.text
        assert (whole.json()["data"], whole.json()["has_more"]) == (expected, False)
        for bad in ({"limit": 0}, {"limit": 1001}, {"after": "not a cursor!"}):
            refused = api.as_key(key.secret, "GET", path, params=bad)
            assert_error(refused, 400, "invalid_parameter", param=next(iter(bad)))
