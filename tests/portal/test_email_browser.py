"""Signing in by an emailed link, in a real browser (headless chromium) against the real server
and a real SMTP server (aiosmtpd): a developer asks for its link with the keyboard alone, signs
in by the link the mail brings, makes a key (its secret shown once), the key authorizes a
request through the gateway's route, the developer revokes it; a viewer signed in the same way
sees no form; the sign-in page and its answer have no axe-core violations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.conftest import BACKENDS, Api, migrated_database
from tests.factories import (
    Key,
    assert_error,
    authorize,
    create_account,
    grant,
    priced_model,
    unique,
)
from tests.ledger.helpers import DAY_BEFORE
from tests.portal.browser import Browser, serving
from tests.portal.smtp import Inbox, send_mails, smtp_server
from tests.portal.test_accessibility import _press, _tab_to


@pytest.fixture(scope="module")
def inbox() -> Iterator[Inbox]:
    with smtp_server() as server:
        yield server


@pytest.fixture(scope="module", params=BACKENDS)
def portal(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, inbox: Inbox
) -> Iterator[Api]:
    """The portal's server (as tests/portal/conftest.py's) with sign-in links by email."""
    tmp = tmp_path_factory.mktemp(f"portal-mail-{request.param}")
    with (
        migrated_database(request.param, tmp) as url,
        serving(
            request.param, url, tmp, smtp_url=inbox.url, mail_from="billing@example.com"
        ) as api,
    ):
        yield api


def _member(api: Api, account: str, role: str) -> dict[str, Any]:
    address = f"{unique(role)}@example.com"
    response = api.admin(
        "POST", f"/admin/v1/accounts/{account}/members", json={"email": address, "role": role}
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def _ask_with_the_keyboard(browser: Browser, address: str) -> None:
    """The sign-in page's email form, by Tab, typing and Enter alone."""
    browser.open("/billing/sign-in")
    _tab_to(browser, "#email")
    ActionChains(browser.driver).send_keys(address).perform()
    _press(browser, Keys.ENTER)
    assert browser.text("h1") == "Check your email"
    assert address in browser.text("#link-sent")


def _sign_in_by_mail(browser: Browser, api: Api, inbox: Inbox, address: str) -> None:
    _ask_with_the_keyboard(browser, address)
    assert send_mails(api) == 1
    (mail,) = inbox.to(address)
    (link,) = mail.links
    browser.driver.get(link)
    _tab_to(browser, "#confirm")
    _press(browser, Keys.ENTER)
    assert browser.driver.current_url.endswith("/billing"), browser.driver.current_url


def test_the_sign_in_page_and_its_answer_pass_axe_core(browser: Browser, portal: Api) -> None:
    browser.open("/billing/sign-in")
    assert browser.driver.find_elements(By.ID, "email-link")
    assert browser.axe_violations() == []
    _ask_with_the_keyboard(browser, f"{unique('nobody')}@example.com")
    assert browser.axe_violations() == []
    assert browser.console_errors() == []
    # A refused address: the sign-in page again, with the problem announced.
    browser.open("/billing/sign-in")
    browser.driver.execute_script("document.getElementById('email').type = 'text'")
    browser.driver.find_element(By.ID, "email").send_keys("not an address")
    browser.click("#email-link-button")
    assert "Enter your email address" in browser.text("#problem")
    assert browser.axe_violations() == []


def test_a_developer_signs_in_by_mail_makes_a_key_uses_it_and_revokes_it(
    browser: Browser, portal: Api, inbox: Inbox
) -> None:
    account = create_account(portal)
    grant(portal, account, 100)
    model = priced_model(portal, DAY_BEFORE)
    developer = _member(portal, account, "developer")
    _sign_in_by_mail(browser, portal, inbox, developer["email"])

    browser.open("/billing/keys")
    browser.driver.find_element(By.ID, "key-name").send_keys("mailed")
    browser.click("#make-key-button")
    secret = browser.driver.find_element(By.ID, "created-secret").get_attribute("value") or ""
    assert secret.startswith("mk_")
    (made,) = portal.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
    assert (made["name"], made["member_id"]) == ("mailed", developer["id"])
    key = Key(made["id"], secret, account)

    response = authorize(portal, key, model, prompt_tokens=10, max_tokens=10)
    assert response.status_code == 200, response.text
    hold = response.json()
    assert (hold["object"], hold["status"], hold["account_id"], hold["api_key_id"]) == (
        "authorization",
        "active",
        account,
        key.id,
    )
    assert hold["model"] == model and hold["estimate_microcents"] > 0

    browser.open("/billing/keys")  # the secret was shown once
    assert secret not in browser.driver.page_source
    assert not browser.driver.find_elements(By.ID, "created-secret")
    browser.click(f'tr[data-key="{key.id}"] form.revoke button')
    assert browser.text(f'tr[data-key="{key.id}"] .status') == "revoked"
    refused = authorize(portal, key, model, prompt_tokens=10, max_tokens=10)
    assert_error(refused, 401, "invalid_api_key", param="api_key")
    events = portal.admin(
        "GET", "/admin/v1/audit-events", params={"account_id": account, "action": "api_key.revoke"}
    ).json()["data"]
    assert [e["actor"] for e in events] == [f"portal:{developer['id']}"]
    assert browser.axe_violations() == []
    assert browser.console_errors() == []


def test_a_viewer_signed_in_by_mail_sees_no_form(
    browser: Browser, portal: Api, inbox: Inbox
) -> None:
    account = create_account(portal)
    viewer = _member(portal, account, "viewer")
    _sign_in_by_mail(browser, portal, inbox, viewer["email"])
    browser.open("/billing/keys")
    assert browser.driver.find_elements(By.CSS_SELECTOR, "table")
    assert not browser.driver.find_elements(By.ID, "make-key")
    assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.revoke")
    nav = browser.text("nav")
    assert "Keys" in nav and "Members" not in nav and "Projects" not in nav
    assert browser.axe_violations() == []
