"""Admins change projects and members in the portal (over HTTP, on every backend): a project
renamed and given a spend limit (dollars; blank removes it), a member's name, role and limit,
each as the admin routes show it afterwards and audited as the portal's actor; a refused value
shows the page again (400) and changes nothing, as does an edit of an archived project or a
removed member; a developer may not; the Default project is
never archived, by the portal (a 400 page that says so, and no Archive button) or by
``DELETE /admin/v1/projects/{id}`` (400 ``default_project``). In Chromium: the forms are
axe-clean."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from selenium.webdriver.common.by import By

from tests.conftest import Api
from tests.factories import assert_error, create_account, exact_json, unique
from tests.portal.browser import Browser, sign_in_link
from tests.portal.test_portal_http import CSRF, _client, _link, _sign_in


def _signed_in(api: Api, path: str) -> TestClient:
    client = _client(api)
    assert _sign_in(client, path).status_code == 303  # type: ignore[attr-defined]
    return client


def _csrf(client: TestClient, page: str) -> str:
    response = client.get(page)
    assert response.status_code == 200, response.text
    match = CSRF.search(response.text)
    assert match
    return match.group(1)


def _post(client: TestClient, path: str, page: str, **fields: str) -> Any:
    data = {"csrf_token": _csrf(client, page), **fields}
    return client.post(path, data=data, follow_redirects=False)


def _admin_get(api: Api, path: str) -> dict[str, Any]:
    response = api.admin("GET", path)
    assert response.status_code == 200, response.text
    return dict(exact_json(response))


def _audited(api: Api, account: str, action: str) -> list[dict[str, Any]]:
    response = api.admin(
        "GET", "/admin/v1/audit-events", params={"account_id": account, "action": action}
    )
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def _project(api: Api, account: str) -> dict[str, Any]:
    response = api.admin(
        "POST", f"/admin/v1/accounts/{account}/projects", json={"name": unique("proj")}
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def _member(api: Api, account: str, role: str = "developer") -> dict[str, Any]:
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/members",
        json={"email": f"{unique(role)}@example.com", "role": role},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def _member_link(api: Api, account: str, member_id: str) -> str:
    response = api.admin(
        "POST", f"/admin/v1/accounts/{account}/portal-sessions", json={"member_id": member_id}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["url"]).removeprefix("http://testserver")


def _default(account: str) -> str:
    return "proj_" + account.removeprefix("acct_")


class TestProjects:
    def test_an_admin_renames_a_project_and_sets_then_removes_its_limit(self, api: Api) -> None:
        account = create_account(api)
        project = _project(api, account)
        admin = _member(api, account, "admin")
        client = _signed_in(api, _member_link(api, account, admin["id"]))
        edit = f"/billing/projects/{project['id']}/edit"
        answer = _post(
            client,
            edit,
            "/billing/projects",
            name="research",
            spend_limit="25.50",
            spend_limit_window="day",
        )
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/billing/projects"
        shown = _admin_get(api, f"/admin/v1/projects/{project['id']}")
        assert (shown["name"], shown["spend_limit_window"]) == ("research", "day")
        assert (shown["spend_limit_cents"], shown["spend_limit_microcents"]) == (
            Decimal("2550"),
            2_550_000_000,
        )
        (event,) = _audited(api, account, "project.update")
        assert event["actor"] == f"portal:{admin['id']}"
        assert event["target_id"] == project["id"]
        assert event["changes"]["name"] == "research"
        page = client.get("/billing/projects")
        assert page.status_code == 200, page.text
        assert f'id="limit-{project["id"]}" name="spend_limit" value="25.5"' in page.text

        answer = _post(client, edit, "/billing/projects", name="research", spend_limit="")
        assert answer.status_code == 303, answer.text
        shown = _admin_get(api, f"/admin/v1/projects/{project['id']}")
        assert (shown["spend_limit_cents"], shown["spend_limit_window"]) == (None, "month")

    def test_a_refused_value_shows_the_page_again_and_changes_nothing(self, api: Api) -> None:
        account = create_account(api)
        project = _project(api, account)
        client = _signed_in(api, _link(api, account))
        edit = f"/billing/projects/{project['id']}/edit"
        for fields, problem in (
            ({"name": "x", "spend_limit": "ten"}, "spend limit: enter dollars"),
            ({"name": "x", "spend_limit": "-1"}, "spend limit: enter dollars"),
            ({"name": "", "spend_limit": "1"}, "name:"),
            ({"name": "x", "spend_limit_window": "year"}, "spend_limit_window:"),
        ):
            answer = _post(client, edit, "/billing/projects", **fields)
            assert answer.status_code == 400, answer.text
            assert re.search(r'id="problem">[^<]*' + re.escape(problem), answer.text), fields
        assert _admin_get(api, f"/admin/v1/projects/{project['id']}") == project
        assert _audited(api, account, "project.update") == []

    def test_the_default_project_is_never_archived(self, api: Api) -> None:
        account = create_account(api)
        other = _project(api, account)
        client = _signed_in(api, _link(api, account))
        page = client.get("/billing/projects")
        assert page.status_code == 200, page.text
        assert f'action="/billing/projects/{other["id"]}/archive"' in page.text
        assert f'action="/billing/projects/{_default(account)}/archive"' not in page.text

        answer = _post(
            client, f"/billing/projects/{_default(account)}/archive", "/billing/projects"
        )
        assert answer.status_code == 400, answer.text
        assert "the Default project cannot be archived" in answer.text
        refused = api.admin("DELETE", f"/admin/v1/projects/{_default(account)}")
        error = assert_error(refused, 400, "default_project", param="project_id")
        assert "Default project cannot be archived" in error["message"]
        default = _admin_get(api, f"/admin/v1/projects/{_default(account)}")
        assert (default["name"], default["archived_at"]) == ("Default", None)
        assert _audited(api, account, "project.archive") == []
        # Another project is archived as before.
        answer = _post(client, f"/billing/projects/{other['id']}/archive", "/billing/projects")
        assert answer.status_code == 303, answer.text
        assert _admin_get(api, f"/admin/v1/projects/{other['id']}")["archived_at"] is not None


class TestMembers:
    def test_an_admin_changes_a_members_name_role_and_limit(self, api: Api) -> None:
        account = create_account(api)
        member = _member(api, account, "viewer")
        client = _signed_in(api, _link(api, account))
        answer = _post(
            client,
            f"/billing/members/{member['id']}/edit",
            "/billing/members",
            name="Ada Lovelace",
            role="developer",
            spend_limit="7",
            spend_limit_window="week",
        )
        assert answer.status_code == 303, answer.text
        shown = _admin_get(api, f"/admin/v1/members/{member['id']}")
        assert (shown["name"], shown["role"], shown["spend_limit_window"]) == (
            "Ada Lovelace",
            "developer",
            "week",
        )
        assert shown["spend_limit_microcents"] == 700_000_000
        (event,) = _audited(api, account, "member.update")
        assert event["actor"] == f"portal:{account}"
        assert event["changes"]["role"] == "developer"
        assert event["changes"]["name"] == "Ada Lovelace"
        page = client.get("/billing/members")
        assert page.status_code == 200, page.text
        assert re.search(rf'<tr class="result" data-member="{member["id"]}">.*?\$7\.00', page.text)

    def test_a_refused_role_changes_nothing_and_a_developer_may_not(self, api: Api) -> None:
        account = create_account(api)
        member = _member(api, account, "viewer")
        client = _signed_in(api, _link(api, account))
        edit = f"/billing/members/{member['id']}/edit"
        answer = _post(client, edit, "/billing/members", name="n", role="owner")
        assert answer.status_code == 400, answer.text
        assert 'id="problem">role:' in answer.text
        developer = _member(api, account, "developer")
        as_developer = _signed_in(api, _member_link(api, account, developer["id"]))
        answer = _post(as_developer, edit, "/billing/keys", name="n", role="admin")
        assert answer.status_code == 403, answer.text
        assert _admin_get(api, f"/admin/v1/members/{member['id']}") == member
        assert _audited(api, account, "member.update") == []


@pytest.mark.parametrize(
    ("kind", "fields", "refusal"),
    [
        ("project", {"name": "research", "spend_limit": "1"}, "an archived project"),
        ("member", {"name": "Ada", "role": "developer"}, "a removed member"),
    ],
)
def test_an_archived_project_or_a_removed_member_is_not_changed(
    api: Api, kind: str, fields: dict[str, str], refusal: str
) -> None:
    account = create_account(api)
    row = _project(api, account) if kind == "project" else _member(api, account, "viewer")
    client = _signed_in(api, _link(api, account))
    admin = f"/admin/v1/{kind}s/{row['id']}"
    assert api.admin("DELETE", admin).status_code == 200
    gone = _admin_get(api, admin)
    answer = _post(client, f"/billing/{kind}s/{row['id']}/edit", f"/billing/{kind}s", **fields)
    assert answer.status_code == 400, answer.text
    assert f'id="problem">{refusal} cannot be changed' in answer.text
    assert _admin_get(api, admin) == gone
    assert _audited(api, account, f"{kind}.update") == []


def test_the_edit_forms_are_axe_clean(browser: Browser, portal: Api) -> None:
    account = create_account(portal)
    _project(portal, account)
    _member(portal, account)
    browser.driver.get(sign_in_link(portal, account))
    browser.click("#confirm")
    for page in ("/billing/projects", "/billing/members"):
        browser.open(page)
        assert browser.driver.find_elements(By.CSS_SELECTOR, "form.edit")
        assert browser.axe_violations() == [], page
    browser.open("/billing/projects")
    field = browser.driver.find_element(By.CSS_SELECTOR, "form.edit input[name=spend_limit]")
    field.send_keys("abc")
    browser.click("form.edit button[type=submit]")
    assert "spend limit: enter dollars" in browser.text("#problem")
    assert browser.axe_violations() == []
