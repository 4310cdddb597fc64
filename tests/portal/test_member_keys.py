"""Members in the portal, in a real browser (headless chromium): a developer signs in with its
own link, makes a key (the secret shown once, then never again), the key authorizes a request,
the developer revokes it; a viewer sees no form, and a role changed or a member removed applies
at the next request. Over HTTP: another member's key cannot be revoked by a developer."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.conftest import Api
from tests.factories import Key, authorize, create_account, grant, priced_model, unique
from tests.ledger.helpers import DAY_BEFORE
from tests.portal.browser import Browser
from tests.portal.test_accessibility import _press, _tab_to


def _member(api: Api, account: str, role: str) -> dict[str, Any]:
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
    assert response.json()["member_id"] == member_id
    return str(response.json()["url"])


def _sign_in(browser: Browser, url: str) -> None:
    browser.driver.get(url)
    browser.click("#confirm")
    assert browser.driver.current_url.endswith("/billing"), browser.driver.current_url


def test_a_developer_makes_a_key_sees_its_secret_once_uses_it_and_revokes_it(
    browser: Browser, portal: Api
) -> None:
    account = create_account(portal)
    grant(portal, account, 100)
    model = priced_model(portal, DAY_BEFORE)
    developer = _member(portal, account, "developer")
    _sign_in(browser, _member_link(portal, account, developer["id"]))

    browser.open("/billing/keys")
    browser.driver.find_element(By.ID, "key-name").send_keys("laptop")
    browser.click("#make-key-button")
    secret = browser.driver.find_element(By.ID, "created-secret").get_attribute("value") or ""
    assert secret.startswith("mk_")
    (made,) = portal.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert (made["name"], made["member_id"]) == ("laptop", developer["id"])
    assert made["project_id"] == "proj_" + account.removeprefix("acct_")
    key = Key(made["id"], secret, account)
    assert authorize(portal, key, model, prompt_tokens=10, max_tokens=10).status_code == 200

    browser.open("/billing/keys")  # shown once: never again
    assert secret not in browser.driver.page_source
    assert not browser.driver.find_elements(By.ID, "created-secret")
    browser.click(f'tr[data-key="{key.id}"] form.revoke button')
    assert browser.text(f'tr[data-key="{key.id}"] .status') == "revoked"
    assert authorize(portal, key, model, prompt_tokens=10, max_tokens=10).status_code == 401
    events = portal.admin(
        "GET", "/admin/v1/audit-events", params={"account_id": account, "action": "api_key.revoke"}
    ).json()["data"]
    assert [e["actor"] for e in events] == [f"portal:{developer['id']}"]
    assert browser.axe_violations() == []
    assert browser.console_errors() == []


def test_a_viewer_sees_no_form_and_a_role_change_applies_at_once(
    browser: Browser, portal: Api
) -> None:
    account = create_account(portal)
    viewer = _member(portal, account, "viewer")
    _sign_in(browser, _member_link(portal, account, viewer["id"]))
    browser.open("/billing/keys")
    assert not browser.driver.find_elements(By.ID, "make-key")
    assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.revoke")
    csrf = browser.csrf()
    cookies = {c["name"]: c["value"] for c in browser.driver.get_cookies()}
    with httpx.Client(base_url=str(portal.client.base_url), cookies=cookies, timeout=30) as client:
        refused = client.post("/billing/keys", data={"csrf_token": csrf, "name": "sneaky"})
        assert refused.status_code == 403
        assert portal.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"] == []
        # Made a developer: the form is there at the next request.
        portal.admin("PATCH", f"/admin/v1/members/{viewer['id']}", json={"role": "developer"})
        browser.open("/billing/keys")
        assert browser.driver.find_elements(By.ID, "make-key")
        # Removed: the session is over.
        portal.admin("DELETE", f"/admin/v1/members/{viewer['id']}")
        assert client.get("/billing/keys").status_code == 401


def test_a_developer_cannot_revoke_another_members_key(browser: Browser, portal: Api) -> None:
    account = create_account(portal)
    developer = _member(portal, account, "developer")
    other = _member(portal, account, "developer")
    response = portal.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={"name": "theirs", "member_id": other["id"]},
    )
    theirs = response.json()["id"]
    _sign_in(browser, _member_link(portal, account, developer["id"]))
    browser.open("/billing/keys")
    assert not browser.driver.find_elements(By.CSS_SELECTOR, f'tr[data-key="{theirs}"] form')
    csrf = browser.csrf()
    cookies = {c["name"]: c["value"] for c in browser.driver.get_cookies()}
    with httpx.Client(base_url=str(portal.client.base_url), cookies=cookies, timeout=30) as client:
        refused = client.post(f"/billing/keys/{theirs}/revoke", data={"csrf_token": csrf})
    assert refused.status_code == 403
    (key,) = portal.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert key["revoked_at"] is None


def test_the_owner_adds_a_member_and_a_project_and_a_viewer_sees_neither_page(
    browser: Browser, portal: Api
) -> None:
    account = create_account(portal)
    owner = portal.admin("POST", f"/admin/v1/accounts/{account}/portal-sessions").json()["url"]
    _sign_in(browser, owner)
    nav = browser.driver.find_element(By.CSS_SELECTOR, "nav").text
    assert "Members" in nav and "Projects" in nav
    browser.open("/billing/members")
    browser.driver.find_element(By.ID, "member-email").send_keys("Grace@Example.com")
    browser.driver.find_element(By.ID, "member-name").send_keys("Grace")
    browser.driver.find_element(By.CSS_SELECTOR, '#member-role option[value="viewer"]').click()
    browser.click("#add-member-button")
    link = browser.driver.find_element(By.ID, "created-link").get_attribute("value") or ""
    (member,) = portal.admin("GET", f"/admin/v1/accounts/{account}/members").json()["data"]
    assert (member["email"], member["role"]) == ("Grace@Example.com", "viewer")
    assert browser.table_rows("members-table")[0][:4] == [
        "Grace@Example.com",
        "Grace",
        member["id"],
        "viewer",
    ]
    assert browser.axe_violations() == []

    browser.open("/billing/projects")
    browser.driver.find_element(By.ID, "project-name").send_keys("research")
    browser.click("#add-project-button")
    projects = portal.admin("GET", f"/admin/v1/accounts/{account}/projects").json()["data"]
    (research,) = [p for p in projects if p["name"] == "research"]
    browser.click(f'tr[data-project="{research["id"]}"] form.archive button')
    archived = portal.admin("GET", f"/admin/v1/projects/{research['id']}").json()
    assert archived["archived_at"] is not None
    assert browser.axe_violations() == []
    assert browser.console_errors() == []
    events = portal.admin("GET", "/admin/v1/audit-events", params={"account_id": account}).json()
    assert {(e["action"], e["actor"]) for e in events["data"]} >= {
        ("member.create", f"portal:{account}"),
        ("project.create", f"portal:{account}"),
        ("project.archive", f"portal:{account}"),
    }

    # The link shown signs in as the viewer: no Members or Projects page for it.
    browser.driver.delete_all_cookies()
    _sign_in(browser, link)
    nav = browser.driver.find_element(By.CSS_SELECTOR, "nav").text
    assert "Members" not in nav and "Projects" not in nav
    browser.open("/billing/members")
    assert "403" in browser.driver.page_source or "not allow" in browser.driver.page_source


def test_a_developer_makes_and_revokes_a_key_with_the_keyboard_alone(
    browser: Browser, portal: Api
) -> None:
    account = create_account(portal)
    developer = _member(portal, account, "developer")
    _sign_in(browser, _member_link(portal, account, developer["id"]))
    link = _tab_to(browser, 'nav a[href="/billing/keys"]')
    _press(browser, Keys.ENTER)
    assert browser.driver.current_url.endswith("/billing/keys"), link
    _tab_to(browser, "#key-name")
    ActionChains(browser.driver).send_keys("typed").perform()
    _press(browser, Keys.ENTER)
    assert browser.driver.find_element(By.ID, "created-secret").get_attribute("value")
    (made,) = portal.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert made["name"] == "typed"
    _tab_to(browser, f'tr[data-key="{made["id"]}"] form.revoke button')
    _press(browser, Keys.ENTER)
    (revoked,) = portal.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert revoked["revoked_at"] is not None
