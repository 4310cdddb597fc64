"""Accessibility in the real browser: axe-core (vendored, pinned) finds no violation of its
wcag2a and wcag2aa rules on any page, and every page's actions work with the keyboard alone."""

from __future__ import annotations

from datetime import date, timedelta

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

from tests.conftest import NOW, Api
from tests.factories import create_account, create_key, grant, ingest, priced_model, usage_event
from tests.portal.browser import Browser, sign_in_link
from tests.portal.conftest import export_rollforward
from tests.portal.test_browser import PAGES


def _account(api: Api) -> tuple[str, str]:
    account = create_account(api)
    key = create_key(api, account, limit_cents=100)
    grant(api, account, 100)
    model = priced_model(api, NOW - timedelta(days=40))
    ingest(api, *[usage_event(key, model, NOW - timedelta(days=d, hours=3)) for d in range(3)])
    return account, key.secret


def _endpoint_with_a_delivery(api: Api, account: str) -> str:
    made = api.admin(
        "POST",
        "/admin/v1/webhook-endpoints",
        json={
            "url": "https://11.22.33.44/hook",
            "event_types": ["webhook.test"],
            "account_id": account,
        },
    )
    assert made.status_code == 201, made.text
    endpoint_id = str(made.json()["id"])
    sent = api.admin("POST", f"/admin/v1/webhook-endpoints/{endpoint_id}/test")
    assert sent.status_code == 200, sent.text
    return endpoint_id


def test_no_wcag_a_or_aa_violation_on_any_page(browser: Browser, portal: Api) -> None:
    account, _ = _account(portal)
    _endpoint_with_a_delivery(portal, account)
    export_rollforward(portal, date(2026, 11, 29))
    visited: dict[str, list[object]] = {}
    browser.open("/billing/sign-in")
    visited["sign-in"] = browser.axe_violations()
    browser.driver.get(sign_in_link(portal, account))
    visited["confirm"] = browser.axe_violations()
    browser.click("#confirm")
    for page in PAGES:
        browser.open("/billing" + page)
        visited[page or "overview"] = browser.axe_violations()
    browser.open("/billing/usage?bucket_width=1h&group_by=api_key")
    visited["usage by key, hourly"] = browser.axe_violations()
    browser.open("/billing/exports")  # axe saw the roll-forward's rows
    assert browser.driver.find_elements(By.CSS_SELECTOR, "#rollforward-table tr.result")
    # The Notifications page's answers: a new endpoint's secret, and a problem with the form.
    browser.open("/billing/notifications")
    browser.driver.find_element(By.ID, "url").send_keys("https://11.22.33.44/other")
    browser.driver.find_element(By.CSS_SELECTOR, 'input[name="type:webhook.test"]').click()
    browser.click("#add-endpoint button[type=submit]")
    assert browser.driver.find_elements(By.ID, "created-secret")
    visited["notifications, endpoint added"] = browser.axe_violations()
    assert browser.console_errors() == []
    # The error pages (their 400 and 410 statuses are logged by the browser as failed loads).
    browser.open("/billing/notifications")
    browser.driver.find_element(By.ID, "url").send_keys("https://11.22.33.44/third")
    browser.click("#add-endpoint button[type=submit]")  # no event type chosen
    assert browser.driver.find_elements(By.ID, "problem")
    visited["notifications, form refused"] = browser.axe_violations()
    browser.open("/billing/usage?starting_at=yesterday")
    visited["error page"] = browser.axe_violations()
    browser.open("/billing/sign-in/not-a-link")
    visited["refused link"] = browser.axe_violations()
    assert {page: found for page, found in visited.items() if found} == {}


def _focused(browser: Browser) -> WebElement:
    return browser.driver.switch_to.active_element


def _tab_to(browser: Browser, matches: str, limit: int = 60) -> WebElement:
    """Press Tab until the focused element matches the CSS selector ``matches``."""
    for _ in range(limit):
        ActionChains(browser.driver).send_keys(Keys.TAB).perform()
        element = _focused(browser)
        if browser.driver.execute_script(
            "return arguments[0].matches(arguments[1])", element, matches
        ):
            return element
    raise AssertionError(f"Tab never reached {matches}")


