"""The portal in a real browser (headless chromium), on SQLite and PostgreSQL: signing in by
link and by key, every page without console errors, charts drawn with the numbers of their
tables, the tables' and the balances' amounts those of the price oracle (tests/oracle.py, through
the golden reports of tests/reports/golden.py) and equal to the JSON API, one account never
seeing another's data, and the refusals (a forged or replayed link, a missing CSRF token, an
expired or ended session)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx2 as httpx
from selenium.webdriver.common.by import By

from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    create_account,
    create_key,
    grant,
    priced_model,
    unique,
)
from tests.portal.browser import Browser, sign_in_link
from tests.portal.conftest import export_dir, export_rollforward
from tests.reports.golden import Pricing, Sent, expected_report, send_batch

PAGES = ("", "/usage", "/keys", "/activity", "/exports", "/notifications", "/models")
GRANT_CENTS = 1000
OTHER_RATES = (1_234_567, 7_654_321, 3)


def _client(api: Api, cookies: dict[str, str]) -> httpx.Client:
    """A plain HTTP client holding the browser's cookies (a script forging a request)."""
    return httpx.Client(base_url=str(api.client.base_url), cookies=cookies, timeout=30)


@dataclass(frozen=True)
class Usage:
    """An account with two keys, each with usage on one model over ``days`` days: what was
    sent, each event at the price oracle's charge."""

    account: str
    first: Key
    second: Key
    model: str
    sent: list[Sent]
    key_names: dict[str, str]

    def spent(self, key: Key, since: datetime = datetime.min.replace(tzinfo=UTC)) -> int:
        return sum(s.cost_microcents for s in self.sent if s.key == key and s.occurred_at >= since)

    @property
    def balance(self) -> int:
        """The grant less every charge, by the oracle."""
        return GRANT_CENTS * 10**6 - sum(s.cost_microcents for s in self.sent)

    def report(self, query: dict[str, str]) -> dict[str, Any]:
        """The ``GET /v1/usage`` report of ``query`` computed from the events sent (``ending_at``
        defaults to the end of the clock's day, as it stands here)."""
        return expected_report(
            self.sent,
            _instant(query["starting_at"]),
            _instant(query.get("ending_at", "2026-11-30")),
            bucket_width=query.get("bucket_width", "1d"),
            group_by=query.get("group_by", "model"),
            key_names=self.key_names,
        )


