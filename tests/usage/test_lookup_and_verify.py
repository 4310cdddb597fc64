"""Support's single-event lookup, and ``metering verify`` reconciling balances and aggregates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from metering.cli import main
from metering.kit.ranges import INT64_MAX
from tests.conftest import NOW, Api
from tests.factories import (
    assert_error,
    authorize,
    chat_usage,
    create_account,
    create_key,
    expect,
    grant,
    ingest,
    priced_model,
    usage_event,
)
from tests.usage.helpers import events_of

AT = NOW - timedelta(minutes=10)


class TestEventLookup:
    def test_shows_the_event_its_charge_and_price_version(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=2))
        event = usage_event(
            key,
            model,
            AT,
            chat_usage(4508, 20, cached=4352, reasoning=16),
            outcome="failed",
            authorization_id="auth_x",
        )
        sent = ingest(api, event)["data"][0]["charge"]
        response = api.admin(
            "GET",
            f"/admin/v1/usage/events/{event['request_id']}",
            params={"account_id": key.account_id},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "usage_event"
        assert (body["request_id"], body["account_id"], body["api_key_id"]) == (
            event["request_id"],
            key.account_id,
            key.id,
        )
        assert (body["model"], body["api"], body["outcome"]) == (
            model,
            "chat_completions",
            "failed",
        )
        assert body["occurred_at"] == "2026-11-29T11:50:00Z"
        assert body["authorization_id"] == "auth_x"
        assert body["usage"] == {
            "prompt_tokens": 4508,
            "cached_tokens": 4352,
            "output_tokens": 20,
            "reasoning_tokens": 16,
        }
        assert body["charge"] == sent
        assert body["charge"]["total_microcents"] == 87460
        version = body["price_version"]
        assert version["id"] == sent["price_version_id"]
        assert (version["kind"], version["effective_at"]) == ("list", "2026-11-27T12:00:00Z")
        assert version["input_microcents_per_million"] == 22_000_000

    def test_not_found_and_account_scoped(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=2))
        event = usage_event(key, model, AT)
        ingest(api, event)
        other = create_account(api)
        path = f"/admin/v1/usage/events/{event['request_id']}"
        assert_error(
            api.admin("GET", path, params={"account_id": other}),
            404,
            "not_found",
            param="request_id",
        )
        assert_error(
            api.admin("GET", "/admin/v1/usage/events/nope", params={"account_id": key.account_id}),
            404,
            "not_found",
            param="request_id",
        )
        assert_error(api.admin("GET", path), 400, "missing_parameter", param="account_id")
        assert_error(
            api.gateway("GET", path, params={"account_id": key.account_id}), 401, "invalid_api_key"
        )


def run_verify(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setenv("METERING_DATABASE_URL", api.url)
    code = main(["verify"])
    return code, capsys.readouterr().out


class TestVerify:
    def test_agrees_then_names_each_tampering(
        self, fresh_api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        api = fresh_api
        account = create_account(api)
        key = create_key(api, account)
        unbilled = create_key(api, create_account(api, billing="unbilled"))
        model = priced_model(api, NOW - timedelta(days=2))
        ingest(
            api,
            *[
                usage_event(key, model, AT - timedelta(hours=i), chat_usage(100 * i, i))
                for i in range(12)
            ],
            usage_event(unbilled, model, AT),
        )
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 0, out
        assert "verified 2 accounts" in out

        with api.database.engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE accounts SET balance_microcents = balance_microcents - 1 WHERE id = :id"
                ),
                {"id": account},
            )
            connection.execute(
                text(
                    "UPDATE usage_rollups SET output_tokens = output_tokens + 7 "
                    "WHERE account_id = :id AND bucket_width = '1d' AND grouping = 'model'"
                ),
                {"id": account},
            )
            connection.execute(
                text(
                    "DELETE FROM usage_rollups WHERE account_id = :id AND bucket_width = '1h' "
                    "AND grouping = 'key'"
                ),
                {"id": unbilled.account_id},
            )
            connection.execute(
                text(
                    "INSERT INTO credit_allocation_days (account_id, allocation_date, kind, "
                    "grant_id, amount_microcents) VALUES (:id, '2026-11-01', 'deficit', '', 5)"
                ),
                {"id": unbilled.account_id},
            )
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 1
        lines = [line for line in out.splitlines() if line.startswith("MISMATCH")]
        assert any(f"account {account}: balance" in line for line in lines), out
        assert any(
            f"rollup {account} 1d model 2026-11-29T00:00:00Z" in line and "output_tokens" in line
            for line in lines
        ), out
        assert any(
            f"rollup {unbilled.account_id} 1h key" in line and "missing" in line for line in lines
        ), out
        assert any(
            f"account {unbilled.account_id}: deficit 0 microcents" in line and "payoffs 5" in line
            for line in lines
        ), out
        assert len(lines) == 4, out

    def test_an_extra_rollup_row_and_a_lost_debit(
        self, fresh_api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        api = fresh_api
        account = create_account(api)
        key = create_key(api, account)
        model = priced_model(api, NOW - timedelta(days=2))
        ingest(api, usage_event(key, model, AT, chat_usage(1000, 100)))
        with api.database.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO usage_rollups SELECT account_id, bucket_width, grouping, "
                    "bucket_start, 'key_ghost', model_id, requests, input_tokens, "
                    "cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, "
                    "last_event_id FROM usage_rollups "
                    "WHERE account_id = :id AND grouping = 'key_model' AND bucket_width = '1h'"
                ),
                {"id": account},
            )
            # A debit lost together with its balance movement: the ledger still sums up.
            connection.execute(
                text("DELETE FROM ledger_entries WHERE account_id = :id"), {"id": account}
            )
            connection.execute(
                text("UPDATE accounts SET balance_microcents = 0 WHERE id = :id"), {"id": account}
            )
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 1
        assert "key=key_ghost" in out and "no event counts in it" in out
        assert f"account {account}: charge entries total 0 microcents, recorded events 55900" in out

    def test_an_event_whose_key_or_model_does_not_exist(
        self, fresh_api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # usage_events has no foreign keys (metering.models.base.Names): verify checks them.
        api = fresh_api
        key = create_key(api, create_account(api))
        other = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=2))
        ingest(api, usage_event(key, model, AT), usage_event(key, model, AT))
        first, second = (e.id for e in events_of(api, key.account_id))
        with api.database.engine.begin() as connection:
            connection.execute(
                text("UPDATE usage_events SET model_id = 'Gone-1' WHERE id = :id"), {"id": first}
            )
            connection.execute(
                text("UPDATE usage_events SET api_key_id = :key WHERE id = :id"),
                {"key": other.id, "id": second},
            )
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 1
        assert f"usage_events {first} ({key.account_id}): no such model" in out
        assert f"usage_events {second} ({key.account_id}): no such API key of the account" in out

    def test_a_hold_entry_day_or_rollup_naming_no_row(
        self, fresh_api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The tables every gateway request writes have no foreign keys (decision 0024):
        verify names each row whose account, key (of its account) or model is missing, and
        nothing while every one exists."""
        api = fresh_api
        account = create_account(api)
        key, other = create_key(api, account), create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=2))
        grant(api, account, 100)
        hold = expect(authorize(api, key, model), 200)["id"]
        ingest(api, usage_event(key, model, AT))
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 0, out
        # Rows of an account that does not exist: copies of the account's own (on Citus a row's
        # account places it, and cannot be changed).
        copies = {
            "ledger_entries": (
                "kind, amount_microcents, created_at",
                "id = (SELECT max(id) FROM ledger_entries WHERE account_id = :a)",
            ),
            "credit_allocation_days": (
                "allocation_date, kind, grant_id, amount_microcents",
                "account_id = :a",
            ),
            "usage_rollups": (
                "bucket_width, grouping, bucket_start, api_key_id, model_id, requests, "
                "input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, "
                "cost_microcents, last_event_id",
                "account_id = :a AND grouping = 'model' AND bucket_width = '1d'",
            ),
        }
        with api.database.engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE authorizations SET api_key_id = :other, model_id = 'Gone-1' "
                    "WHERE id = :hold"
                ),
                {"other": other.id, "hold": hold},
            )
            for name, (columns, which) in copies.items():
                connection.execute(
                    text(
                        f"INSERT INTO {name} (account_id, {columns}) "
                        f"SELECT 'acct_gone', {columns} FROM {name} WHERE {which}"
                    ),
                    {"a": account},
                )
            entry = connection.execute(
                text("SELECT id FROM ledger_entries WHERE account_id = 'acct_gone'")
            ).scalar_one()
            day = connection.execute(
                text(
                    "SELECT allocation_date, kind, grant_id FROM credit_allocation_days "
                    "WHERE account_id = 'acct_gone'"
                )
            ).one()
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 1
        assert f"authorizations {hold} ({account}): no such API key of the account, model" in out
        assert f"ledger_entries {entry} (acct_gone): no such account" in out
        assert (
            f"credit_allocation_days acct_gone/{day.allocation_date}/{day.kind}/{day.grant_id} "
            "(acct_gone): no such account"
        ) in out
        assert "usage_rollups acct_gone/1d/model/" in out

    def test_sums_beyond_the_64_bit_range_are_exact(
        self, fresh_api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A ledger whose running total leaves the 64-bit range and comes back agrees with its
        balance; one whose total stays beyond it is named with its exact sum (SQLite's own
        ``sum()`` refuses both: ``integer overflow``)."""
        api = fresh_api
        back, beyond = create_account(api), create_account(api)
        entries = {back: (INT64_MAX, INT64_MAX, -INT64_MAX), beyond: (INT64_MAX, INT64_MAX)}
        with api.database.engine.begin() as connection:
            for account, amounts in entries.items():
                for amount in amounts:
                    connection.execute(
                        text(
                            "INSERT INTO ledger_entries (account_id, kind, amount_microcents, "
                            "created_at) VALUES (:id, 'adjustment', :amount, '2026-11-01')"
                        ),
                        {"id": account, "amount": amount},
                    )
            connection.execute(
                text("UPDATE accounts SET balance_microcents = :b WHERE id = :id"),
                {"b": INT64_MAX, "id": back},
            )
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 1
        assert f"account {back}: balance" not in out, out
        assert f"account {beyond}: balance 0 microcents, ledger sum {2 * INT64_MAX}" in out, out

    def test_held_counters_beyond_the_64_bit_range_are_named_exactly(
        self, fresh_api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Counted holds whose estimates add up beyond the 64-bit range (a tampered table):
        verify names the account's held counter against their exact sum (SQLite's own
        ``sum()`` refused it: ``integer overflow``, and verify failed instead of answering)."""
        api = fresh_api
        account = create_account(api)
        key = create_key(api, account)
        model = priced_model(api, NOW - timedelta(days=2))
        grant(api, account, 100)
        for _ in range(2):
            expect(authorize(api, key, model), 200)
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 0, out
        with api.database.engine.begin() as connection:
            held = connection.execute(
                text("SELECT held_microcents FROM accounts WHERE id = :a"), {"a": account}
            ).scalar_one()
            connection.execute(
                text("UPDATE authorizations SET estimate_microcents = :e WHERE account_id = :a"),
                {"e": INT64_MAX, "a": account},
            )
        code, out = run_verify(api, monkeypatch, capsys)
        assert code == 1
        expected = f"account {account}: held counter {held} microcents, counted holds"
        assert f"{expected} {2 * INT64_MAX}" in out, out
