"""The portal's Billing page in a real browser (headless chromium) against localstripe: Stripe.js'
stand-in served by localstripe (the page's only outside script), a real server receiving
localstripe's own signed events. Adding $25 with a new card raises the balance by exactly
2,500,000,000 µ¢; a declined card shows the decline and credits nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import BACKENDS, NOW, Api, migrated_database
from tests.factories import create_account, create_key, credits_of
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import assert_verified, stripe_settings
from tests.payments.localstripe import CARD_DECLINED, CARD_OK, LocalStripe
from tests.portal.browser import Browser, new_browser, serving, sign_in_link


@pytest.fixture(scope="module", params=BACKENDS)
def billing_site(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    localstripe: LocalStripe,
) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp(f"billing-{request.param}")
    with (
        migrated_database(request.param, tmp) as url,
        serving(request.param, url, tmp, **stripe_settings(localstripe)) as api,
    ):
        # localstripe's own events (payment_intent.*) come to this server, signed.
        localstripe.send_webhooks_to(f"{str(api.client.base_url).rstrip('/')}/v1/stripe/webhook")
        yield api


@pytest.fixture(scope="module")
def _driver() -> Iterator[Any]:
    driver = new_browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(billing_site: Api, _driver: Any) -> Iterator[Browser]:
    billing_site.clock.set(NOW)
    page = Browser(_driver, str(billing_site.client.base_url).rstrip("/"))
    page.open("/billing/sign-in")
    page.driver.delete_all_cookies()
    page.console_errors()
    yield page
    billing_site.clock.set(NOW)


def _signed_in(browser: Browser, api: Api, account: str) -> None:
    browser.driver.get(sign_in_link(api, account))
    browser.click("#confirm")
    assert browser.driver.current_url.endswith("/billing")


def _pay_with(browser: Browser, number: str, save: bool = False) -> None:
    """On the pay page: the card typed into Stripe Elements (localstripe's stand-in), then Pay;
    waits for the return page."""
    _type_card(browser, number)
    if save:
        browser.driver.find_element(By.ID, "save-card").click()
    browser.driver.find_element(By.ID, "pay").click()
    WebDriverWait(browser.driver, 30).until(lambda d: d.find_elements(By.ID, "outcome"))


def _type_card(browser: Browser, number: str) -> None:
    """The card typed into Stripe Elements (localstripe's stand-in)."""
    WebDriverWait(browser.driver, 15).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#card-element input[placeholder=number]")
    )
    for field, value in (
        ("number", number),
        ("exp_month", "12"),
        ("exp_year", "31"),
        ("cvc", "123"),
        ("postal_code", "75001"),
    ):
        browser.driver.find_element(
            By.CSS_SELECTOR, f"#card-element input[placeholder={field}]"
        ).send_keys(value)


def test_add_25_dollars_with_a_new_card(browser: Browser, billing_site: Api) -> None:
    api = billing_site
    key = create_key(api, create_account(api))
    before = int(credits_of(api, key)["balance_microcents"])
    _signed_in(browser, api, key.account_id)
    nav = [a.text for a in browser.driver.find_elements(By.CSS_SELECTOR, "nav a")]
    assert "Billing" in nav
    browser.open("/billing/payments")
    assert browser.text("h1") == "Billing"
    assert browser.axe_violations() == []
    browser.driver.find_element(By.CSS_SELECTOR, "input[name=amount][value='2500']").click()
    browser.click("#continue")
    assert browser.text("h1") == "Pay $25.00"
    assert browser.axe_violations() == []
    policy = browser.driver.execute_script(
        "return fetch(location.href).then(r => r.headers.get('content-security-policy'))"
    )
    # The only script from elsewhere: Stripe.js (here localstripe's stand-in).
    assert f"script-src 'self' {api.settings.stripe_js_url.rsplit('/js.stripe.com', 1)[0]}" in (
        policy
    )

    _pay_with(browser, CARD_OK)

    assert browser.text("#payment-status") == "succeeded", browser.text("#outcome")
    assert browser.text("#outcome") == "Thank you: $25.00 was added to your credit."
    after = int(credits_of(api, key)["balance_microcents"])
    assert after - before == 25 * 100 * MICROCENTS_PER_CENT == 2_500_000_000
    assert browser.text("#balance") == "$25.00"
    assert browser.axe_violations() == []
    assert browser.console_errors() == []
    browser.open("/billing/payments")
    rows = browser.table_rows("payments-table")
    assert len(rows) == 1 and rows[0][2] == "$25.00" and rows[0][3] == "succeeded"
    # localstripe's payment_intent.succeeded arrives (signed) about a second later: no change.
    time.sleep(2)
    assert int(credits_of(api, key)["balance_microcents"]) == after
    listed = api.as_key(key.secret, "GET", "/v1/payments").json()["data"]
    assert [p["status"] for p in listed] == ["succeeded"]
    assert_verified(api)


def test_a_declined_card_shows_the_decline_and_credits_nothing(
    browser: Browser, billing_site: Api
) -> None:
    api = billing_site
    key = create_key(api, create_account(api))
    before = int(credits_of(api, key)["balance_microcents"])
    _signed_in(browser, api, key.account_id)
    browser.open("/billing/payments")
    browser.driver.find_element(By.ID, "amount-custom").click()
    browser.driver.find_element(By.ID, "custom-amount").send_keys("12.34")
    browser.click("#continue")
    assert browser.text("h1") == "Pay $12.34"

    _pay_with(browser, CARD_DECLINED)

    assert browser.text("#payment-status") == "failed"
    assert "declined" in browser.text("#outcome").lower()
    assert int(credits_of(api, key)["balance_microcents"]) == before
    listed = api.as_key(key.secret, "GET", "/v1/payments").json()["data"]
    assert [(p["status"], p["failure_code"], p["amount_cents"]) for p in listed] == [
        ("failed", "card_declined", 1234)
    ]
    assert_verified(api)


def test_an_amount_out_of_bounds_is_refused_on_the_page(
    browser: Browser, billing_site: Api
) -> None:
    api = billing_site
    key = create_key(api, create_account(api))
    _signed_in(browser, api, key.account_id)
    browser.open("/billing/payments")
    browser.driver.find_element(By.ID, "amount-custom").click()
    browser.driver.find_element(By.ID, "custom-amount").send_keys("1")
    browser.click("#continue")
    assert "between $5.00 and $10,000.00" in browser.text("#problem").replace("10000", "10,000")
    assert api.as_key(key.secret, "GET", "/v1/payments").json()["data"] == []


def test_save_a_card_pay_with_it_then_remove_it(browser: Browser, billing_site: Api) -> None:
    api = billing_site
    key = create_key(api, create_account(api))
    before = int(credits_of(api, key)["balance_microcents"])
    _signed_in(browser, api, key.account_id)
    browser.open("/billing/payments")
    assert "No card is saved" in browser.text("#saved-card")
    assert not browser.driver.find_elements(By.ID, "pay-saved")
    browser.driver.find_element(By.CSS_SELECTOR, "input[name=amount][value='5000']").click()
    browser.click("#continue")
    _pay_with(browser, CARD_OK, save=True)
    assert browser.text("#payment-status") == "succeeded"

    browser.open("/billing/payments")
    assert "ending 4242, expires 12/2031" in browser.text("#saved-card")
    browser.driver.find_element(By.CSS_SELECTOR, "input[name=amount][value='1000']").click()
    browser.click("#pay-saved")  # no card page: the saved card is charged at once
    assert browser.text("#payment-status") == "succeeded", browser.text("#outcome")
    after = int(credits_of(api, key)["balance_microcents"])
    assert after - before == (50 + 10) * 100 * MICROCENTS_PER_CENT

    browser.open("/billing/payments")
    assert browser.text("#recharge-state").startswith("Off.")
    for field, dollars in (
        ("recharge-threshold", "20"),
        ("recharge-amount", "25.50"),
        ("recharge-limit", "100"),
    ):
        element = browser.driver.find_element(By.ID, field)
        element.clear()
        element.send_keys(dollars)
    browser.driver.find_element(By.ID, "recharge-enabled").click()
    browser.click("#save-recharge")
    assert browser.text("#recharge-state").startswith(
        "On: when the balance falls below $20.00, the saved card is charged $25.50, at most "
        "$100.00 a month."
    )
    answer = api.admin("GET", f"/admin/v1/accounts/{key.account_id}/auto-recharge").json()
    assert (answer["enabled"], answer["threshold_cents"], answer["amount_cents"]) == (
        True,
        2000,
        2550,
    )
    limit = browser.driver.find_element(By.ID, "recharge-limit")
    limit.clear()
    limit.send_keys("10")  # below the amount
    browser.click("#save-recharge")
    assert "at least amount_cents" in browser.text("#recharge-problem")
    assert (
        api.admin("GET", f"/admin/v1/accounts/{key.account_id}/auto-recharge").json()[
            "monthly_limit_cents"
        ]
        == 10000
    )

    browser.click("#remove-card")
    assert "No card is saved" in browser.text("#saved-card")
    # The one error: the refused form's 400.
    assert [e["message"] for e in browser.console_errors()] == [
        f"{browser.base}/billing/payments/auto-recharge - Failed to load resource: the server "
        "responded with a status of 400 (Bad Request)"
    ]
    assert_verified(api)


def test_add_a_card_without_paying(browser: Browser, billing_site: Api) -> None:
    """The Billing page's "add a card": a declined card is shown on a new card page; a good one
    becomes the saved card, and nothing is charged."""
    api = billing_site
    key = create_key(api, create_account(api))
    before = int(credits_of(api, key)["balance_microcents"])
    _signed_in(browser, api, key.account_id)
    browser.open("/billing/payments")
    assert "No card is saved" in browser.text("#saved-card")
    browser.click("#add-card")
    assert browser.text("h1") == "Add a card"
    assert browser.axe_violations() == []
    first_setup = browser.driver.find_element(By.NAME, "setup_intent").get_attribute("value")

    _type_card(browser, CARD_DECLINED)
    browser.click("#save-new-card")  # Stripe.js's answer, then the form's POST
    second_setup = browser.driver.find_element(By.NAME, "setup_intent").get_attribute("value")
    assert second_setup != first_setup  # a new card page, a new SetupIntent
    assert browser.text("h1") == "Add a card"
    assert "declined" in browser.text("#card-problem").lower()
    assert browser.axe_violations() == []
    assert api.as_key(key.secret, "GET", "/v1/payments").json()["data"] == []

    _type_card(browser, CARD_OK)
    browser.click("#save-new-card")
    assert browser.driver.current_url.endswith("/billing/payments")
    assert "ending 4242, expires 12/2031" in browser.text("#saved-card")
    assert browser.text("#add-card") == "Replace the saved card"
    assert browser.axe_violations() == []
    assert int(credits_of(api, key)["balance_microcents"]) == before
    assert api.as_key(key.secret, "GET", "/v1/payments").json()["data"] == []
    # The one error: localstripe's answer to the declined card's set-up (402).
    assert [e["message"] for e in browser.console_errors()] == [
        f"{api.settings.stripe_api_base}/v1/setup_intents/{first_setup}/confirm - Failed to load "
        "resource: the server responded with a status of 402 (Payment Required)"
    ]
    assert_verified(api)


def test_a_viewer_sees_no_auto_recharge_form_and_may_not_post_it(
    browser: Browser, billing_site: Api
) -> None:
    from tests.portal.test_member_keys import _member, _member_link

    api = billing_site
    account = create_account(api)
    viewer = _member(api, account, "viewer")
    browser.driver.get(_member_link(api, account, viewer["id"]))
    browser.click("#confirm")
    browser.open("/billing/payments")
    assert browser.driver.find_elements(By.ID, "auto-recharge") == []
    token = browser.driver.find_element(By.CSS_SELECTOR, "input[name=csrf_token]").get_attribute(
        "value"
    )
    status = browser.driver.execute_script(
        "const body = new URLSearchParams({csrf_token: arguments[0], enabled: '1', "
        "threshold: '10', recharge_amount: '25', monthly_limit: '100'});"
        "return fetch('/billing/payments/auto-recharge', {method: 'POST', body})"
        ".then(r => r.status);",
        token,
    )
    assert status == 403
    answer = api.admin("GET", f"/admin/v1/accounts/{account}/auto-recharge").json()
    assert answer["enabled"] is False
    browser.console_errors()  # the refused POST's 403