def _press(browser: Browser, *keys: str) -> None:
    before = browser.driver.find_element(By.TAG_NAME, "html")
    ActionChains(browser.driver).send_keys(*keys).perform()
    browser.wait_for_new_page(before)


def test_every_action_works_with_the_keyboard_alone(browser: Browser, portal: Api) -> None:
    account, secret = _account(portal)
    # Sign in by key: Tab to the field, type, Enter.
    browser.open("/billing/sign-in")
    _tab_to(browser, "#api_key")
    ActionChains(browser.driver).send_keys(secret).perform()
    _press(browser, Keys.ENTER)
    assert browser.driver.current_url.endswith("/billing")
    # The skip link is the first stop and takes focus to the content.
    ActionChains(browser.driver).send_keys(Keys.TAB).perform()
    assert _focused(browser).get_attribute("class") == "skip"
    # Every page through the navigation, by Tab and Enter.
    for page, label in zip(
        PAGES[1:], ("Usage", "Keys", "Activity", "Exports", "Notifications", "Models"), strict=True
    ):
        link = _tab_to(browser, f'nav a[href="/billing{page}"]')
        assert link.text == label
        _press(browser, Keys.ENTER)
        assert browser.driver.current_url.endswith("/billing" + page)
        # Each scrollable table can be reached (and so scrolled) from the keyboard.
        if browser.driver.find_elements(By.CSS_SELECTOR, ".table-wrap"):
            _tab_to(browser, ".table-wrap")
    # The usage form: choose hours and group by key with the keyboard, submit with Enter.
    browser.open("/billing/usage")
    start = _tab_to(browser, "#starting_at")
    start.send_keys(Keys.CONTROL, "a")
    ActionChains(browser.driver).send_keys("2026-11-28T00:00:00Z").perform()
    end = _tab_to(browser, "#ending_at")
    end.send_keys(Keys.CONTROL, "a")  # typing replaces the selection
    ActionChains(browser.driver).send_keys("2026-11-29T00:00:00Z").perform()
    _tab_to(browser, "#bucket_width")
    ActionChains(browser.driver).send_keys("h").perform()  # a select takes its option's letter
    _tab_to(browser, "#group_by")
    ActionChains(browser.driver).send_keys("a").perform()
    _tab_to(browser, ".filters button")
    _press(browser, Keys.ENTER)
    assert "bucket_width=1h" in browser.driver.current_url
    assert "group_by=api_key" in browser.driver.current_url
    assert browser.table_rows("usage-table"), browser.driver.current_url
    # The CSV download link is reachable; sign out with the keyboard.
    _tab_to(browser, "#csv-link")
    # The Notifications page: add an endpoint, send it a test, disable and remove it.
    browser.open("/billing/notifications")
    _tab_to(browser, "#url")
    ActionChains(browser.driver).send_keys("https://11.22.33.44/hook").perform()
    _tab_to(browser, 'input[name="type:webhook.test"]')
    ActionChains(browser.driver).send_keys(Keys.SPACE).perform()
    _tab_to(browser, "#add-endpoint button[type=submit]")
    _press(browser, Keys.ENTER)
    assert browser.driver.find_elements(By.ID, "created-secret")
    for action in ("button.send-test", "button.toggle", "button.remove"):
        browser.open("/billing/notifications")
        _tab_to(browser, f"section.endpoint {action}")
        _press(browser, Keys.ENTER)
        assert browser.driver.current_url.endswith("/billing/notifications"), action
        if action == "button.send-test":
            assert browser.driver.find_elements(By.CSS_SELECTOR, "table.deliveries tr.result")
        if action == "button.toggle":
            assert browser.text("section.endpoint .state") == "disabled"
    assert browser.driver.find_elements(By.ID, "no-endpoints")
    browser.open("/billing")
    _tab_to(browser, "form.sign-out button")
    _press(browser, Keys.ENTER)
    assert browser.driver.current_url.endswith("/billing/sign-in")
    # Sign in by link: the confirmation button by Tab and Enter.
    browser.driver.get(sign_in_link(portal, account))
    _tab_to(browser, "#confirm")
    _press(browser, Keys.ENTER)
    assert browser.driver.current_url.endswith("/billing")
    assert browser.console_errors() == []
