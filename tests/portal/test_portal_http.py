"""The portal over HTTP (no browser), on both databases: the operator's link (audited, 15
minutes, single use), cookie flags over https, the access log without sign-in tokens, HTML
errors, CSV and export downloads equal to their sources, and the settings it needs."""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from metering.exports.commands import export
from metering.runtime import runtime_settings
from metering.settings import Settings
from tests import oracle
from tests.conftest import NOW, Api, running_api
from tests.factories import (
    GLM_RATES,
    create_account,
    create_key,
    expect,
    grant,
    ingest,
    priced_model,
    usage_event,
)

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _link(api: Api, account: str) -> str:
    response = api.admin("POST", f"/admin/v1/accounts/{account}/portal-sessions")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["expires_at"] == "2026-11-29T12:15:00Z" and body["account_id"] == account
    assert body["url"].startswith("http://testserver/billing/sign-in/")
    return str(body["url"]).removeprefix("http://testserver")


def _client(api: Api, base_url: str = "http://testserver") -> TestClient:
    return TestClient(api.client.app, base_url=base_url)  # type: ignore[arg-type]


def _sign_in(client: TestClient, path: str) -> object:
    page = client.get(path)
    assert page.status_code == 200, page.text
    match = CSRF.search(page.text)
    assert match
    return client.post(path, data={"csrf_token": match.group(1)}, follow_redirects=False)


def test_the_link_is_audited_single_use_and_lasts_15_minutes(api: Api) -> None:
    account = create_account(api)
    path = _link(api, account)
    events = api.admin("GET", "/admin/v1/audit-events", params={"account_id": account}).json()
    created = [e for e in events["data"] if e["action"] == "portal_session.create"]
    assert len(created) == 1 and re.fullmatch(r"token:[0-9a-f]{8}", created[0]["actor"])
    assert created[0]["changes"] == {"expires_at": "2026-11-29T12:15:00Z"}
    assert path.removeprefix("/billing/sign-in/") not in str(events)
    client = _client(api)
    signed_in = _sign_in(client, path)
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/billing"  # type: ignore[attr-defined]
    assert client.get(path).status_code == 410  # spent
    late = _link(api, account)
    api.clock.set(NOW + timedelta(minutes=15))
    assert _client(api).get(late).status_code == 410  # expired
    assert api.admin("POST", "/admin/v1/accounts/acct_nope/portal-sessions").status_code == 404


def test_cookie_flags_over_https(api: Api) -> None:
    account = create_account(api)
    client = _client(api, "https://testserver")
    response = _sign_in(client, _link(api, account))
    cookie = response.headers["set-cookie"]  # type: ignore[attr-defined]
    assert "metering_portal=" in cookie
    for flag in ("HttpOnly", "Secure", "SameSite=lax", "Path=/billing", "Max-Age=43200"):
        assert flag in cookie, cookie
    plain = _sign_in(_client(api), _link(api, account)).headers["set-cookie"]  # type: ignore[attr-defined]
    assert "Secure" not in plain and "HttpOnly" in plain


