"""The portal's request page (``GET /billing/requests?request_id=…``), reached from the search box
on Activity: what ``GET /v1/requests/{request_id}`` answers, component by component (tokens,
rate, exact and charged amount), the total and the hold it settled, amounts by tests/oracle.py;
another account's request, or none, is a 404 page that says so; a blank search is 400. Over
HTTP on every backend, and in real Chromium (the search box by keyboard, axe-core clean)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests import oracle
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    authorize,
    chat_usage,
    create_account,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.portal.browser import Browser, sign_in_link
from tests.portal.test_portal_http import _client, _link, _sign_in

# (component, prompt-side tokens, rate): the usage below at GLM_RATES (input, output, cache).
PROMPT, CACHED, OUTPUT, REASONING = 3333, 1234, 701, 17
TOKENS = {"input": PROMPT - CACHED, "cache_read": CACHED, "output": OUTPUT}
RATES = {"input": GLM_RATES[0], "output": GLM_RATES[1], "cache_read": GLM_RATES[2]}


@dataclass
class Recorded:
    account: str
    key: Key
    member: str
    request_id: str
    hold: dict[str, Any]
    event: dict[str, Any]


def _recorded(api: Api) -> Recorded:
    """A member's key, a hold, and the usage event that settled it."""
    account = create_account(api)
    grant(api, account, 100)
    model = priced_model(api, NOW - timedelta(days=40))
    member = api.admin(
        "POST", f"/admin/v1/accounts/{account}/members", json={"email": f"{unique('m')}@x.io"}
    )
    assert member.status_code == 201, member.text
    made = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={"name": "k", "member_id": member.json()["id"]},
    )
    assert made.status_code == 201, made.text
    key = Key(made.json()["id"], made.json()["key"], account)
    request_id = unique("req")
    hold = authorize(api, key, model, prompt_tokens=PROMPT, max_tokens=777, request_id=request_id)
    assert hold.status_code == 200, hold.text
    usage = chat_usage(PROMPT, OUTPUT, cached=CACHED, reasoning=REASONING)
    event = usage_event(
        key,
        model,
        NOW - timedelta(minutes=1),
        usage,
        request_id=request_id,
        authorization_id=hold.json()["id"],
    )
    body = ingest(api, event)
    assert body["data"][0]["status"] == "recorded", body
    return Recorded(account, key, member.json()["id"], request_id, hold.json(), event)


Row = tuple[str, int, Decimal, Decimal, Decimal]  # component, tokens, rate, exact, charged


def _expected_rows(recorded: Recorded) -> list[Row]:
    """The components as the oracle prices them: name, tokens, dollars per million tokens,
    exact microcents, dollars charged."""
    charge = oracle.event_charge(recorded.event, GLM_RATES)
    charged = {
        "input": charge.input_microcents,
        "cache_read": charge.cache_read_microcents,
        "output": charge.output_microcents,
    }
    rows = []
    for name in ("input", "cache_read", "output"):
        assert charged[name] == oracle.component(TOKENS[name], RATES[name])
        rows.append(
            (
                name,
                TOKENS[name],
                _usd(RATES[name]),
                Decimal(TOKENS[name] * RATES[name]) / 10**6,
                _usd(charged[name]),
            )
        )
    return rows


def _usd(microcents: int) -> Decimal:
    return Decimal(microcents) / 10**8


def _dollars(text: str) -> Decimal:
    assert text.startswith("$"), text
    return Decimal(text.removeprefix("$"))


def _read(cells: list[str]) -> Row:
    """A displayed row of the components table, as numbers."""
    name, tokens, rate, exact, charged = cells
    return (name, int(tokens.replace(",", "")), _dollars(rate), Decimal(exact), _dollars(charged))


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def _table(page: str) -> list[Row]:
    body = re.search(r'<table id="components-table">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body, page
    return [
        _read([_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)])
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body.group(1), re.S)
    ]


def _by_id(page: str, element_id: str) -> str:
    found = re.search(rf'<[a-z]+[^>]*\bid="{element_id}"[^>]*>(.*?)</(?:dd|tr|p|dl)>', page, re.S)
    assert found, element_id
    return _text(found.group(1))


def _signed_in(api: Api, account: str) -> TestClient:
    client = _client(api)
    assert _sign_in(client, _link(api, account)).status_code == 303  # type: ignore[attr-defined]
    return client