def _instant(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _account_with_usage(api: Api, days: int = 5) -> Usage:
    account = create_account(api)
    names = [unique("first"), unique("second")]
    first = create_key(api, account, limit_cents=500, name=names[0])
    second = create_key(api, account, name=names[1])
    grant(api, account, GRANT_CENTS)
    model = priced_model(api, NOW - timedelta(days=60))
    other = priced_model(api, NOW - timedelta(days=60), rates=OTHER_RATES)
    pricing = Pricing({model: GLM_RATES, other: OTHER_RATES})
    specs = []
    for day in range(days):
        at = NOW - timedelta(days=day, hours=2)
        # 6 cache reads at 17.75 µ¢: 106.5, a half the oracle rounds up.
        specs += [(first, model, at, 1000, 6, 100), (second, other, at, 37, 0, 11)]
    sent = send_batch(api, pricing, specs)
    key_names = {first.id: names[0], second.id: names[1]}
    return Usage(account, first, second, model, sent, key_names)


def _sign_in_by_link(browser: Browser, api: Api, account: str) -> None:
    browser.driver.get(sign_in_link(api, account))
    assert "Sign in to your billing portal" in browser.text("h1")
    browser.click("#confirm")
    assert browser.driver.current_url.endswith("/billing")


def _sign_in_by_key(browser: Browser, secret: str) -> None:
    browser.open("/billing/sign-in")
    browser.driver.find_element(By.ID, "api_key").send_keys(secret)
    browser.click("form.stack button")
    assert browser.driver.current_url.endswith("/billing"), browser.driver.current_url


def _expected_rows(report: dict[str, Any]) -> list[list[str]]:
    """The table rows a report implies, written independently of the portal's code."""
    by_key = report["group_by"] == "api_key"
    rows = []
    for bucket in report["data"]:
        for result in bucket["results"]:
            cost = Decimal(result["cost_microcents"]).scaleb(-8)
            if result["cost_usd"] is not None:
                assert Decimal(str(result["cost_usd"])) == cost
            group = f"{result['api_key_name']} {result['api_key']}" if by_key else result["model"]
            rows.append(
                [
                    bucket["starting_at"],
                    group,
                    *(
                        f"{result[m]:,}"
                        for m in ("requests", "input_tokens", "cache_read_tokens", "output_tokens")
                    ),
                    cost,
                ]
            )
    return rows


def _shown_rows(browser: Browser, table_id: str) -> list[list[Any]]:
    rows = browser.table_rows(table_id)
    for row in rows:
        assert row[-1].startswith("$") or row[-1].startswith("-$"), row
        row[-1] = Decimal(row[-1].replace("$", ""))
    return rows


def _json_report(api: Api, key: Key, **query: str) -> dict[str, Any]:
    response = api.as_key(key.secret, "GET", "/v1/usage", params=query)
    assert response.status_code == 200, response.text
    return dict(response.json(parse_float=Decimal))


def _assert_chart_matches(browser: Browser, chart_id: str, report: dict[str, Any]) -> None:
    painted = browser.chart_painted(chart_id)
    groups = {r.get("api_key") or r.get("model") for b in report["data"] for r in b["results"]}
    assert painted["datasets"] == len(groups) > 0, painted
    assert painted["painted"] > 1000, painted  # bars, axes and labels were drawn
    source = browser.chart_source(chart_id)
    assert source["labels"] == [bucket["starting_at"] for bucket in report["data"]]
    drawn = {d["label"]: d["data"] for d in source["datasets"]}
    for index, bucket in enumerate(report["data"]):
        for result in bucket["results"]:
            group = result.get("api_key") or result["model"]
            label = f"{result['api_key_name']} ({group})" if "api_key" in result else group
            assert drawn[label][index] == result["cost_microcents"]


def test_sign_in_by_link_and_the_overview_equals_the_oracle_and_the_json_api(
    browser: Browser, portal: Api
) -> None:
    usage = _account_with_usage(portal)
    _sign_in_by_link(browser, portal, usage.account)
    credits = portal.as_key(usage.first.secret, "GET", "/v1/credits").json(parse_float=Decimal)
    expected = {"balance": usage.balance, "held": 0, "available": usage.balance}
    for field in ("balance", "held", "available"):
        shown = Decimal(browser.text(f"#{field}").replace("$", ""))
        assert shown == Decimal(expected[field]).scaleb(-8), field
        assert shown == Decimal(str(credits[f"{field}_cents"])) / 100
    query = {"starting_at": "2026-10-31", "bucket_width": "1d"}
    report = usage.report(query)
    assert _json_report(portal, usage.first, **query) == report
    assert _shown_rows(browser, "daily-table") == _expected_rows(report)
    _assert_chart_matches(browser, "daily-chart", report)
    assert browser.console_errors() == []


def test_sign_in_by_key_and_usage_by_key_by_hour_equals_the_oracle_and_the_json_api(
    browser: Browser, portal: Api
) -> None:
    usage = _account_with_usage(portal)
    first = usage.first
    _sign_in_by_key(browser, first.secret)
    for query in (
        {
            "starting_at": "2026-11-25",
            "ending_at": "2026-11-30",
            "bucket_width": "1d",
            "group_by": "model",
        },
        {
            "starting_at": "2026-11-25",
            "ending_at": "2026-11-30",
            "bucket_width": "1d",
            "group_by": "api_key",
        },
        {
            "starting_at": "2026-11-28T00:00:00Z",
            "ending_at": "2026-11-29T12:00:00Z",
            "bucket_width": "1h",
            "group_by": "api_key",
        },
    ):
        browser.open("/billing/usage?" + str(httpx.QueryParams(query)))
        report = usage.report(query)
        assert _json_report(portal, first, **query) == report, query
        assert _shown_rows(browser, "usage-table") == _expected_rows(report), query
        _assert_chart_matches(browser, "usage-chart", report)
        totals = browser.driver.find_elements(By.CSS_SELECTOR, "#usage-table tfoot td")
        assert totals[0].text == f"{report['totals']['requests']:,}"
        assert Decimal(totals[-1].text.replace("$", "")) == Decimal(
            report["totals"]["cost_microcents"]
        ).scaleb(-8)
    assert browser.console_errors() == []


def test_every_page_loads_without_console_errors(browser: Browser, portal: Api) -> None:
    usage = _account_with_usage(portal)
    first, second = usage.first, usage.second
    _sign_in_by_key(browser, first.secret)
    for page in PAGES:
        browser.open("/billing" + page)
        assert browser.driver.find_element(By.TAG_NAME, "h1").text
        assert browser.console_errors() == [], page
    browser.open("/billing/keys")
    keys = {
        row.get_attribute("data-key")
        for row in browser.driver.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")
    }
    assert keys == {first.id, second.id}
    assert first.secret not in browser.driver.page_source


def test_a_second_accounts_session_never_sees_the_first_accounts_data(
    browser: Browser, portal: Api
) -> None:
    usage = _account_with_usage(portal)
    first_account, first_key, first_model = usage.account, usage.first, usage.model
    other_account = create_account(portal)
    other_key = create_key(portal, other_account)
    _sign_in_by_key(browser, other_key.secret)
    for page in PAGES:
        browser.open("/billing" + page)
        source = browser.driver.page_source
        assert first_account not in source and first_key.id not in source, page
        if page in ("", "/usage"):
            assert browser.table_rows("daily-table" if page == "" else "usage-table") == []
    browser.open("/billing/usage?group_by=api_key&starting_at=2026-11-25")
    assert first_key.id not in browser.driver.page_source
    # The other session is untouched: signing in as the first account shows its own usage.
    browser.driver.delete_all_cookies()
    _sign_in_by_key(browser, first_key.secret)
    assert first_model in browser.driver.page_source


def test_a_replayed_or_forged_link_is_refused(browser: Browser, portal: Api) -> None:
    account = create_account(portal)
    link = sign_in_link(portal, account)
    browser.driver.get(link)
    browser.click("#confirm")
    assert browser.driver.current_url.endswith("/billing")
    browser.driver.delete_all_cookies()
    browser.driver.get(link)  # spent: no confirmation button any more
    assert "cannot be used" in browser.text("h1")
    assert not browser.driver.find_elements(By.ID, "confirm")
    forged = link[:-6] + ("AAAAAA" if not link.endswith("AAAAAA") else "BBBBBB")
    browser.driver.get(forged)
    assert "cannot be used" in browser.text("h1")
    browser.open("/billing")
    assert "Sign in" in browser.text("h1")


def test_a_link_opened_twice_signs_in_once(browser: Browser, portal: Api) -> None:
    """Two confirmation pages of one link (two tabs, or a scanner that fetched it): only the
    first POST signs in."""
    account = create_account(portal)
    link = sign_in_link(portal, account)
    browser.driver.get(link)
    csrf = browser.csrf()
    cookies = {c["name"]: c["value"] for c in browser.driver.get_cookies()}
    browser.click("#confirm")
    assert browser.driver.current_url.endswith("/billing")
    path = link.removeprefix(str(portal.client.base_url).rstrip("/"))
    again = _client(portal, cookies).post(path, data={"csrf_token": csrf})
    assert again.status_code == 410 and "metering_portal=" not in again.headers.get(
        "set-cookie", ""
    )


def test_forms_without_their_csrf_token_are_refused(browser: Browser, portal: Api) -> None:
    account = create_account(portal)
    key = create_key(portal, account)
    link = sign_in_link(portal, account)
    browser.driver.get(link)
    cookies = {c["name"]: c["value"] for c in browser.driver.get_cookies()}
    path = link.removeprefix(str(portal.client.base_url).rstrip("/"))
    for data in ({}, {"csrf_token": "forged"}):
        refused = _client(portal, cookies).post(path, data=data)
        assert refused.status_code == 403 and "request id" in refused.text
        by_key = _client(portal, cookies).post(
            "/billing/sign-in", data={**data, "api_key": key.secret}
        )
        assert by_key.status_code == 403
    # The link was not spent by the refused attempts.
    browser.click("#confirm")
    assert browser.driver.current_url.endswith("/billing")
    session = {c["name"]: c["value"] for c in browser.driver.get_cookies()}
    assert _client(portal, session).post("/billing/sign-out", data={}).status_code == 403
    assert _client(portal, session).get("/billing").status_code == 200


def test_an_expired_session_and_a_signed_out_one_are_refused(browser: Browser, portal: Api) -> None:
    account = create_account(portal)
    key = create_key(portal, account)
    _sign_in_by_key(browser, key.secret)
    cookie = browser.cookie("metering_portal")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    assert cookie["path"] == "/billing"
    portal.clock.set(NOW + timedelta(hours=12))
    browser.open("/billing/usage")
    assert "Sign in" in browser.text("h1")
    portal.clock.set(NOW)
    _sign_in_by_key(browser, key.secret)
    value = {"metering_portal": browser.cookie("metering_portal")["value"]}  # type: ignore[index]
    browser.click("form.sign-out button")
    assert browser.driver.current_url.endswith("/billing/sign-in")
    # The same cookie, replayed after signing out, is refused: the session ended on the server.
    assert _client(portal, value).get("/billing").status_code == 401


def test_the_overviews_grants_and_the_keys_windows_equal_the_oracle_and_the_json_api(
    browser: Browser, portal: Api
) -> None:
    usage = _account_with_usage(portal)
    account, first, second, model = usage.account, usage.first, usage.second, usage.model
    promotional = portal.client.post(
        f"/admin/v1/accounts/{account}/grants",
        json={
            "amount_cents": 3,
            "idempotency_key": f"promo-{account}",
            "category": "promotional",
            "expires_at": "2026-12-05T00:00:00Z",
        },
        headers=portal.admin_headers,
    )
    assert promotional.status_code == 201, promotional.text
    narrowed = portal.admin(
        "PATCH",
        f"/admin/v1/api-keys/{second.id}",
        json={"spend_limit_cents": 2, "spend_limit_window": "week", "allowed_models": [model]},
    )
    assert narrowed.status_code == 200, narrowed.text
    _sign_in_by_key(browser, first.secret)
    credits = portal.as_key(first.secret, "GET", "/v1/credits").json(parse_float=Decimal)
    shown = browser.table_rows("grants-table")
    assert [row[0] for row in shown] == [live["id"] for live in credits["grants"]]
    assert shown[0][0] == promotional.json()["id"] and shown[0][1] == "promotional"
    # The usage came before the promotional grant: the paid one paid all of it.
    remaining = [3 * 10**6, usage.balance]
    for row, live, left in zip(shown, credits["grants"], remaining, strict=True):
        assert Decimal(row[3].replace("$", "")) == Decimal(left).scaleb(-8)
        assert Decimal(row[3].replace("$", "")) == Decimal(str(live["remaining_cents"])) / 100
        assert row[5] == (live["expires_at"] or "never") and row[6] == "active"
    # Each key's spend in its window: the first's month, the second's week (from Monday).
    windows = {
        first.id: datetime(2026, 11, 1, tzinfo=UTC),
        second.id: datetime(2026, 11, 23, tzinfo=UTC),
    }
    keys = {first.id: first, second.id: second}
    browser.open("/billing/keys")
    listed = portal.as_key(first.secret, "GET", "/v1/api-keys").json(parse_float=Decimal)
    for body in listed["data"]:
        row = browser.driver.find_element(
            By.CSS_SELECTOR, f'#keys-table tr[data-key="{body["id"]}"]'
        )
        cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        assert cells[4] == f"{body['spend_limit_window']} from {body['window_starts_at']}"
        spent = usage.spent(keys[body["id"]], since=windows[body["id"]])
        assert spent > 0 and Decimal(cells[5].replace("$", "")) == Decimal(spent).scaleb(-8)
        assert Decimal(cells[5].replace("$", "")) == Decimal(body["spent_microcents"]).scaleb(-8)
        models = body["allowed_models"]
        assert cells[7] == ("all of the account's models" if models is None else ", ".join(models))
    assert browser.console_errors() == []


def test_notifications_add_test_disable_and_remove_in_the_browser(
    browser: Browser, portal: Api
) -> None:
    account = create_account(portal)
    key = create_key(portal, account)
    _sign_in_by_key(browser, key.secret)
    browser.open("/billing/notifications")
    browser.driver.find_element(By.ID, "url").send_keys("https://11.22.33.44/hook")
    box = browser.driver.find_element(By.CSS_SELECTOR, 'input[name="type:credit.balance_low"]')
    box.click()
    browser.driver.find_element(By.ID, "description").send_keys("finance")
    browser.click("#add-endpoint button[type=submit]")
    secret = browser.driver.find_element(By.ID, "created-secret").get_attribute("value") or ""
    assert secret.startswith("whsec_")
    (endpoint,) = portal.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"]
    assert endpoint["event_types"] == ["credit.balance_low"] and endpoint["enabled"]
    section = f'section[data-endpoint="{endpoint["id"]}"]'
    browser.click(f"{section} button.send-test")
    deliveries = portal.as_key(
        key.secret, "GET", f"/v1/webhook-endpoints/{endpoint['id']}/deliveries"
    ).json()["data"]
    shown = browser.table_rows(f"deliveries-{endpoint['id']}")
    assert [row[:4] for row in shown] == [
        [d["event_id"], d["type"], d["status"], str(d["attempts"])] for d in deliveries
    ]
    assert [d["type"] for d in deliveries] == ["webhook.test"]
    browser.click(f"{section} button.toggle")
    assert browser.text(f"{section} .state") == "disabled"
    got = portal.as_key(key.secret, "GET", f"/v1/webhook-endpoints/{endpoint['id']}").json()
    assert got["enabled"] is False
    browser.click(f"{section} button.remove")
    assert browser.driver.find_elements(By.ID, "no-endpoints")
    assert portal.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []
    assert secret not in browser.driver.page_source
    assert browser.console_errors() == []


def test_the_exports_page_shows_the_accounts_rollforward_rows(
    browser: Browser, portal: Api
) -> None:
    usage = _account_with_usage(portal)
    account, first = usage.account, usage.first
    day = export_rollforward(portal, date(2026, 11, 29))
    _sign_in_by_key(browser, first.secret)
    browser.open("/billing/exports")
    lines = (export_dir(portal) / day.isoformat() / "credits.csv").read_text().splitlines()
    mine = [line.split(",") for line in lines[1:] if line.split(",")[1] == account]
    assert mine
    shown = browser.table_rows("rollforward-table")
    assert [row[:2] for row in shown] == [[line[0], line[2]] for line in mine]
    for row, line in zip(shown, mine, strict=True):
        assert [Decimal(cell.replace("$", "")) for cell in row[2:]] == [
            Decimal(value).scaleb(-8) for value in line[3:]
        ]
    # The closing rows sum to the balance at the day's end: the grant less the oracle's charges.
    closing = sum(Decimal(row[-1].replace("$", "")) for row in shown)
    assert closing == Decimal(usage.balance).scaleb(-8)
    assert browser.console_errors() == []
