"""Exactly once: a request_id is recorded once per account, forever. The same content again is a
duplicate with the original charge; different content is quarantined and the original stands."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import NOW, Api
from tests.factories import (
    Key,
    chat_usage,
    create_account,
    create_key,
    ingest,
    priced_model,
    usage_event,
)
from tests.usage.helpers import balance, charge_entries, events_of, quarantine_of, statuses

AT = NOW - timedelta(minutes=10)


@pytest.fixture
def setup(api: Api) -> tuple[Key, str]:
    return create_key(api, create_account(api)), priced_model(api, NOW - timedelta(days=1))


class TestDuplicates:
    def test_within_one_batch(self, api: Api, setup: tuple[Key, str]) -> None:
        key, model = setup
        event = usage_event(key, model, AT, chat_usage(1000, 100))
        body = ingest(api, event, event, event)
        assert statuses(body) == ["recorded", "duplicate", "duplicate"]
        assert body["data"][1]["charge"] == body["data"][0]["charge"]
        assert len(events_of(api, key.account_id)) == 1
        assert charge_entries(api, key.account_id) == [-55_900]

    def test_across_batches_forever(self, api: Api, setup: tuple[Key, str]) -> None:
        key, model = setup
        event = usage_event(key, model, AT, chat_usage(1000, 100))
        first = ingest(api, event)
        api.clock.advance(days=400)  # dedup is a constraint, not a time window
        later = ingest(api, event)
        assert statuses(later) == ["duplicate"]
        assert later["data"][0]["charge"] == first["data"][0]["charge"]
        assert balance(api, key.account_id) == -55_900

    @pytest.mark.parametrize(
        "change",
        [
            {"occurred_at": (AT + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S+02:00")},
            {"occurred_at": AT.strftime("%Y-%m-%dT%H:%M:%S.000000Z")},
            {"authorization_id": "auth_somethingelse"},
            {"usage": {**chat_usage(1000, 100), "total_tokens": 9, "extra": [1, 2]}},
            {"usage": {"prompt_tokens": 1000, "completion_tokens": 100}},
            {"debug": "ignored"},
        ],
    )
    def test_same_content_is_compared_after_normalisation(
        self, api: Api, setup: tuple[Key, str], change: dict[str, Any]
    ) -> None:
        key, model = setup
        event = usage_event(key, model, AT, chat_usage(1000, 100))
        ingest(api, event)
        assert statuses(ingest(api, {**event, **change})) == ["duplicate"]

    def test_model_spelling_does_not_matter(self, api: Api, setup: tuple[Key, str]) -> None:
        key, model = setup
        event = usage_event(key, model, AT)
        assert statuses(ingest(api, event, {**event, "model": model.lower()})) == [
            "recorded",
            "duplicate",
        ]

    def test_request_ids_are_scoped_to_the_account(self, api: Api, setup: tuple[Key, str]) -> None:
        key, model = setup
        other = create_key(api, create_account(api))
        event = usage_event(key, model, AT)
        body = ingest(api, event, {**event, "api_key_id": other.id})
        assert statuses(body) == ["recorded", "recorded"]

    def test_another_key_of_the_same_account_is_different_content(
        self, api: Api, setup: tuple[Key, str]
    ) -> None:
        key, model = setup
        sibling = create_key(api, key.account_id)
        event = usage_event(key, model, AT)
        body = ingest(api, event, {**event, "api_key_id": sibling.id})
        assert statuses(body) == ["recorded", "quarantined"]
        assert body["data"][1]["error"]["code"] == "idempotency_conflict"


class TestConflicts:
    @pytest.mark.parametrize(
        "change",
        [
            {"usage": chat_usage(1000, 101)},
            {"usage": chat_usage(1000, 100, cached=1)},
            {"usage": chat_usage(1000, 100, reasoning=1)},
            {"outcome": "failed"},
            {"occurred_at": "2026-11-29T11:50:00.000001Z"},
            {"api": "responses", "usage": {"input_tokens": 1000, "output_tokens": 100}},
        ],
    )
    def test_different_content_is_quarantined_and_the_original_stands(
        self, api: Api, setup: tuple[Key, str], change: dict[str, Any]
    ) -> None:
        key, model = setup
        event = usage_event(key, model, AT, chat_usage(1000, 100))
        ingest(api, event)
        body = ingest(api, {**event, **change})
        assert statuses(body) == ["quarantined"]
        assert body["data"][0]["error"]["code"] == "idempotency_conflict"
        assert body["data"][0]["charge"] is None
        (stored,) = events_of(api, key.account_id)
        assert (stored.prompt_tokens, stored.output_tokens, stored.outcome) == (
            1000,
            100,
            "completed",
        )
        assert balance(api, key.account_id) == -55_900
        (entry,) = quarantine_of(api, key.account_id)
        assert entry["code"] == "idempotency_conflict"
        assert entry["event"]["request_id"] == event["request_id"]

    def test_a_conflict_with_another_model(self, api: Api, setup: tuple[Key, str]) -> None:
        key, model = setup
        other = priced_model(api, NOW - timedelta(days=1))
        event = usage_event(key, model, AT)
        body = ingest(api, event, {**event, "model": other})
        assert statuses(body) == ["recorded", "quarantined"]

    def test_within_one_batch_the_first_billable_one_wins(
        self, api: Api, setup: tuple[Key, str]
    ) -> None:
        key, model = setup
        event = usage_event(key, model, AT, chat_usage(1000, 100))
        unbillable = {**event, "model": "no-such-model"}
        body = ingest(api, unbillable, event, {**event, "usage": chat_usage(5, 5)}, event)
        assert statuses(body) == ["quarantined", "recorded", "quarantined", "duplicate"]
        assert [r["error"]["code"] for r in body["data"] if r["error"]] == [
            "model_not_found",
            "idempotency_conflict",
        ]
        assert len(events_of(api, key.account_id)) == 1