class TestOverHttp:
    def test_the_page_shows_what_the_json_route_answers(self, api: Api) -> None:
        recorded = _recorded(api)
        client = _signed_in(api, recorded.account)
        activity = client.get("/billing/activity")
        assert activity.status_code == 200, activity.text
        assert 'action="/billing/requests"' in activity.text
        assert 'name="request_id"' in activity.text

        page = client.get("/billing/requests", params={"request_id": recorded.request_id})
        assert page.status_code == 200, page.text
        body = api.as_key(recorded.key.secret, "GET", f"/v1/requests/{recorded.request_id}")
        assert body.status_code == 200, body.text
        shown = body.json()
        expected = _expected_rows(recorded)
        assert _table(page.text) == expected
        # The same figures as the JSON route's, row by row.
        assert [
            (
                c["component"],
                c["tokens"],
                _usd(c["rate_microcents_per_million"]),
                Decimal(c["exact_microcents"]),
                _usd(c["microcents"]),
            )
            for c in shown["components"]
        ] == expected
        total = oracle.event_charge(recorded.event, GLM_RATES).total_microcents
        assert shown["total_microcents"] == total
        assert _dollars(_by_id(page.text, "request-total").removeprefix("Total")) == _usd(total)
        estimate = _dollars(_by_id(page.text, "hold-estimate"))
        assert estimate == _usd(recorded.hold["estimate_microcents"]) > 0
        assert _by_id(page.text, "hold-status") == "settled"
        assert recorded.hold["id"] in page.text and recorded.key.id in page.text
        assert recorded.member in page.text and shown["project_id"] in page.text

    def test_an_unknown_or_another_accounts_request_is_a_404_page(self, api: Api) -> None:
        recorded = _recorded(api)
        stranger = _signed_in(api, create_account(api))
        for client, wanted in (
            (stranger, recorded.request_id),  # another account's
            (_signed_in(api, recorded.account), "no-such-request"),
        ):
            page = client.get("/billing/requests", params={"request_id": wanted})
            assert page.status_code == 404, page.text
            assert "<h1>Request not found</h1>" in page.text
            assert f"no recorded request with the id <code>{wanted}</code>" in page.text
            assert 'id="components-table"' not in page.text
            assert f'value="{wanted}"' in page.text  # the search box, to try again

    def test_a_blank_search_is_400_and_signed_out_is_the_sign_in_page(self, api: Api) -> None:
        recorded = _recorded(api)
        client = _signed_in(api, recorded.account)
        blank = client.get("/billing/requests", params={"request_id": "  "})
        assert blank.status_code == 400, blank.text
        assert "enter a request id to look up" in blank.text
        signed_out = _client(api).get(
            "/billing/requests", params={"request_id": recorded.request_id}
        )
        assert signed_out.status_code == 401, signed_out.text
        assert recorded.request_id not in signed_out.text


class TestInChromium:
    def test_searched_from_activity_by_keyboard_shown_exactly_and_axe_clean(
        self, browser: Browser, portal: Api
    ) -> None:
        recorded = _recorded(portal)
        browser.driver.get(sign_in_link(portal, recorded.account))
        browser.click("#confirm")
        browser.open("/billing/activity")
        assert browser.axe_violations() == []
        field = browser.driver.find_element(By.ID, "request-id")
        field.click()
        before = browser.driver.find_element(By.TAG_NAME, "html")
        ActionChains(browser.driver).send_keys(recorded.request_id, Keys.ENTER).perform()
        browser.wait_for_new_page(before)
        assert browser.driver.current_url.endswith(
            f"/billing/requests?request_id={recorded.request_id}"
        )
        assert browser.text("h1") == f"Request {recorded.request_id}"
        shown = [_read(row) for row in browser.table_rows("components-table")]
        assert shown == _expected_rows(recorded)
        total = oracle.event_charge(recorded.event, GLM_RATES).total_microcents
        assert _dollars(browser.text("#request-total td")) == _usd(total)
        assert browser.text("#hold-status") == "settled"
        estimate = _dollars(browser.text("#hold-estimate"))
        assert estimate == _usd(recorded.hold["estimate_microcents"]) > 0
        assert browser.axe_violations() == []
        assert browser.console_errors() == []
        # Not found: its own page, with the box to try again.
        field = browser.driver.find_element(By.ID, "request-id")
        field.clear()
        before = browser.driver.find_element(By.TAG_NAME, "html")
        field.send_keys("no-such-request", Keys.ENTER)
        browser.wait_for_new_page(before)
        assert browser.text("h1") == "Request not found"
        assert "no-such-request" in browser.text("#problem")
        assert browser.axe_violations() == []
