"""POST /v1/usage/events: each API's usage shape priced at request time, the batch response,
batch limits and credentials. Expected charges are worked out here by hand from the GLM-5.3
card (22 µ¢ per input token, 339 µ¢ per output token, 17.75 µ¢ per cache-read token)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import NOW, Api
from tests.factories import (
    Key,
    assert_error,
    chat_usage,
    create_account,
    create_key,
    ingest,
    priced_model,
    usage_event,
)
from tests.usage.helpers import balance, charge_entries, events_of, rollups_of, statuses

AT = NOW - timedelta(minutes=10)
CHARGE_FIELDS = {
    "uncached_input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "input_microcents",
    "cache_read_microcents",
    "output_microcents",
    "total_microcents",
    "price_version_id",
}


@pytest.fixture
def glm(api: Api) -> tuple[Key, str, str]:
    """A prepaid account's key and a model at GLM-5.3's rates, with its price version id."""
    key = create_key(api, create_account(api))
    model = priced_model(api, NOW - timedelta(days=30))
    version = api.admin("GET", f"/admin/v1/models/{model}").json()["prices"][0]["id"]
    return key, model, version


def charge_of(
    api: Api, key: Key, model: str, api_name: str, usage: dict[str, Any]
) -> dict[str, Any]:
    body = ingest(api, usage_event(key, model, AT, usage, api=api_name))
    assert statuses(body) == ["recorded"], body
    charge = body["data"][0]["charge"]
    assert set(charge) == CHARGE_FIELDS
    return dict(charge)


class TestUsageShapes:
    def test_chat_completions_with_cached_and_reasoning_tokens(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, version = glm
        usage = {
            "prompt_tokens": 4508,
            "completion_tokens": 20,
            "total_tokens": 4528,
            "prompt_tokens_details": {"cached_tokens": 4352},
            "completion_tokens_details": {"reasoning_tokens": 16},
        }
        assert charge_of(api, key, model, "chat_completions", usage) == {
            "uncached_input_tokens": 156,
            "cache_read_tokens": 4352,
            "output_tokens": 20,  # reasoning included, billed at the output rate
            "reasoning_tokens": 16,
            "input_microcents": 3432,  # 156 × 22
            "cache_read_microcents": 77248,  # 4352 × 17.75
            "output_microcents": 6780,  # 20 × 339
            "total_microcents": 87460,
            "price_version_id": version,
        }

    def test_messages_input_tokens_include_cache_reads(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        usage = {
            "input_tokens": 338,
            "output_tokens": 29,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 256,
        }
        charge = charge_of(api, key, model, "messages", usage)
        assert charge["uncached_input_tokens"] == 82  # 338 − 256: not 338
        assert charge["cache_read_tokens"] == 256
        assert (charge["input_microcents"], charge["cache_read_microcents"]) == (1804, 4544)
        assert charge["output_microcents"] == 9831  # 29 × 339
        assert charge["total_microcents"] == 1804 + 4544 + 9831

    def test_responses_plain_and_with_details(self, api: Api, glm: tuple[Key, str, str]) -> None:
        key, model, _ = glm
        plain = charge_of(
            api,
            key,
            model,
            "responses",
            {"input_tokens": 336, "output_tokens": 17, "total_tokens": 353},
        )
        assert plain["total_microcents"] == 336 * 22 + 17 * 339  # 7392 + 5763
        detailed = charge_of(
            api,
            key,
            model,
            "responses",
            {
                "input_tokens": 2000,
                "input_tokens_details": {"cached_tokens": 1000},
                "output_tokens": 300,
                "output_tokens_details": {"reasoning_tokens": 200},
                "total_tokens": 2300,
            },
        )
        assert detailed["uncached_input_tokens"] == 1000
        assert detailed["reasoning_tokens"] == 200
        assert detailed["total_microcents"] == 22_000 + 17_750 + 101_700

    @pytest.mark.parametrize(
        ("api_name", "usage", "total"),
        [
            # Chat Completions: the last chunk, with empty choices, carries usage.
            (
                "chat_completions",
                {
                    "prompt_tokens": 11,
                    "completion_tokens": 10,
                    "total_tokens": 21,
                    "prompt_tokens_details": {"cached_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
                11 * 22 + 10 * 339,
            ),
            # Responses: usage of the response.completed event.
            (
                "responses",
                {"input_tokens": 22, "output_tokens": 36, "total_tokens": 58},
                484 + 12204,
            ),
            # Messages: final usage on message_delta.
            (
                "messages",
                {
                    "input_tokens": 278,
                    "output_tokens": 54,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
                278 * 22 + 54 * 339,
            ),
        ],
    )
    def test_a_streams_final_usage(
        self, api: Api, glm: tuple[Key, str, str], api_name: str, usage: dict[str, Any], total: int
    ) -> None:
        key, model, _ = glm
        assert charge_of(api, key, model, api_name, usage)["total_microcents"] == total

    def test_missing_or_null_details_mean_zero_and_extra_fields_are_ignored(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        usage = {
            "prompt_tokens": 100,
            "completion_tokens": 10,
            "prompt_tokens_details": None,
            "completion_tokens_details": {"reasoning_tokens": None, "audio_tokens": 3},
            "some_future_field": {"x": 1},
        }
        charge = charge_of(api, key, model, "chat_completions", usage)
        assert charge["cache_read_tokens"] == charge["reasoning_tokens"] == 0
        assert charge["total_microcents"] == 2200 + 3390

    def test_each_component_is_rounded_half_up_per_request(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        charge = charge_of(api, key, model, "chat_completions", chat_usage(3, 0, cached=2))
        # 2 × 17.75 = 35.5 → 36 (half up); 1 uncached × 22 = 22.
        assert (charge["input_microcents"], charge["cache_read_microcents"]) == (22, 36)
        one = charge_of(api, key, model, "chat_completions", chat_usage(1, 0, cached=1))
        assert one["cache_read_microcents"] == 18  # 17.75 → 18
        # 6 × 17.75 = 106.5 → 107: up, where halves to even would give 106.
        six = charge_of(api, key, model, "chat_completions", chat_usage(6, 0, cached=6))
        assert six["cache_read_microcents"] == 107

    def test_a_failed_stream_is_charged_for_the_tokens_it_reports(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        body = ingest(api, usage_event(key, model, AT, chat_usage(500, 40), outcome="failed"))
        assert statuses(body) == ["recorded"]
        assert body["data"][0]["charge"]["total_microcents"] == 500 * 22 + 40 * 339
        (stored,) = events_of(api, key.account_id)
        assert stored.outcome == "failed"

    def test_zero_token_request_is_recorded_at_zero(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        charge = charge_of(
            api, key, model, "chat_completions", {"prompt_tokens": 0, "completion_tokens": 0}
        )
        assert charge["total_microcents"] == 0


class TestCharging:
    def test_prepaid_balance_and_ledger_are_debited_in_full(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        body = ingest(
            api,
            usage_event(key, model, AT, chat_usage(4508, 20, cached=4352, reasoning=16)),
            usage_event(key, model, AT, chat_usage(1000, 100)),
        )
        assert body["recorded"] == 2
        # No credit was granted: usage that happened is billed anyway, the balance goes negative.
        assert balance(api, key.account_id) == -(87460 + 22_000 + 33_900)
        assert sorted(charge_entries(api, key.account_id)) == [-87460, -(22_000 + 33_900)]

    def test_unbilled_account_records_usage_at_zero_charge(self, api: Api) -> None:
        key = create_key(api, create_account(api, billing="unbilled"))
        model = priced_model(api, NOW - timedelta(days=1))
        body = ingest(
            api, usage_event(key, model, AT, chat_usage(4508, 20, cached=4352, reasoning=16))
        )
        assert statuses(body) == ["recorded"]
        charge = body["data"][0]["charge"]
        assert charge["total_microcents"] == 0
        assert charge["input_microcents"] == charge["cache_read_microcents"] == 0
        assert charge["output_microcents"] == 0
        assert (charge["cache_read_tokens"], charge["output_tokens"]) == (4352, 20)
        assert charge["price_version_id"] is None
        assert balance(api, key.account_id) == 0
        assert charge_entries(api, key.account_id) == []
        day = AT.replace(hour=0, minute=0, second=0, microsecond=0)
        assert rollups_of(api, key.account_id)[("1d", "key_model", day, key.id, model)] == (
            1,
            4508,
            4352,
            20,
            16,
            0,
        )

    def test_unbilled_account_needs_no_price(self, api: Api) -> None:
        key = create_key(api, create_account(api, billing="unbilled"))
        model = priced_model(api, NOW + timedelta(days=1))  # no price in force at AT
        assert statuses(ingest(api, usage_event(key, model, AT))) == ["recorded"]

    def test_revoked_key_and_retired_model_are_still_billed(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        model = priced_model(api, NOW - timedelta(days=3), deprecation_date="2026-11-28")
        assert api.admin("DELETE", f"/admin/v1/api-keys/{key.id}").status_code == 200
        body = ingest(api, usage_event(key, model, AT, chat_usage(1000, 100)))
        assert statuses(body) == ["recorded"]
        assert balance(api, key.account_id) == -(22_000 + 33_900)

    def test_model_id_is_case_insensitive_and_stored_in_catalog_spelling(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        assert statuses(ingest(api, usage_event(key, model.upper(), AT))) == ["recorded"]
        assert [e.model_id for e in events_of(api, key.account_id)] == [model]


class TestRollups:
    def test_six_rows_per_event_summed_per_bucket(self, api: Api) -> None:
        account = create_account(api)
        key_a, key_b = create_key(api, account), create_key(api, account)
        m1 = priced_model(api, NOW - timedelta(days=1))
        m2 = priced_model(api, NOW - timedelta(days=1), rates=(1_000_000, 2_000_000, 500_000))
        h10 = NOW.replace(hour=10)
        h11 = NOW.replace(hour=11)
        ingest(
            api,
            usage_event(
                key_a, m1, h10 + timedelta(minutes=5), chat_usage(100, 10, cached=40, reasoning=4)
            ),
            usage_event(key_a, m1, h10 + timedelta(minutes=50), chat_usage(200, 20)),
            usage_event(key_b, m1, h11, chat_usage(300, 30, cached=300)),
        )
        ingest(
            api,
            usage_event(key_a, m2, h11 + timedelta(minutes=59), chat_usage(1000, 5, reasoning=5)),
        )
        # Costs by hand: 60×22 + 40×17.75 + 10×339 = 1320 + 710 + 3390;
        # 200×22 + 20×339 = 4400 + 6780; 300×17.75 + 30×339 = 5325 + 10170; 1000×1 + 5×2 = 1010.
        c1, c2, c3, c4 = 5420, 11180, 15495, 1010
        day = NOW.replace(hour=0)
        expected = {
            ("1h", "key_model", h10, key_a.id, m1): (2, 300, 40, 30, 4, c1 + c2),
            ("1h", "key", h10, key_a.id, ""): (2, 300, 40, 30, 4, c1 + c2),
            ("1h", "model", h10, "", m1): (2, 300, 40, 30, 4, c1 + c2),
            ("1h", "key_model", h11, key_b.id, m1): (1, 300, 300, 30, 0, c3),
            ("1h", "key_model", h11, key_a.id, m2): (1, 1000, 0, 5, 5, c4),
            ("1h", "key", h11, key_b.id, ""): (1, 300, 300, 30, 0, c3),
            ("1h", "key", h11, key_a.id, ""): (1, 1000, 0, 5, 5, c4),
            ("1h", "model", h11, "", m1): (1, 300, 300, 30, 0, c3),
            ("1h", "model", h11, "", m2): (1, 1000, 0, 5, 5, c4),
            ("1d", "key_model", day, key_a.id, m1): (2, 300, 40, 30, 4, c1 + c2),
            ("1d", "key_model", day, key_b.id, m1): (1, 300, 300, 30, 0, c3),
            ("1d", "key_model", day, key_a.id, m2): (1, 1000, 0, 5, 5, c4),
            ("1d", "key", day, key_a.id, ""): (3, 1300, 40, 35, 9, c1 + c2 + c4),
            ("1d", "key", day, key_b.id, ""): (1, 300, 300, 30, 0, c3),
            ("1d", "model", day, "", m1): (3, 600, 340, 60, 4, c1 + c2 + c3),
            ("1d", "model", day, "", m2): (1, 1000, 0, 5, 5, c4),
        }
        assert rollups_of(api, account) == expected
        assert balance(api, account) == -(c1 + c2 + c3 + c4)


class TestBatchResponse:
    def test_results_in_order_with_counts(self, api: Api, glm: tuple[Key, str, str]) -> None:
        key, model, _ = glm
        first = usage_event(key, model, AT)
        body = ingest(
            api,
            first,
            usage_event(key, "no-such-model", AT),
            "not an event",
            first,
        )
        assert body["object"] == "list"
        assert [r["index"] for r in body["data"]] == [0, 1, 2, 3]
        assert statuses(body) == ["recorded", "quarantined", "rejected", "duplicate"]
        assert (body["recorded"], body["duplicates"], body["quarantined"], body["rejected"]) == (
            1,
            1,
            1,
            1,
        )
        for result in body["data"]:
            assert set(result) == {"index", "request_id", "status", "charge", "error"}
        assert body["data"][0]["error"] is None
        assert body["data"][3]["charge"] == body["data"][0]["charge"]
        assert body["data"][1]["charge"] is None
        assert body["data"][1]["error"]["code"] == "model_not_found"
        assert body["data"][2]["request_id"] is None

    def test_a_full_batch_of_1000(self, api: Api, glm: tuple[Key, str, str]) -> None:
        key, model, _ = glm
        events = [usage_event(key, model, AT, chat_usage(i, 1)) for i in range(1000)]
        body = ingest(api, *events)
        assert body["recorded"] == 1000
        assert balance(api, key.account_id) == -sum(i * 22 + 339 for i in range(1000))

    def test_more_than_1000_events_is_batch_too_large(
        self, api: Api, glm: tuple[Key, str, str]
    ) -> None:
        key, model, _ = glm
        events = [usage_event(key, model, AT) for _ in range(1001)]
        response = api.gateway("POST", "/v1/usage/events", json={"events": events})
        assert_error(response, 400, "batch_too_large", param="events")
        assert events_of(api, key.account_id) == []

    @pytest.mark.parametrize(
        ("body", "code", "param"),
        [
            ({"events": []}, "invalid_parameter", "events"),
            ({}, "missing_parameter", "events"),
            ({"events": {"request_id": "x"}}, "invalid_parameter", "events"),
            ([], "invalid_json_request", None),
        ],
    )
    def test_malformed_batches(self, api: Api, body: Any, code: str, param: str | None) -> None:
        assert_error(api.gateway("POST", "/v1/usage/events", json=body), 400, code, param=param)

    def test_only_the_gateway_may_send_usage(self, api: Api, glm: tuple[Key, str, str]) -> None:
        key, model, _ = glm
        body = {"events": [usage_event(key, model, AT)]}
        assert_error(api.client.post("/v1/usage/events", json=body), 401, "missing_api_key")
        assert_error(
            api.as_key(key.secret, "POST", "/v1/usage/events", json=body), 401, "invalid_api_key"
        )
        assert_error(api.admin("POST", "/v1/usage/events", json=body), 401, "invalid_api_key")
        assert events_of(api, key.account_id) == []


class TestMetrics:
    def test_counters_by_result(self, api: Api, glm: tuple[Key, str, str]) -> None:
        key, model, _ = glm

        def counters() -> dict[str, int]:
            text = api.client.get("/metrics").text
            values = {}
            for status in ("recorded", "duplicate", "quarantined", "rejected"):
                line = f'metering_usage_events_total{{status="{status}"}} '
                found = [row for row in text.splitlines() if row.startswith(line)]
                values[status] = int(float(found[0].split()[-1])) if found else 0
            return values

        before = counters()
        event = usage_event(key, model, AT)
        ingest(api, event, event, usage_event(key, "no-such-model", AT), {"request_id": ""})
        after = counters()
        assert {s: after[s] - before[s] for s in after} == {
            "recorded": 1,
            "duplicate": 1,
            "quarantined": 1,
            "rejected": 1,
        }
