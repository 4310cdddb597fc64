"""Events that cannot be billed now are quarantined with their raw event, never dropped; events
that cannot even be keyed are rejected and nothing is stored; reprocess records the ones that
became billable exactly once."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from metering.cli import main
from tests.conftest import NOW, Api
from tests.factories import (
    add_price,
    assert_error,
    chat_usage,
    create_account,
    create_key,
    ingest,
    priced_model,
    put_model,
    unique,
    usage_event,
)
from tests.usage.helpers import (
    balance,
    events_of,
    quarantine_of,
    quarantine_rows,
    statuses,
)

AT = NOW - timedelta(minutes=10)


def one(api: Api, event: Any) -> dict[str, Any]:
    body = ingest(api, event)
    (result,) = body["data"]
    return dict(result)


class TestQuarantineReasons:
    def test_unknown_api_key(self, api: Api) -> None:
        model = priced_model(api, NOW - timedelta(days=1))
        event = {
            **usage_event(create_key(api, create_account(api)), model, AT),
            "api_key_id": "key_nope",
        }
        result = one(api, event)
        assert (result["status"], result["error"]["code"]) == ("quarantined", "unknown_api_key")
        (row,) = quarantine_rows(api, event["request_id"])
        assert row.account_id is None and row.api_key_id == "key_nope"
        assert json.loads(row.raw_event) == event

    @pytest.mark.parametrize(
        ("change", "param"),
        [
            ({"usage": chat_usage(-1, 5)}, "usage.prompt_tokens"),
            ({"usage": {"prompt_tokens": 5.5, "completion_tokens": 1}}, "usage.prompt_tokens"),
            ({"usage": {"prompt_tokens": "5", "completion_tokens": 1}}, "usage.prompt_tokens"),
            ({"usage": chat_usage(10, 5, cached=11)}, "usage.prompt_tokens_details.cached_tokens"),
            (
                {"usage": chat_usage(10, 5, reasoning=6)},
                "usage.completion_tokens_details.reasoning_tokens",
            ),
            ({"usage": None}, "usage"),
            ({"api": "completions"}, "api"),
            ({"outcome": "cancelled"}, "outcome"),
        ],
    )
    def test_invalid_usage(self, api: Api, change: dict[str, Any], param: str) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        event = {**usage_event(key, model, AT), **change}
        result = one(api, event)
        assert result["status"] == "quarantined"
        assert (result["error"]["code"], result["error"]["param"]) == ("invalid_usage", param)
        assert [e["code"] for e in quarantine_of(api, key.account_id)] == ["invalid_usage"]
        assert events_of(api, key.account_id) == []

    def test_model_not_found(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        result = one(api, usage_event(key, "no-such-model", AT))
        assert result["error"]["code"] == "model_not_found"
        (entry,) = quarantine_of(api, key.account_id)
        assert (entry["model"], entry["code"]) == ("no-such-model", "model_not_found")

    def test_price_not_found_before_the_first_version(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, AT + timedelta(seconds=1))
        assert one(api, usage_event(key, model, AT))["error"]["code"] == "price_not_found"
        assert one(api, usage_event(key, model, AT + timedelta(seconds=1)))["status"] == "recorded"

    @pytest.mark.parametrize(
        "occurred_at",
        ["2026-11-29T12:05:01Z", "yesterday", "2026-11-29T12:00:00", None, 1764417600],
    )
    def test_invalid_timestamp(self, api: Api, occurred_at: Any) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        result = one(api, {**usage_event(key, model, AT), "occurred_at": occurred_at})
        assert (result["error"]["code"], result["error"]["param"]) == (
            "invalid_timestamp",
            "occurred_at",
        )

    def test_up_to_five_minutes_ahead_is_accepted(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        assert one(api, usage_event(key, model, NOW + timedelta(minutes=5)))["status"] == "recorded"
        ahead = usage_event(key, model, NOW + timedelta(minutes=5), request_id="ahead")
        ahead["occurred_at"] = "2026-11-29T13:05:00+01:00"  # the same instant, another offset
        assert one(api, ahead)["status"] == "recorded"

    def test_the_same_raw_event_is_kept_once_with_its_attempts(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        event = usage_event(key, "no-such-model", AT)
        ingest(api, event, event)
        ingest(api, event)
        (entry,) = quarantine_of(api, key.account_id)
        assert entry["attempts"] == 3
        assert entry["event"] == event


class TestRejected:
    @pytest.mark.parametrize(
        "event",
        [
            "a string",
            17,
            None,
            [],
            {"model": "x"},
            {"request_id": ""},
            {"request_id": "has space"},
            {"request_id": "x" * 65},
            {"request_id": 12345},
            {"request_id": "ünïcode"},
        ],
    )
    def test_unkeyable_events_are_rejected_and_nothing_is_stored(
        self, api: Api, event: Any
    ) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        body = ingest(api, event, usage_event(key, model, AT))
        assert statuses(body) == ["rejected", "recorded"]
        assert body["data"][0]["error"]["code"] in ("invalid_parameter", "missing_parameter")
        assert (body["rejected"], body["recorded"]) == (1, 1)
        if isinstance(event, dict) and isinstance(event.get("request_id"), str):
            assert quarantine_rows(api, event["request_id"]) == []

    def test_longest_and_every_allowed_character(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        for request_id in ("A" * 64, "az.AZ_09:x-y"):
            assert (
                one(api, usage_event(key, model, AT, request_id=request_id))["status"] == "recorded"
            )


class TestQuarantineList:
    def test_filters_and_cursor(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        ingest(
            api,
            *[usage_event(key, "missing-model", AT) for _ in range(3)],
            usage_event(key, model, NOW + timedelta(hours=1)),
        )
        everything = quarantine_of(api, key.account_id)
        # Within a batch, entries are stored in the order of their raw events' hashes.
        assert (
            sorted(e["code"] for e in everything) == ["invalid_timestamp"] + ["model_not_found"] * 3
        )
        assert [
            e["code"] for e in quarantine_of(api, key.account_id, code="invalid_timestamp")
        ] == ["invalid_timestamp"]
        first = api.admin(
            "GET", "/admin/v1/quarantine", params={"account_id": key.account_id, "limit": 2}
        ).json()
        assert first["has_more"] is True and len(first["data"]) == 2
        rest = api.admin(
            "GET",
            "/admin/v1/quarantine",
            params={"account_id": key.account_id, "limit": 2, "after": first["next_cursor"]},
        ).json()
        assert [e["id"] for e in first["data"] + rest["data"]] == [e["id"] for e in everything]
        assert rest["has_more"] is False and rest["next_cursor"] is None

    def test_newest_first(self, api: Api) -> None:
        """Newest first, as every admin list, the cursor going on to older ones."""
        key = create_key(api, create_account(api))
        for batch in range(3):
            ingest(api, *[usage_event(key, f"missing-{batch}", AT) for _ in range(2)])
        everything = quarantine_of(api, key.account_id)
        ids = [e["id"] for e in everything]
        assert ids == sorted(ids, reverse=True) and len(ids) == 6
        assert [e["model"] for e in everything][::2] == ["missing-2", "missing-1", "missing-0"]
        first = api.admin(
            "GET", "/admin/v1/quarantine", params={"account_id": key.account_id, "limit": 4}
        ).json()
        rest = api.admin(
            "GET",
            "/admin/v1/quarantine",
            params={"account_id": key.account_id, "limit": 4, "after": first["next_cursor"]},
        ).json()
        assert [e["id"] for e in first["data"] + rest["data"]] == ids

    @pytest.mark.parametrize(
        "after",
        [
            "garbage",
            "WzBd",  # [0]
            "Wy0xXQ",  # [-1]
            "WyJ4Il0",  # ["x"]
            "WzEsMl0",  # [1, 2]
            "WzEwMDAwMDAwMDAwMDAwMDAwMDAwMDBd",  # beyond 64 bits
        ],
    )
    def test_a_foreign_cursor_is_400(self, api: Api, after: str) -> None:
        """Not a page of every entry: a cursor this list never returned is refused."""
        response = api.admin("GET", "/admin/v1/quarantine", params={"after": after})
        assert_error(response, 400, "invalid_parameter", param="after")

    def test_unknown_code_is_refused(self, api: Api) -> None:
        response = api.admin("GET", "/admin/v1/quarantine", params={"code": "nope"})
        assert_error(response, 400, "unsupported_value", param="code")

    def test_admin_only(self, api: Api) -> None:
        assert_error(api.gateway("GET", "/admin/v1/quarantine"), 401, "invalid_api_key")


class TestReprocess:
    def test_after_the_missing_model_is_added(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = unique("Late")
        event = usage_event(key, model, AT, chat_usage(1000, 100))
        assert one(api, event)["error"]["code"] == "model_not_found"
        (entry,) = quarantine_of(api, key.account_id)

        put_model(api, model)  # known now, but not priced yet
        response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]})
        assert response.status_code == 200, response.text
        assert response.json()["quarantined"] == 1
        (entry,) = quarantine_of(api, key.account_id)
        assert (entry["code"], entry["attempts"]) == ("price_not_found", 2)

        add_price(api, model, AT - timedelta(hours=1))
        body = api.admin(
            "POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]}
        ).json()
        assert (body["recorded"], body["duplicates"], body["quarantined"]) == (1, 0, 0)
        assert body["data"][0]["charge"]["total_microcents"] == 22_000 + 33_900
        assert quarantine_of(api, key.account_id) == []
        assert balance(api, key.account_id) == -55_900

        # Exactly once: again is a no-op, and the gateway's resend is a duplicate.
        again = api.admin(
            "POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]}
        ).json()
        assert again["data"] == []
        assert one(api, event)["status"] == "duplicate"
        assert len(events_of(api, key.account_id)) == 1
        assert balance(api, key.account_id) == -55_900

    def test_after_the_missing_price_is_imported(
        self, api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(hours=1))
        early = usage_event(key, model, NOW - timedelta(hours=2), chat_usage(100, 10))
        assert one(api, early)["error"]["code"] == "price_not_found"
        # Seeding history: the import may add a version in the past where nothing is charged.
        catalog = {
            "models": [
                {
                    "id": model,
                    "display_name": model,
                    "context_length": 131072,
                    "prices": [
                        {
                            "effective_at": "2026-11-01T00:00:00Z",
                            "input_microcents_per_million": 1_000_000,
                            "output_microcents_per_million": 1_000_000,
                            "cache_read_microcents_per_million": 0,
                        },
                        {
                            "effective_at": "2026-11-29T11:00:00Z",
                            "input_microcents_per_million": 22_000_000,
                            "output_microcents_per_million": 339_000_000,
                            "cache_read_microcents_per_million": 17_750_000,
                        },
                    ],
                }
            ]
        }
        path = tmp_path / "catalog.json"
        path.write_text(json.dumps(catalog))
        monkeypatch.setenv("METERING_DATABASE_URL", api.url)
        assert main(["catalog", "import", str(path)]) == 0
        (entry,) = quarantine_of(api, key.account_id)
        body = api.admin(
            "POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]}
        ).json()
        assert body["recorded"] == 1
        assert body["data"][0]["charge"]["total_microcents"] == 100 + 10

    def test_conflicts_stay_and_the_original_stands(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=1))
        original = usage_event(key, model, AT, chat_usage(100, 10))
        ingest(api, original)
        ingest(api, {**original, "usage": chat_usage(100, 11)})
        (entry,) = quarantine_of(api, key.account_id)
        body = api.admin(
            "POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]}
        ).json()
        assert body["quarantined"] == 1
        assert body["data"][0]["error"]["code"] == "idempotency_conflict"
        assert [e.output_tokens for e in events_of(api, key.account_id)] == [10]

    def test_an_entry_recorded_meanwhile_by_a_resend_leaves_as_a_duplicate(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = unique("Soon")
        event = usage_event(key, model, AT)
        ingest(api, event)
        put_model(api, model)
        add_price(api, model, AT - timedelta(days=1))
        assert one(api, event)["status"] == "recorded"  # the gateway replayed its spool
        (entry,) = quarantine_of(api, key.account_id)
        body = api.admin(
            "POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]}
        ).json()
        assert (body["recorded"], body["duplicates"]) == (0, 1)
        assert quarantine_of(api, key.account_id) == []
        assert len(events_of(api, key.account_id)) == 1

    def test_reprocess_everything(self, fresh_api: Api) -> None:
        api = fresh_api
        key = create_key(api, create_account(api))
        model = unique("Later")
        ingest(api, *[usage_event(key, model, AT, chat_usage(i, 1)) for i in range(5)])
        ingest(api, usage_event(key, "never", AT))
        put_model(api, model)
        add_price(api, model, AT - timedelta(days=1))
        body = api.admin("POST", "/admin/v1/quarantine/reprocess").json()
        assert (body["recorded"], body["quarantined"]) == (5, 1)
        assert [e["code"] for e in quarantine_of(api)] == ["model_not_found"]
        assert balance(api, key.account_id) == -sum(i * 22 + 339 for i in range(5))

    def test_ids_must_be_integers(self, api: Api) -> None:
        response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ["1"]})
        assert_error(response, 400, "invalid_parameter", param="ids[0]")