def test_the_access_log_never_shows_a_sign_in_token(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    account = create_account(api)
    path = _link(api, account)
    token = path.rsplit("/", 1)[1]
    caplog.set_level(logging.INFO, logger="metering.access")
    caplog.clear()
    _sign_in(_client(api), path)
    lines = [r.getMessage() for r in caplog.records if r.name == "metering.access"]
    assert len(lines) == 2
    assert all("/billing/sign-in/[redacted] " in line for line in lines), lines
    assert token not in caplog.text


def test_errors_are_html_pages_with_the_request_id(api: Api) -> None:
    account = create_account(api)
    client = _client(api)
    _sign_in(client, _link(api, account))
    for path, status in (
        ("/billing/nope", 404),
        ("/billing/usage?starting_at=2026-11-29T00:30:00Z", 400),
    ):
        response = client.get(path)
        assert response.status_code == status
        assert response.headers["content-type"].startswith("text/html")
        assert response.headers["x-request-id"] in response.text
    # A body over the limit: refused from its Content-Length, or when a chunked one passes it.
    page = client.get("/billing/notifications")
    csrf = CSRF.search(page.text)
    assert csrf
    too_big = (
        b"csrf_token=" + csrf.group(1).encode() + b"&url=" + b"x" * api.settings.max_body_bytes
    )
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for content in (too_big, iter([too_big[:1000], too_big[1000:]])):
        response = client.post("/billing/notifications", content=content, headers=form)
        assert response.status_code == 413
        assert response.headers["content-type"].startswith("text/html"), response.text
        assert response.headers["x-request-id"] in response.text
    json_route = api.client.post(
        "/v1/webhook-endpoints", content=too_big, headers={"Content-Type": "application/json"}
    )
    assert json_route.status_code == 413 and json_route.json()["error"]["limit_bytes"] == (
        api.settings.max_body_bytes
    )
    anonymous = _client(api).get("/billing/keys")
    assert anonymous.status_code == 401 and "Sign in" in anonymous.text
    assert "script-src 'self'" in anonymous.headers["content-security-policy"]


def test_the_csv_and_the_export_files_are_the_accounts_own(api: Api, tmp_path: Path) -> None:
    account = create_account(api)
    key = create_key(api, account)
    grant(api, account, 100)
    model = priced_model(api, NOW - timedelta(days=30))
    ingest(api, *[usage_event(key, model, NOW - timedelta(days=d, hours=1)) for d in range(1, 4)])
    client = _client(api)
    _sign_in(client, _link(api, account))
    query = {"starting_at": "2026-11-25", "ending_at": "2026-11-29", "group_by": "api_key"}
    csv = client.get("/billing/usage.csv", params=query)
    expected = api.as_key(key.secret, "GET", "/v1/usage", params={**query, "format": "csv"})
    assert csv.status_code == 200 and csv.text == expected.text
    settings = api.settings.model_copy(update={"export_dir": tmp_path / "exports"})
    assert export(settings, date(2026, 11, 27), None, None, account) == 0
    api.client.app.state.settings = settings  # type: ignore[attr-defined]
    try:
        page = client.get("/billing/exports")
        assert page.status_code == 200
        manifest = (tmp_path / "exports" / "2026-11-27" / "manifest.json").read_text()
        for name in (f"{account}.csv", f"{account}.parquet"):
            body = (tmp_path / "exports" / "2026-11-27" / name).read_bytes()
            digest = hashlib.sha256(body).hexdigest()
            assert digest in page.text and digest in manifest
            download = client.get(f"/billing/exports/2026-11-27/{name}")
            assert download.status_code == 200 and download.content == body
        # Another account's file, or a path outside the export directory, is not found.
        other = create_account(api)
        for name in (f"{other}.csv", "..%2Fmanifest.json", "manifest.json"):
            assert client.get(f"/billing/exports/2026-11-27/{name}").status_code == 404
    finally:
        api.client.app.state.settings = api.settings  # type: ignore[attr-defined]


def test_the_secret_key_and_public_address_settings() -> None:
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(secret_key="short")
    two = Settings(secret_key="a" * 32 + "," + "b" * 40)
    assert two.secret_key == ["a" * 32, "b" * 40]
    assert Settings(public_base_url="https://billing.example.com/").public_base_url == (
        "https://billing.example.com"
    )
    with pytest.raises(ValidationError):
        Settings(public_base_url="javascript:alert(1)")
    with pytest.raises(
        SystemExit, match="METERING_SECRET_KEY, METERING_PUBLIC_BASE_URL must be set"
    ):
        runtime_settings(
            Settings(
                database_url="postgresql+psycopg://x@127.0.0.1/x",
                admin_tokens=["a"],
                gateway_tokens=["g"],
            )
        )


def test_embedded_settings_get_a_kept_secret_key(tmp_path: Path) -> None:
    first = runtime_settings(Settings(data_dir=tmp_path))
    again = runtime_settings(Settings(data_dir=tmp_path))
    assert first.secret_key == again.secret_key and len(first.secret_key[0]) >= 32
    assert (tmp_path / "secret-key").stat().st_mode & 0o777 == 0o600
    assert first.public_base_url == "http://127.0.0.1:8000"


def test_the_portal_link_command(api: Api, tmp_path: Path) -> None:
    account = create_account(api)
    env = {
        "PATH": "/usr/bin:/bin",
        "METERING_DATABASE_URL": api.url,
        "METERING_PUBLIC_BASE_URL": "https://billing.example.com",
        "METERING_DATA_DIR": str(tmp_path),
    }
    metering = Path(sys.executable).with_name("metering")
    done = subprocess.run(
        [str(metering), "portal-link", account], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip()
    assert re.fullmatch(r"https://billing\.example\.com/billing/sign-in/[\w-]{43}", url), url
    assert (
        _sign_in(_client(api), url.removeprefix("https://billing.example.com")).status_code == 303
    )  # type: ignore[attr-defined]
    events = api.admin("GET", "/admin/v1/audit-events", params={"account_id": account}).json()
    assert [(e["action"], e["actor"]) for e in events["data"]] == [
        ("portal_session.create", "cli"),
        ("account.create", events["data"][1]["actor"]),
    ]
    missing = subprocess.run(
        [str(metering), "portal-link", "acct_nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "acct_nope" in missing.stderr

    # As a member: the link signs in with the member's role; a removed member gets none.
    member = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/members",
        json={"email": "v@example.com", "role": "viewer"},
    ).json()["id"]
    as_member = subprocess.run(
        [str(metering), "portal-link", account, "--member", member],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert as_member.returncode == 0, as_member.stderr
    client = _client(api)
    path = as_member.stdout.strip().removeprefix("https://billing.example.com")
    assert _sign_in(client, path).status_code == 303  # type: ignore[attr-defined]
    keys_page = client.get("/billing/keys")
    assert keys_page.status_code == 200 and 'id="make-key"' not in keys_page.text
    api.admin("DELETE", f"/admin/v1/members/{member}")
    assert client.get("/billing/keys").status_code == 401
    removed = subprocess.run(
        [str(metering), "portal-link", account, "--member", member],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert removed.returncode == 1 and member in removed.stderr


def _signed_in_client(api: Api, account: str) -> TestClient:
    client = _client(api)
    assert _sign_in(client, _link(api, account)).status_code == 303  # type: ignore[attr-defined]
    return client


def _cells(html: str, row_attribute: str, value: str) -> list[str]:
    row = re.search(rf'<tr {row_attribute}="{re.escape(value)}">(.*?)</tr>', html, re.S)
    assert row, value
    return [
        re.sub(r"<[^>]+>", "", cell).strip()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]


def _dollars(text: str) -> Decimal:
    return Decimal(text.replace("$", ""))


def test_the_keys_page_shows_the_months_spend_of_each_key_as_the_report_counts_it(
    api: Api,
) -> None:
    account = create_account(api)
    limited, other = create_key(api, account, limit_cents=250), create_key(api, account)
    revoked = create_key(api, account)
    grant(api, account, 1000)
    model = priced_model(api, NOW - timedelta(days=60))
    events = [usage_event(limited, model, NOW - timedelta(days=d, hours=1)) for d in range(5)]
    events += [usage_event(other, model, NOW - timedelta(days=40))]  # last month: not counted
    ingest(api, *events)
    expect(api.admin("DELETE", f"/admin/v1/api-keys/{revoked.id}"), 200)
    page = _signed_in_client(api, account).get("/billing/keys").text
    month = api.as_key(
        limited.secret,
        "GET",
        "/v1/usage",
        params={"starting_at": "2026-11-01", "ending_at": "2026-12-01", "group_by": "api_key"},
    ).json()
    spent = {key.id: 0 for key in (limited, other, revoked)}
    for bucket in month["data"]:
        for result in bucket["results"]:
            spent[result["api_key"]] += result["cost_microcents"]
    # The five events of this month, each at the oracle's charge (usage_event's 1000 prompt and
    # 100 output tokens at GLM-5.3's rates); last month's not counted.
    charge = oracle.charge(oracle.Tokens(1000, 0, 100), GLM_RATES).total_microcents
    assert spent == {limited.id: 5 * charge, other.id: 0, revoked.id: 0}
    for key, status, limit in (
        (limited, "active", "$2.50"),
        (other, "active", "no limit"),
        (revoked, "revoked", "no limit"),
    ):
        cells = _cells(page, "data-key", key.id)
        assert cells[1] == key.id and cells[3] == status and cells[6] == limit
        assert cells[4] == "month from 2026-11-01T00:00:00Z"
        assert _dollars(cells[5]) == Decimal(spent[key.id]).scaleb(-8)
    assert spent[limited.id] > 0 and limited.secret not in page


def test_the_models_page_shows_the_accounts_rates_as_v1_models_does(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    model = priced_model(api, NOW - timedelta(days=1), rates=(1_234_567, 7_654_321, 17))
    expect(
        api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/rates",
            json={
                "model": model,
                "effective_at": "2026-11-29T12:00:00Z",
                "input_microcents_per_million": 1,
                "output_microcents_per_million": 20_000_000,
                "cache_read_microcents_per_million": 3,
            },
        ),
        201,
    )
    page = _signed_in_client(api, account).get("/billing/models").text
    cards = {c["id"]: c for c in api.as_key(key.secret, "GET", "/v1/models").json()["data"]}
    pricing = cards[model]["wafer"]["pricing"]
    cells = _cells(page, "data-model", model)
    assert _dollars(cells[3]) == Decimal(pricing["input_microcents_per_million"]).scaleb(-8)
    assert _dollars(cells[4]) == Decimal(pricing["cache_read_microcents_per_million"]).scaleb(-8)
    assert _dollars(cells[5]) == Decimal(pricing["output_cents_per_million"]) / 100
    # The account's own rates as set above (µ¢ per million, shown as dollars), not the list's.
    assert cells[3:6] == ["$0.00000001", "$0.00000003", "$0.20"]


def test_every_asset_is_the_services_own(api: Api) -> None:
    account = create_account(api)
    client = _signed_in_client(api, account)
    for path in ("/billing", "/billing/usage", "/billing/keys", "/billing/sign-in"):
        html = client.get(path).text
        # An empty icon (data:,) keeps the browser from asking for /favicon.ico.
        assets = [a for a in re.findall(r'(?:src|href)="([^"]+)"', html) if a != "data:,"]
        assert assets and all(a.startswith("/billing") or a.startswith("#") for a in assets), assets
        links = re.findall(r'<link[^>]+href="(/[^"]+)"', html)
        for asset in re.findall(r'src="([^"]+)"', html) + links:
            assert client.get(asset).status_code == 200, asset
    chart = client.get("/billing/static/vendor/chart.js-4.5.1/chart.umd.min.js")
    assert chart.status_code == 200 and b"Chart.js v4.5.1" in chart.content
    assert client.get("/billing/static/vendor/chart.js-4.5.1/LICENSE.md").status_code == 200
    assert client.get("/billing/static/../../settings.py").status_code == 404


def test_without_a_secret_key_the_portal_says_so_and_signs_no_one_in(
    api: Api, tmp_path: Path
) -> None:
    with running_api(api.backend, api.url, tmp_path, secret_key=[]) as bare:
        page = bare.client.get("/billing/sign-in")
        assert page.status_code == 503 and "METERING_SECRET_KEY" in page.text
        assert page.headers["content-type"].startswith("text/html")
        assert "set-cookie" not in page.headers


def test_without_payments_no_billing_page_and_no_outside_script(api: Api) -> None:
    """No Stripe key: no Billing entry, its pages are unknown, and the policy allows no script
    from elsewhere (Stripe.js is loaded only when payments are on)."""
    assert not api.settings.payments_on
    client = _signed_in_client(api, create_account(api))
    overview = client.get("/billing")
    assert overview.status_code == 200
    assert "/billing/payments" not in overview.text and ">Billing<" not in overview.text
    assert "script-src 'self';" in overview.headers["content-security-policy"]
    for method, path in (
        ("GET", "/billing/payments"),
        ("GET", "/billing/payments/pay_x"),
        ("GET", "/billing/payments/pay_x/pay"),
        ("GET", "/billing/payments/card"),
    ):
        assert client.request(method, path).status_code == 404, path


def _sign_in_with_key(client: TestClient, secret: str) -> None:
    page = client.get("/billing/sign-in")
    match = CSRF.search(page.text)
    assert match
    data = {"csrf_token": match.group(1), "api_key": secret}
    response = client.post("/billing/sign-in", data=data, follow_redirects=False)
    assert response.status_code == 303, response.text


def test_a_session_signed_in_with_a_key_ends_when_the_key_is_revoked(api: Api) -> None:
    account = create_account(api)
    revoked, kept = create_key(api, account), create_key(api, account)
    by_revoked, by_kept, by_link = _client(api), _client(api), _client(api)
    _sign_in_with_key(by_revoked, revoked.secret)
    _sign_in_with_key(by_kept, kept.secret)
    _sign_in(by_link, _link(api, account))
    assert [c.get("/billing").status_code for c in (by_revoked, by_kept, by_link)] == [200] * 3
    assert api.admin("DELETE", f"/admin/v1/api-keys/{revoked.id}").status_code == 200
    ended = by_revoked.get("/billing/notifications")
    assert ended.status_code == 401 and "Sign in" in ended.text
    assert by_revoked.post("/billing/notifications", data={}).status_code in (401, 403)
    assert [c.get("/billing").status_code for c in (by_kept, by_link)] == [200, 200]


def test_a_form_sent_from_another_origin_is_refused(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    client = _client(api)
    _sign_in(client, _link(api, account))
    csrf = CSRF.search(client.get("/billing/notifications").text)
    assert csrf
    form = {"csrf_token": csrf.group(1), "url": "https://11.22.33.44/hook"}
    form["type:webhook.test"] = "on"
    for origin in (
        "https://evil.example",
        "http://testserver.evil.example",
        "null",
        "http://testserver:8080",
        "https://testserver",
    ):
        refused = client.post("/billing/notifications", data=form, headers={"Origin": origin})
        assert refused.status_code == 403, origin
        assert refused.headers["content-type"].startswith("text/html")
        assert "another site" in refused.text and refused.headers["x-request-id"] in refused.text
    assert api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []
    # Signing in from another site is refused too.
    stranger = _client(api)
    page = stranger.get("/billing/sign-in")
    token = CSRF.search(page.text)
    assert token
    signing_in = {"csrf_token": token.group(1), "api_key": key.secret}
    headers = {"Origin": "https://evil.example"}
    assert stranger.post("/billing/sign-in", data=signing_in, headers=headers).status_code == 403
    # The portal's own origin and no Origin at all are accepted.
    for headers in ({"Origin": "http://testserver"}, {"Origin": "HTTP://TESTSERVER:80"}, {}):
        made = client.post("/billing/notifications", data=form, headers=headers)
        assert made.status_code in (200, 303), made.text
    # Behind a proxy the request comes to another address: the published one is the portal's.
    proxied = _client(api, "http://10.0.0.5:8000")
    _sign_in(proxied, _link(api, account))
    csrf = CSRF.search(proxied.get("/billing/notifications").text)
    assert csrf
    form["csrf_token"] = csrf.group(1)
    published = proxied.post(
        "/billing/notifications", data=form, headers={"Origin": "http://testserver"}
    )
    assert published.status_code in (200, 303), published.text
    assert len(api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"]) == 4
