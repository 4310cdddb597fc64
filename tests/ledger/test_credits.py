"""Credits: grants, adjustments, the ledger and ``GET /v1/credits``, on both backends."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import func, select

from metering.models import Account, LedgerEntry
from tests.conftest import NOW, Api
from tests.factories import (
    assert_error,
    create_account,
    create_key,
    credits_of,
    exact_json,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)

NOW_TEXT = "2026-11-29T12:00:00Z"
INT64_MAX = 2**63 - 1


def post_entry(api: Api, account_id: str, kind: str, **body: Any) -> Any:
    return api.admin("POST", f"/admin/v1/accounts/{account_id}/{kind}", json=body)


def post_raw(api: Api, account_id: str, kind: str, raw: str) -> Any:
    headers = {**api.admin_headers, "Content-Type": "application/json"}
    return api.client.post(f"/admin/v1/accounts/{account_id}/{kind}", content=raw, headers=headers)


def stored(api: Api, account_id: str) -> tuple[int, int, int]:
    """(balance, ledger sum, number of entries) read straight from the database."""
    with api.database.unit_of_work() as session:
        balance = session.execute(
            select(Account.balance_microcents).where(Account.id == account_id)
        ).scalar_one()
        total, count = session.execute(
            select(func.coalesce(func.sum(LedgerEntry.amount_microcents), 0), func.count()).where(
                LedgerEntry.account_id == account_id
            )
        ).one()
    return int(balance), int(total), int(count)


class TestGrants:
    def test_a_grant_adds_credit_as_a_credit_grant_and_a_ledger_entry(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        response = post_entry(
            api, account, "grants", amount_cents=1234.5, idempotency_key="topup-1", note="welcome"
        )
        assert response.status_code == 201, response.text
        body = exact_json(response)
        assert body == {
            "id": body["id"],
            "object": "credit_grant",
            "account_id": account,
            "category": "paid",
            "priority": 50,
            "amount_cents": Decimal("1234.5"),
            "amount_microcents": 1_234_500_000,
            "remaining_cents": Decimal("1234.5"),
            "remaining_microcents": 1_234_500_000,
            "expires_at": None,
            "status": "active",
            "created_at": NOW_TEXT,
            "note": "welcome",
        }
        assert body["id"].startswith("grant_")
        (entry,) = api.admin("GET", f"/admin/v1/accounts/{account}/ledger").json()["data"]
        assert entry == {
            "id": entry["id"],
            "object": "ledger_entry",
            "account_id": account,
            "kind": "grant",
            "amount_cents": 1234.5,
            "amount_microcents": 1_234_500_000,
            "idempotency_key": "topup-1",
            "note": "welcome",
            "reason": None,
            "usage_event_id": None,
            "api_key_id": None,
            "grant_id": body["id"],
            "created_at": NOW_TEXT,
            "effective_at": NOW_TEXT,
        }
        assert credits_of(api, key) == {
            "object": "credit_balance",
            "currency": "usd",
            "balance_cents": Decimal("1234.5"),
            "held_cents": 0,
            "available_cents": Decimal("1234.5"),
            "balance_microcents": 1_234_500_000,
            "held_microcents": 0,
            "available_microcents": 1_234_500_000,
            "grants": [
                {
                    "id": body["id"],
                    "category": "paid",
                    "remaining_cents": Decimal("1234.5"),
                    "remaining_microcents": 1_234_500_000,
                    "expires_at": None,
                }
            ],
            "deficit_cents": 0,
            "deficit_microcents": 0,
        }
        assert stored(api, account) == (1_234_500_000, 1_234_500_000, 1)

    def test_the_smallest_amount_and_six_decimals_are_exact(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        grant(api, account, Decimal("0.000001"))
        grant(api, account, Decimal("123456789.123456"))
        body = credits_of(api, key)
        assert body["balance_microcents"] == 123_456_789_123_457
        assert body["balance_cents"] == Decimal("123456789.123457")
        # Plain notation, never an exponent or a float's rounding.
        text = api.as_key(key.secret, "GET", "/v1/credits").text
        assert '"balance_cents":123456789.123457' in text

    def test_same_key_same_body_returns_the_original_once(self, api: Api) -> None:
        account = create_account(api)
        body = {"amount_cents": 500, "idempotency_key": "k-1", "note": "n"}
        first = post_entry(api, account, "grants", **body)
        assert first.status_code == 201
        for _ in range(3):
            again = post_entry(api, account, "grants", **body)
            assert again.status_code == 200, again.text
            assert again.json() == first.json()
        assert stored(api, account) == (500_000_000, 500_000_000, 1)

    def test_an_equal_amount_written_differently_is_the_same_request(self, api: Api) -> None:
        account = create_account(api)
        assert post_raw(
            api, account, "grants", '{"amount_cents": 5, "idempotency_key": "k"}'
        ).status_code == (201)
        again = post_raw(api, account, "grants", '{"amount_cents": 5.000, "idempotency_key": "k"}')
        assert again.status_code == 200, again.text
        assert stored(api, account)[2] == 1

    @pytest.mark.parametrize(
        "change", [{"amount_cents": 501}, {"note": "other"}, {"note": None}], ids=str
    )
    def test_same_key_different_body_is_a_conflict(self, api: Api, change: dict[str, Any]) -> None:
        account = create_account(api)
        body = {"amount_cents": 500, "idempotency_key": "k-2", "note": "n"}
        assert post_entry(api, account, "grants", **body).status_code == 201
        response = post_entry(api, account, "grants", **{**body, **change})
        assert_error(response, 409, "idempotency_conflict", param="idempotency_key")
        assert stored(api, account) == (500_000_000, 500_000_000, 1)

    def test_keys_are_scoped_to_the_account(self, api: Api) -> None:
        first, second = create_account(api), create_account(api)
        for account in (first, second):
            response = post_entry(api, account, "grants", amount_cents=7, idempotency_key="same")
            assert response.status_code == 201, response.text
        assert stored(api, first)[0] == stored(api, second)[0] == 7_000_000

    def test_grants_and_adjustments_share_one_key_namespace(self, api: Api) -> None:
        account = create_account(api)
        assert post_entry(api, account, "grants", amount_cents=7, idempotency_key="x").status_code
        response = post_entry(
            api, account, "adjustments", amount_cents=7, idempotency_key="x", reason="r"
        )
        assert_error(response, 409, "idempotency_conflict", param="idempotency_key")

    @pytest.mark.parametrize(
        ("raw", "param"),
        [
            ('{"amount_cents": 0, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": -1, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": 0.0000001, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": 1.1234567, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": NaN, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": Infinity, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": -Infinity, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": 9000000000000.000001, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": 1e400, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": 100000000000000000000000000000, "idempotency_key": "k"}', None),
            ('{"amount_cents": "5", "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": true, "idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": null, "idempotency_key": "k"}', "amount_cents"),
            ('{"idempotency_key": "k"}', "amount_cents"),
            ('{"amount_cents": 5}', "idempotency_key"),
            ('{"amount_cents": 5, "idempotency_key": ""}', "idempotency_key"),
            ('{"amount_cents": 5, "idempotency_key": "k", "extra": 1}', "extra"),
        ],
    )
    def test_invalid_grants_are_400_naming_the_field(
        self, api: Api, raw: str, param: str | None
    ) -> None:
        account = create_account(api)
        response = post_raw(api, account, "grants", raw)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == (param or "amount_cents"), error
        assert error["type"] == "invalid_request_error"
        assert stored(api, account) == (0, 0, 0)

    def test_the_largest_amount_is_accepted(self, api: Api) -> None:
        account = create_account(api)
        grant(api, account, 9 * 10**12)
        assert stored(api, account)[0] == 9 * 10**18

    def test_a_balance_beyond_64_bits_is_refused_not_overflowed(self, api: Api) -> None:
        account = create_account(api)
        grant(api, account, 9 * 10**12)
        response = post_entry(
            api, account, "grants", amount_cents=3 * 10**11, idempotency_key=unique("k")
        )
        assert_error(response, 400, "invalid_parameter", param="amount_cents")
        assert stored(api, account) == (9 * 10**18, 9 * 10**18, 1)
        # Just up to the limit still works, and the negative side is guarded too.
        room = Decimal(INT64_MAX - 9 * 10**18) / 10**6
        grant(api, account, room)
        assert stored(api, account)[0] == INT64_MAX

    def test_unknown_account_is_404(self, api: Api) -> None:
        response = post_entry(api, "acct_nope", "grants", amount_cents=1, idempotency_key="k")
        assert_error(response, 404, "not_found", param="account_id")

    def test_admin_token_is_required(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        for headers in ({}, api.gateway_headers, {"Authorization": f"Bearer {key.secret}"}):
            response = api.client.post(
                f"/admin/v1/accounts/{account}/grants",
                json={"amount_cents": 1, "idempotency_key": "k"},
                headers=headers,
            )
            assert response.status_code == 401, response.text
            assert response.json()["error"]["param"] is None
        assert stored(api, account) == (0, 0, 0)


class TestAdjustments:
    def test_signed_corrections_move_the_balance(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        grant(api, account, 10)
        response = post_entry(
            api, account, "adjustments", amount_cents=-12.5, idempotency_key="c1", reason="oops"
        )
        assert response.status_code == 201, response.text
        entry = exact_json(response)
        assert (entry["kind"], entry["amount_cents"], entry["reason"], entry["note"]) == (
            "adjustment",
            Decimal("-12.5"),
            "oops",
            None,
        )
        body = credits_of(api, key)
        assert (body["balance_cents"], body["available_cents"]) == (
            Decimal("-2.5"),
            Decimal("-2.5"),
        )
        response = post_entry(
            api, account, "adjustments", amount_cents=3, idempotency_key="c2", reason="goodwill"
        )
        assert response.status_code == 201
        assert credits_of(api, key)["balance_microcents"] == 500_000
        assert stored(api, account) == (500_000, 500_000, 3)

    def test_idempotent_like_grants(self, api: Api) -> None:
        account = create_account(api)
        body = {"amount_cents": -1, "idempotency_key": "c", "reason": "r"}
        first = post_entry(api, account, "adjustments", **body)
        again = post_entry(api, account, "adjustments", **body)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json() == again.json()
        other = post_entry(api, account, "adjustments", **{**body, "reason": "s"})
        assert_error(other, 409, "idempotency_conflict", param="idempotency_key")
        assert stored(api, account) == (-1_000_000, -1_000_000, 1)

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"amount_cents": 0, "idempotency_key": "k", "reason": "r"}, "amount_cents"),
            ({"amount_cents": 1, "idempotency_key": "k"}, "reason"),
            ({"amount_cents": 1, "idempotency_key": "k", "reason": ""}, "reason"),
            (
                {"amount_cents": -9000000000001, "idempotency_key": "k", "reason": "r"},
                "amount_cents",
            ),
        ],
    )
    def test_invalid(self, api: Api, body: dict[str, Any], param: str) -> None:
        account = create_account(api)
        response = post_entry(api, account, "adjustments", **body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param

    def test_the_negative_64_bit_limit_is_guarded(self, api: Api) -> None:
        account = create_account(api)
        for index in range(1024):
            response = post_entry(
                api,
                account,
                "adjustments",
                amount_cents=-9 * 10**12,
                idempotency_key=f"n{index}",
                reason="r",
            )
            if response.status_code != 201:
                break
        assert_error(response, 400, "invalid_parameter", param="amount_cents")
        assert index == 1
        assert stored(api, account)[0] == -9 * 10**18


class TestLedgerList:
    def test_newest_first_with_cursor_pagination(self, api: Api) -> None:
        account = create_account(api)
        other = create_account(api)
        grant(api, other, 1)
        amounts = [1, 2, 3, 4, 5]
        for amount in amounts:
            grant(api, account, amount)
        seen: list[int] = []
        params: dict[str, Any] = {"limit": 2}
        pages = 0
        while True:
            response = api.admin("GET", f"/admin/v1/accounts/{account}/ledger", params=params)
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["object"] == "list"
            pages += 1
            seen += [entry["amount_microcents"] // 1_000_000 for entry in body["data"]]
            assert all(entry["account_id"] == account for entry in body["data"])
            if not body["has_more"]:
                assert body["next_cursor"] is None
                break
            params = {"limit": 2, "after": body["next_cursor"]}
        assert seen == amounts[::-1]
        assert pages == 3

    def test_charges_and_grants_in_the_order_they_were_recorded(self, api: Api) -> None:
        """Charges written by the gateway's calls (on Citus, by the worker holding the account,
        which numbers its rows in a range of its own) and grants and adjustments written by
        operators (the coordinator) list newest first in the order they happened, page by page."""
        model = priced_model(api, NOW - timedelta(days=1))
        account = create_account(api)
        key = create_key(api, account)
        done: list[str] = []
        for step in range(6):
            api.clock.advance(seconds=1)
            if step % 3 == 0:
                grant(api, account, 10 + step)
                done.append("grant")
            elif step % 3 == 1:
                ingest(api, usage_event(key, model, api.clock.now()))
                done.append("charge")
            else:
                response = post_entry(
                    api,
                    account,
                    "adjustments",
                    amount_cents=1,
                    idempotency_key=f"a{step}",
                    reason="r",
                )
                assert response.status_code == 201, response.text
                done.append("adjustment")
        seen: list[tuple[str, str]] = []
        params: dict[str, Any] = {"limit": 4}
        while True:
            body = api.admin("GET", f"/admin/v1/accounts/{account}/ledger", params=params).json()
            seen += [(entry["kind"], entry["created_at"]) for entry in body["data"]]
            if not body["has_more"]:
                break
            params = {"limit": 4, "after": body["next_cursor"]}
        assert [kind for kind, _ in seen] == done[::-1]
        assert [at for _, at in seen] == sorted((at for _, at in seen), reverse=True)

    @pytest.mark.parametrize(
        "after",
        [
            "garbage",
            "WzEsMl0",
            "WyJ4Il0",
            "WzEwMDAwMDAwMDAwMDAwMDAwMDAwMDBd",
            "WyIyMDI2LTExLTI5VDEyOjAwOjAwWiIsIngiXQ",  # ["2026-11-29T12:00:00Z", "x"]
            "WyIyMDI2LTExLTI5VDEyOjAwOjAwWiIsMF0",  # ["2026-11-29T12:00:00Z", 0]
            "WyIyMDI2LTExLTI5VDEyOjAwOjAwWiIsdHJ1ZV0",  # ["2026-11-29T12:00:00Z", true]
        ],
    )
    def test_a_foreign_cursor_is_400(self, api: Api, after: str) -> None:
        account = create_account(api)
        response = api.admin("GET", f"/admin/v1/accounts/{account}/ledger", params={"after": after})
        assert_error(response, 400, "invalid_parameter", param="after")

    def test_unknown_account_is_404(self, api: Api) -> None:
        response = api.admin("GET", "/admin/v1/accounts/acct_nope/ledger")
        assert_error(response, 404, "not_found", param="account_id")

    @pytest.mark.parametrize("limit", [0, 1001, -1])
    def test_limit_bounds(self, api: Api, limit: int) -> None:
        account = create_account(api)
        response = api.admin("GET", f"/admin/v1/accounts/{account}/ledger", params={"limit": limit})
        assert_error(response, 400, "invalid_parameter", param="limit")


class TestCreditsEndpoint:
    def test_needs_an_account_key(self, api: Api) -> None:
        assert_error(api.client.get("/v1/credits"), 401, "missing_api_key")
        response = api.client.get("/v1/credits", headers={"Authorization": "Bearer mk_nope"})
        assert_error(response, 401, "invalid_api_key")
        response = api.client.get("/v1/credits", headers=api.admin_headers)
        assert_error(response, 401, "invalid_api_key")

    def test_x_api_key_header_and_only_its_own_account(self, api: Api) -> None:
        mine, theirs = create_account(api), create_account(api)
        key = create_key(api, mine)
        grant(api, mine, 3)
        grant(api, theirs, 5)
        response = api.client.get("/v1/credits", headers={"x-api-key": key.secret})
        assert response.status_code == 200
        assert response.json()["balance_microcents"] == 3_000_000

    def test_a_revoked_key_is_refused(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        assert api.admin("DELETE", f"/admin/v1/api-keys/{key.id}").status_code == 200
        response = api.as_key(key.secret, "GET", "/v1/credits")
        assert_error(response, 401, "invalid_api_key")

    def test_admin_view_matches(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        grant(api, account, 42)
        response = api.admin("GET", f"/admin/v1/accounts/{account}/credits")
        assert response.status_code == 200
        assert exact_json(response) == credits_of(api, key)
        assert_error(
            api.admin("GET", "/admin/v1/accounts/acct_nope/credits"),
            404,
            "not_found",
            param="account_id",
        )


def test_clock_is_the_injected_one(api: Api) -> None:
    """Entries are stamped with the service's clock, not the wall clock."""
    account = create_account(api)
    api.clock.set(NOW.replace(year=2030))
    entry = grant(api, account, 1)
    assert entry["created_at"] == "2030-11-29T12:00:00Z"
