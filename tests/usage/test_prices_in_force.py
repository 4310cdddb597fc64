"""Pricing at request time: the rates in force for the account at ``occurred_at`` (its override,
else the list price), whatever changes later; the version used is stored with the charge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.conftest import NOW, Api
from tests.factories import (
    add_price,
    chat_usage,
    create_account,
    create_key,
    ingest,
    priced_model,
    usage_event,
)
from tests.usage.helpers import statuses

OLD = (10_000_000, 100_000_000, 1_000_000)  # 10 / 100 / 1 µ¢ per token
NEW = (20_000_000, 300_000_000, 5_000_000)  # 20 / 300 / 5 µ¢ per token
USAGE = chat_usage(1000, 100, cached=400)  # 600 uncached, 400 cached, 100 output
OLD_TOTAL = 600 * 10 + 400 * 1 + 100 * 100  # 16,400
NEW_TOTAL = 600 * 20 + 400 * 5 + 100 * 300  # 44,000


def set_override(api: Api, account_id: str, model: str, at: Any, rates: Any) -> str:
    saved = api.clock.now()
    api.clock.set(at)
    try:
        response = api.admin(
            "POST",
            f"/admin/v1/accounts/{account_id}/rates",
            json={
                "model": model,
                "effective_at": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "input_microcents_per_million": rates and rates[0],
                "output_microcents_per_million": rates and rates[1],
                "cache_read_microcents_per_million": rates and rates[2],
            },
        )
    finally:
        api.clock.set(saved)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def totals(body: dict[str, Any]) -> list[tuple[int, str]]:
    assert set(statuses(body)) == {"recorded"}, body
    return [
        (r["charge"]["total_microcents"], r["charge"]["price_version_id"]) for r in body["data"]
    ]


def test_a_version_taking_effect_between_two_events(api: Api) -> None:
    key = create_key(api, create_account(api))
    change = NOW - timedelta(hours=1)
    model = priced_model(api, NOW - timedelta(days=10), rates=OLD)
    new_version = add_price(api, model, change, rates=NEW)
    old_version = api.admin("GET", f"/admin/v1/models/{model}").json()["prices"][0]["id"]
    body = ingest(
        api,
        usage_event(key, model, change - timedelta(microseconds=1), USAGE),
        usage_event(key, model, change, USAGE),  # exactly at effective_at: the new price
        usage_event(key, model, change + timedelta(minutes=30), USAGE),
        usage_event(key, model, change - timedelta(days=5), USAGE),
    )
    assert totals(body) == [
        (OLD_TOTAL, old_version),
        (NEW_TOTAL, new_version),
        (NEW_TOTAL, new_version),
        (OLD_TOTAL, old_version),
    ]


def test_late_events_keep_the_price_of_their_request_time(api: Api) -> None:
    key = create_key(api, create_account(api))
    model = priced_model(api, NOW - timedelta(days=10), rates=OLD)
    add_price(api, model, NOW + timedelta(minutes=1), rates=NEW)
    api.clock.advance(hours=3)  # the gateway replays its spool three hours later
    body = ingest(api, usage_event(key, model, NOW - timedelta(minutes=1), USAGE))
    assert totals(body)[0][0] == OLD_TOTAL


def test_an_account_override_and_its_end(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    other = create_key(api, create_account(api))
    model = priced_model(api, NOW - timedelta(days=10), rates=OLD)
    starts, ends = NOW - timedelta(hours=3), NOW - timedelta(hours=1)
    override = set_override(api, account, model, starts, NEW)
    set_override(api, account, model, ends, None)  # all-null rates end the override
    list_version = api.admin("GET", f"/admin/v1/models/{model}").json()["prices"][0]["id"]
    body = ingest(
        api,
        usage_event(key, model, starts - timedelta(seconds=1), USAGE),
        usage_event(key, model, starts, USAGE),
        usage_event(key, model, ends - timedelta(seconds=1), USAGE),
        usage_event(key, model, ends, USAGE),
        usage_event(other, model, starts + timedelta(minutes=1), USAGE),  # another account
    )
    assert totals(body) == [
        (OLD_TOTAL, list_version),
        (NEW_TOTAL, override),
        (NEW_TOTAL, override),
        (OLD_TOTAL, list_version),
        (OLD_TOTAL, list_version),
    ]


def test_an_override_applies_even_before_any_list_price(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    model = priced_model(api, NOW + timedelta(days=1), rates=OLD)  # no list price yet
    override = set_override(api, account, model, NOW - timedelta(hours=1), NEW)
    body = ingest(api, usage_event(key, model, NOW - timedelta(minutes=5), USAGE))
    assert totals(body) == [(NEW_TOTAL, override)]
