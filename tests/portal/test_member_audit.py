"""Every change a member makes in the portal is audited with the member as its actor
(``portal:<mem_…>``), whatever page it is made on: keys, members, projects, webhook endpoints;
a session signed in with the account's link stays ``portal:<acct_…>``. Driven over HTTP through
the real app, each change checked in the JSON API too."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import Api
from tests.factories import create_account, create_key, unique
from tests.portal.test_portal_http import CSRF, _client, _sign_in
from tests.portal.test_portal_pages import PUBLIC


def _member(api: Api, account: str, role: str) -> dict[str, Any]:
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/members",
        json={"email": f"{unique(role)}@example.com", "name": role, "role": role},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def _signed_in_as(api: Api, account: str, member_id: str | None) -> tuple[TestClient, str]:
    """A portal session (the member's, or the account's with None) and its form token."""
    body = {"member_id": member_id} if member_id else {}
    response = api.admin("POST", f"/admin/v1/accounts/{account}/portal-sessions", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["member_id"] == member_id
    client = _client(api)
    path = str(response.json()["url"]).removeprefix("http://testserver")
    signed_in = _sign_in(client, path)
    assert signed_in.status_code == 303, signed_in.text  # type: ignore[attr-defined]
    page = client.get("/billing/keys")
    assert page.status_code == 200, page.text
    match = CSRF.search(page.text)
    assert match
    return client, match.group(1)


def _audit(api: Api, account: str) -> list[dict[str, Any]]:
    response = api.admin("GET", "/admin/v1/audit-events", params={"account_id": account})
    assert response.status_code == 200, response.text
    assert response.json()["has_more"] is False
    return [e for e in response.json()["data"] if e["actor"].startswith("portal:")]


def _made_key(client: TestClient, csrf: str, name: str, project: str = "") -> str:
    """A key made on the Keys page; its secret, shown once."""
    data = {"csrf_token": csrf, "name": name, "project_id": project}
    made = client.post("/billing/keys", data=data)
    assert made.status_code == 200, made.text
    secret = re.search(r'id="created-secret" value="(mk_[^"]+)"', made.text)
    assert secret, made.text
    return secret.group(1)


def test_an_admin_members_changes_are_audited_as_the_member(api: Api) -> None:
    account = create_account(api)
    service_key = create_key(api, account)
    admin = _member(api, account, "admin")
    client, csrf = _signed_in_as(api, account, admin["id"])
    actor = f"portal:{admin['id']}"

    added = client.post(
        "/billing/members",
        data={"csrf_token": csrf, "email": "dev@example.com", "name": "Dev", "role": "developer"},
    )
    assert added.status_code == 200, added.text
    (dev,) = [
        m
        for m in api.as_key(service_key.secret, "GET", "/v1/members").json()["data"]
        if m["email"] == "dev@example.com"
    ]
    assert (dev["role"], dev["removed_at"]) == ("developer", None)

    made = client.post(
        "/billing/projects", data={"csrf_token": csrf, "name": "research"}, follow_redirects=False
    )
    assert made.status_code == 303, made.text
    listed = api.as_key(service_key.secret, "GET", "/v1/projects").json()["data"]
    (project,) = [p for p in listed if p["name"] == "research"]

    secret = _made_key(client, csrf, "ci", project["id"])
    keys = api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    (key,) = [k for k in keys if k["name"] == "ci"]
    assert (key["project_id"], key["member_id"]) == (project["id"], admin["id"])
    renamed = client.post(
        f"/billing/keys/{key['id']}/rename",
        data={"csrf_token": csrf, "name": "ci-2"},
        follow_redirects=False,
    )
    assert renamed.status_code == 303, renamed.text
    revoked = client.post(
        f"/billing/keys/{key['id']}/revoke", data={"csrf_token": csrf}, follow_redirects=False
    )
    assert revoked.status_code == 303, revoked.text
    keys = api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert [(k["name"], k["revoked_at"] is not None) for k in keys if k["id"] == key["id"]] == [
        ("ci-2", True)
    ]

    hook = client.post(
        "/billing/notifications",
        data={"csrf_token": csrf, "url": PUBLIC, "type:credit.balance_low": "on"},
    )
    assert hook.status_code == 200, hook.text
    (endpoint,) = api.as_key(service_key.secret, "GET", "/v1/webhook-endpoints").json()["data"]
    disabled = client.post(
        f"/billing/notifications/{endpoint['id']}/disable", data={"csrf_token": csrf}
    )
    assert disabled.status_code == 200, disabled.text
    deleted = client.post(
        f"/billing/notifications/{endpoint['id']}/delete", data={"csrf_token": csrf}
    )
    assert deleted.status_code == 200, deleted.text
    assert api.as_key(service_key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []

    archived = client.post(
        f"/billing/projects/{project['id']}/archive",
        data={"csrf_token": csrf},
        follow_redirects=False,
    )
    assert archived.status_code == 303, archived.text
    removed = client.post(
        f"/billing/members/{dev['id']}/remove", data={"csrf_token": csrf}, follow_redirects=False
    )
    assert removed.status_code == 303, removed.text
    projects = api.as_key(service_key.secret, "GET", "/v1/projects").json()["data"]
    assert [p["archived_at"] is not None for p in projects if p["id"] == project["id"]] == [True]
    members = api.as_key(service_key.secret, "GET", "/v1/members").json()["data"]
    assert [m["removed_at"] is not None for m in members if m["id"] == dev["id"]] == [True]

    events = _audit(api, account)
    assert sorted((e["action"], e["target_id"], e["actor"]) for e in events) == sorted(
        [
            ("member.create", dev["id"], actor),
            ("project.create", project["id"], actor),
            ("api_key.create", key["id"], actor),
            ("api_key.update", key["id"], actor),
            ("api_key.revoke", key["id"], actor),
            ("webhook_endpoint.create", endpoint["id"], actor),
            ("webhook_endpoint.update", endpoint["id"], actor),
            ("webhook_endpoint.delete", endpoint["id"], actor),
            ("project.archive", project["id"], actor),
            ("member.remove", dev["id"], actor),
        ]
    )
    assert secret not in str(events)


def test_a_developers_own_keys_are_audited_as_the_developer_and_the_links_as_the_account(
    api: Api,
) -> None:
    account = create_account(api)
    developer = _member(api, account, "developer")
    client, csrf = _signed_in_as(api, account, developer["id"])
    _made_key(client, csrf, "laptop")
    (key,) = api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert key["member_id"] == developer["id"]
    revoked = client.post(
        f"/billing/keys/{key['id']}/revoke", data={"csrf_token": csrf}, follow_redirects=False
    )
    assert revoked.status_code == 303, revoked.text

    owner, owner_csrf = _signed_in_as(api, account, None)
    made = owner.post(
        "/billing/projects", data={"csrf_token": owner_csrf, "name": "p"}, follow_redirects=False
    )
    assert made.status_code == 303, made.text

    events = _audit(api, account)
    assert sorted((e["action"], e["actor"]) for e in events) == sorted(
        [
            ("api_key.create", f"portal:{developer['id']}"),
            ("api_key.revoke", f"portal:{developer['id']}"),
            ("project.create", f"portal:{account}"),
        ]
    )
