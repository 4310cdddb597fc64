"""The portal's pages over HTTP (no browser), on both databases, against the JSON routes for
the same account and, for the amounts that usage moves, against the price oracle
(tests/oracle.py): the Overview's credit grants and low-balance threshold (``/v1/credits``, the
grants' own bodies, the account), the Keys page's spend windows and allowed models
(``/v1/api-keys``), the Notifications page and its forms (``/v1/webhook-endpoints``, audited as
the portal), the Exports page's credit roll-forward rows (the day's ``credits.csv``), and the
scheduler's clean-up of finished sessions and sign-in links."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from metering.models import CreditRollforward, PortalSession, PortalSignInToken
from metering.scheduler import Scheduler
from tests import oracle
from tests.conftest import NOW, Api
from tests.exports.helpers import exporter
from tests.factories import (
    GLM_RATES,
    Key,
    create_account,
    create_key,
    exact_json,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.portal.test_portal_http import CSRF, _cells, _client, _dollars, _link, _sign_in

PUBLIC = "https://11.22.33.44/hook"  # public for the address rules (TEST-NETs are reserved)
# usage_event's default usage (1000 prompt tokens, 100 output) at GLM-5.3's rates.
CHARGE = oracle.charge(oracle.Tokens(1000, 0, 100), GLM_RATES).total_microcents


def _signed_in(api: Api, account: str) -> TestClient:
    client = _client(api)
    assert _sign_in(client, _link(api, account)).status_code == 303  # type: ignore[attr-defined]
    return client


def _admin_grant(api: Api, account: str, cents: str, **body: Any) -> dict[str, Any]:
    """A grant through the admin route, ``cents`` sent as an exact JSON number."""
    fields = json.dumps({"idempotency_key": unique("g"), **body})
    response = api.client.post(
        f"/admin/v1/accounts/{account}/grants",
        content=f'{{"amount_cents": {cents}, {fields[1:]}',
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    return dict(exact_json(response))


def _new_link(api: Api, account: str) -> str:
    response = api.admin("POST", f"/admin/v1/accounts/{account}/portal-sessions")
    assert response.status_code == 201, response.text
    return str(response.json()["url"]).removeprefix("http://testserver")


def _rows(html: str, table_id: str) -> list[list[str]]:
    table = re.search(rf'<table[^>]*\bid="{table_id}"[^>]*>(.*?)</table>', html, re.S)
    assert table, table_id
    body = re.search(r"<tbody>(.*?)</tbody>", table.group(1), re.S)
    assert body
    return [
        [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body.group(1), re.S)
    ]


def _cents_as_dollars(value: Any) -> Decimal:
    return Decimal(str(value)) / 100


class TestOverview:
    def test_grants_and_threshold_equal_the_json_api(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        soon = format(NOW + timedelta(days=3), "%Y-%m-%dT%H:%M:%SZ")
        later = format(NOW + timedelta(days=20), "%Y-%m-%dT%H:%M:%SZ")
        promo = _admin_grant(api, account, "5", category="promotional", expires_at=soon)
        paid = _admin_grant(api, account, "10")
        paid_expiring = _admin_grant(api, account, "2.5", expires_at=later)
        voided = _admin_grant(api, account, "1.000001")
        assert (
            api.admin(
                "POST", f"/admin/v1/grants/{voided['id']}/void", json={"reason": "x"}
            ).status_code
            == 200
        )
        patched = api.admin(
            "PATCH", f"/admin/v1/accounts/{account}", json={"low_balance_threshold_cents": 250.5}
        )
        assert patched.status_code == 200, patched.text
        model = priced_model(api, NOW - timedelta(days=30))
        ingest(api, *[usage_event(key, model, NOW - timedelta(hours=h + 1)) for h in range(3)])

        page = _signed_in(api, account).get("/billing").text
        credits = api.as_key(key.secret, "GET", "/v1/credits").json(parse_float=Decimal)
        shown = _rows(page, "grants-table")
        assert [row[0] for row in shown] == [g["id"] for g in credits["grants"]]
        assert [row[0] for row in shown] == [promo["id"], paid_expiring["id"], paid["id"]]
        for row, listed in zip(shown, credits["grants"], strict=True):
            body = api.admin("GET", f"/admin/v1/grants/{listed['id']}").json(parse_float=Decimal)
            assert row[1] == listed["category"] == body["category"]
            assert row[2] == str(body["priority"])
            assert _dollars(row[3]) == _cents_as_dollars(listed["remaining_cents"])
            assert _dollars(row[4]) == _cents_as_dollars(body["amount_cents"])
            assert row[5] == (listed["expires_at"] or "never")
            assert row[6] == body["status"] == "active"
        # The promotional grant paid the usage first, at the oracle's charges; the rest is whole.
        remaining = [5_000_000 - 3 * CHARGE, 2_500_000, 10_000_000]
        assert [_dollars(row[3]) for row in shown] == [Decimal(r).scaleb(-8) for r in remaining]
        past = _rows(page, "past-grants-table")
        assert [(row[0], row[3], row[6]) for row in past] == [(voided["id"], "$0.00", "voided")]
        assert "Low-balance threshold: <strong>$2.505</strong>" in page

    def test_no_threshold_and_no_grants(self, api: Api) -> None:
        account = create_account(api)
        page = _signed_in(api, account).get("/billing").text
        assert "Low-balance threshold: none set" in page
        assert _rows(page, "grants-table") == [["No live grants: no credit is left to spend."]]
        assert "past-grants-table" not in page


class TestKeys:
    def test_spend_windows_limits_and_models_equal_v1_api_keys(self, api: Api) -> None:
        account = create_account(api)
        model = priced_model(api, NOW - timedelta(days=60))
        other_model = priced_model(api, NOW - timedelta(days=60))
        keys = {}
        for window, limit, models in (
            ("day", 1.5, [model]),
            ("week", 7, [other_model, model]),
            ("month", None, None),
        ):
            response = api.admin(
                "POST",
                f"/admin/v1/accounts/{account}/api-keys",
                json={
                    "name": f"{window} key",
                    "spend_limit_cents": limit,
                    "spend_limit_window": window,
                    "allowed_models": models,
                },
            )
            assert response.status_code == 201, response.text
            keys[window] = response.json()
        _admin_grant(api, account, "1000")
        events = []
        for window in keys:
            for days in (0, 2, 9, 40):  # today; this week (Mon 23 Nov); this month; last month
                key = Key(keys[window]["id"], keys[window]["key"], account)
                events.append(usage_event(key, model, NOW - timedelta(days=days, hours=1)))
        assert ingest(api, *events)["recorded"] == len(events)

        page = _signed_in(api, account).get("/billing/keys").text
        listed = api.as_key(keys["day"]["key"], "GET", "/v1/api-keys").json(parse_float=Decimal)
        assert len(listed["data"]) == 3
        spent = set()
        for body in listed["data"]:
            cells = _cells(page, "data-key", body["id"])
            assert cells[0] == body["name"] and cells[1] == body["id"] and cells[3] == "active"
            assert cells[4] == f"{body['spend_limit_window']} from {body['window_starts_at']}"
            assert _dollars(cells[5]) == Decimal(body["spent_microcents"]).scaleb(-8)
            assert _dollars(cells[5]) == _cents_as_dollars(body["spent_cents"])
            if body["spend_limit_cents"] is None:
                assert cells[6] == "no limit"
            else:
                assert _dollars(cells[6]) == _cents_as_dollars(body["spend_limit_cents"])
            if body["allowed_models"] is None:
                assert cells[7] == "all of the account's models"
            else:
                assert cells[7] == ", ".join(body["allowed_models"])
            spent.add(body["spent_microcents"])
        assert {b["window_starts_at"] for b in listed["data"]} == {
            "2026-11-29T00:00:00Z",
            "2026-11-23T00:00:00Z",
            "2026-11-01T00:00:00Z",
        }
        # Each window counts its own spend: the day's event; the week's two (from Monday the
        # 23rd); the month's three (not last month's), at the oracle's charge each.
        by_window = {
            body["spend_limit_window"]: body["spent_microcents"] for body in listed["data"]
        }
        assert by_window == {"day": CHARGE, "week": 2 * CHARGE, "month": 3 * CHARGE}


def _form(html: str) -> str:
    match = CSRF.search(html)
    assert match
    return match.group(1)


class TestNotifications:
    def test_add_disable_test_and_remove_as_the_json_api_shows(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        client = _signed_in(api, account)
        page = client.get("/billing/notifications")
        assert page.status_code == 200 and 'id="no-endpoints"' in page.text
        for operator_only in (
            "authorization.expired_unused",
            "usage.quarantined",
            "export.completed",
        ):
            assert operator_only not in page.text
        csrf = _form(page.text)
        added = client.post(
            "/billing/notifications",
            data={
                "csrf_token": csrf,
                "url": PUBLIC,
                "description": "finance",
                "type:credit.balance_low": "on",
                "type:webhook.test": "on",
            },
        )
        assert added.status_code == 200, added.text
        secret = re.search(r'id="created-secret" value="(whsec_[^"]+)"', added.text)
        assert secret
        listed = api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"]
        assert len(listed) == 1
        endpoint = listed[0]
        assert endpoint["url"] == PUBLIC and endpoint["description"] == "finance"
        assert endpoint["event_types"] == ["credit.balance_low", "webhook.test"]
        assert endpoint["account_id"] == account and endpoint["enabled"]
        shown = client.get("/billing/notifications").text
        assert secret.group(1) not in shown  # the secret is shown once
        section = re.search(
            rf'<section class="endpoint" id="endpoint-{endpoint["id"]}".*?</section>', shown, re.S
        )
        assert section
        assert "<code>credit.balance_low</code>, <code>webhook.test</code>" in section.group(0)
        assert '<dd class="state">enabled</dd>' in section.group(0)

        path = f"/billing/notifications/{endpoint['id']}"
        tested = client.post(f"{path}/test", data={"csrf_token": csrf}, follow_redirects=False)
        assert tested.status_code == 303 and tested.headers["location"] == "/billing/notifications"
        deliveries = api.as_key(
            key.secret, "GET", f"/v1/webhook-endpoints/{endpoint['id']}/deliveries"
        ).json()["data"]
        assert [d["type"] for d in deliveries] == ["webhook.test"]
        shown = client.get("/billing/notifications").text
        rows = _rows(shown, f"deliveries-{endpoint['id']}")
        assert rows == [
            [
                deliveries[0]["event_id"],
                "webhook.test",
                deliveries[0]["status"],
                str(deliveries[0]["attempts"]),
                "—",
                deliveries[0]["next_attempt_at"] or "—",
                "—",
            ]
        ]

        assert client.post(f"{path}/disable", data={"csrf_token": csrf}).status_code == 200
        got = api.as_key(key.secret, "GET", f"/v1/webhook-endpoints/{endpoint['id']}").json()
        assert got["enabled"] is False
        assert '<dd class="state">disabled</dd>' in client.get("/billing/notifications").text
        assert client.post(f"{path}/enable", data={"csrf_token": csrf}).status_code == 200
        got = api.as_key(key.secret, "GET", f"/v1/webhook-endpoints/{endpoint['id']}").json()
        assert got["enabled"] is True
        assert client.post(f"{path}/delete", data={"csrf_token": csrf}).status_code == 200
        assert api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []

        audit = api.admin("GET", "/admin/v1/audit-events", params={"account_id": account}).json()
        mine = [
            (e["action"], e["actor"]) for e in audit["data"] if e["actor"].startswith("portal:")
        ]
        assert sorted(mine) == sorted(
            (action, f"portal:{account}")
            for action in (
                "webhook_endpoint.create",
                "webhook_endpoint.test",
                "webhook_endpoint.update",
                "webhook_endpoint.update",
                "webhook_endpoint.delete",
            )
        )
        assert secret.group(1) not in str(audit)

    def test_refusals_change_nothing(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        other = create_account(api)
        foreign = api.admin(
            "POST",
            "/admin/v1/webhook-endpoints",
            json={"url": PUBLIC, "event_types": ["webhook.test"], "account_id": other},
        ).json()
        client = _signed_in(api, account)
        csrf = _form(client.get("/billing/notifications").text)
        good = {"url": PUBLIC, "type:webhook.test": "on"}
        for data in ({}, {"csrf_token": "forged"}):
            refused = client.post("/billing/notifications", data={**good, **data})
            assert refused.status_code == 403 and "request id" in refused.text
            for action in ("disable", "delete", "test"):
                path = f"/billing/notifications/{foreign['id']}/{action}"
                assert client.post(path, data=data).status_code == 403
        for data, problem in (
            ({"url": PUBLIC}, "Choose at least one event type."),
            ({"url": "http://11.22.33.44/hook", "type:webhook.test": "on"}, "must be https://"),
            ({"url": "https://127.0.0.1/hook", "type:webhook.test": "on"}, "private"),
            ({"url": "", "type:webhook.test": "on"}, "Give the endpoint"),
            (
                {**good, "type:usage.quarantined": "on"},
                "&#39;usage.quarantined&#39; is for operators only",
            ),
            (
                {**good, "type:export.completed": "on"},
                "&#39;export.completed&#39; is for operators only",
            ),
            ({**good, "type:credit.nope": "on"}, "unknown event type &#39;credit.nope&#39;"),
            ({**good, "description": "x" * 501}, "at most 500 characters"),
            ({**good, "description": "a\x00b"}, "without NUL characters"),
        ):
            response = client.post("/billing/notifications", data={"csrf_token": csrf, **data})
            assert response.status_code == 400, data
            assert 'role="alert"' in response.text and problem in response.text, response.text
        # Another account's endpoint is not found (the account's scope), and stays as it was.
        for action in ("disable", "delete", "test"):
            path = f"/billing/notifications/{foreign['id']}/{action}"
            response = client.post(path, data={"csrf_token": csrf})
            assert response.status_code == 404 and "request id" in response.text
        assert (
            client.post(
                "/billing/notifications/whep%00x/test", data={"csrf_token": csrf}
            ).status_code
            == 400
        )
        assert api.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []
        still = api.admin("GET", f"/admin/v1/webhook-endpoints/{foreign['id']}").json()
        assert still["enabled"] is True
        assert (
            api.admin("GET", f"/admin/v1/webhook-endpoints/{foreign['id']}/deliveries").json()[
                "data"
            ]
            == []
        )


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


class TestExports:
    def test_the_rollforward_rows_are_the_accounts_rows_of_credits_csv(
        self, fresh_api: Api, tmp_path: Path
    ) -> None:
        api = fresh_api
        day = date(2026, 11, 29)
        with api.database.unit_of_work() as session:
            session.execute(update(CreditRollforward).values(start_date=day))
            session.commit()
        account, other = create_account(api), create_account(api)
        key = create_key(api, account)
        _admin_grant(api, account, "7.000001")
        _admin_grant(api, account, "3", category="promotional")
        _admin_grant(api, other, "99")
        model = priced_model(api, NOW - timedelta(days=30))
        ingest(api, *[usage_event(key, model, NOW - timedelta(hours=h + 1)) for h in range(3)])
        export_dir = tmp_path / "exports"
        jobs, _ = exporter(api, export_dir, _midnight(day) + timedelta(days=1, hours=1))
        assert jobs.export_day(day).outcome == "exported"
        api.client.app.state.settings = api.settings.model_copy(update={"export_dir": export_dir})  # type: ignore[attr-defined]
        try:
            client = _signed_in(api, account)
            page = client.get("/billing/exports").text
            written = (export_dir / day.isoformat() / "credits.csv").read_text("utf-8")
            lines = written.splitlines()
            mine = [line for line in lines[1:] if line.split(",")[1] == account]
            assert len(mine) == 2 and any(line.split(",")[1] == other for line in lines[1:])
            expected = [
                [row[0], row[2], *(str(Decimal(v).scaleb(-8)) for v in row[3:])]
                for row in csv.reader(io.StringIO("\n".join(mine)))
            ]
            shown = [
                [cells[0], cells[1], *(str(_dollars(c)) for c in cells[2:])]
                for cells in _rows(page, "rollforward-table")
            ]
            assert [[r[0], r[1]] for r in shown] == [[r[0], r[1]] for r in expected]
            for got, want in zip(shown, expected, strict=True):
                assert [Decimal(v) for v in got[2:]] == [Decimal(v) for v in want[2:]]
            assert other not in page
            download = client.get(f"/billing/exports/{day.isoformat()}/credits.csv")
            assert download.status_code == 200
            assert download.text == "\n".join([lines[0], *mine]) + "\n"
            assert hashlib.sha256(download.content).hexdigest() in page
            assert client.get("/billing/exports/2026-11-28/credits.csv").status_code == 404
            # The other account sees only its own row.
            theirs = _signed_in(api, other).get(f"/billing/exports/{day.isoformat()}/credits.csv")
            assert account not in theirs.text and other in theirs.text
        finally:
            api.client.app.state.settings = api.settings  # type: ignore[attr-defined]


class TestSessionCleanUp:
    def test_the_scheduler_deletes_finished_sessions_and_links_only(self, fresh_api: Api) -> None:
        api = fresh_api
        account = create_account(api)
        signed_out, kept = _signed_in(api, account), _signed_in(api, account)
        csrf = _form(signed_out.get("/billing").text)
        assert signed_out.post("/billing/sign-out", data={"csrf_token": csrf}).status_code == 200
        unused = _new_link(api, account)  # expires at NOW + 15 minutes
        api.clock.set(NOW + timedelta(minutes=10))
        late = _new_link(api, account)  # expires at NOW + 25 minutes
        expiring = _client(api)  # its session ends at NOW + 12 h 10 min
        assert _sign_in(expiring, _new_link(api, account)).status_code == 303  # type: ignore[attr-defined]

        def counts() -> tuple[int, int]:
            with api.database.reading() as session:
                sessions = session.execute(select(func.count()).select_from(PortalSession))
                links = session.execute(select(func.count()).select_from(PortalSignInToken))
                return int(sessions.scalar_one()), int(links.scalar_one())

        assert counts() == (3, 5)  # 3 links used by signing in, 2 unused
        jobs = Scheduler(api.database, api.settings, api.clock)
        api.clock.set(NOW + timedelta(minutes=20))
        report = jobs.tick()
        # Gone: the signed-out session, the 3 used links and the expired unused one.
        assert report.portal_deleted == (1, 4) and report.ok, report.errors
        assert counts() == (2, 1)
        assert kept.get("/billing").status_code == 200
        assert _client(api).get(late).status_code == 200  # the live link still works
        assert _client(api).get(unused).status_code == 410  # deleted: refused like any unknown
        api.clock.set(NOW + timedelta(hours=12, minutes=5))
        assert jobs.tick().portal_deleted == (1, 1)  # ``kept`` ended at NOW + 12 h; ``late``
        assert kept.get("/billing").status_code == 401
        assert expiring.get("/billing").status_code == 200
        api.clock.set(NOW + timedelta(hours=12, minutes=30))
        assert jobs.tick().portal_deleted == (1, 0)
        assert counts() == (0, 0)
