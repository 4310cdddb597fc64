"""Usage settles the credit hold of its request, and is charged in full whatever the hold:
within it, above it, expired, voided, settled already, or none. Holds are placed through the
gateway's real ``POST /v1/authorizations``."""

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
    unique,
    usage_event,
)
from tests.usage.helpers import statuses

GRANT = 1000 * 1_000_000  # 1000 cents, in microcents
ESTIMATE = 1000 * 22 + 100 * 339  # prompt 1000 priced uncached + max_tokens 100: 55,900


@pytest.fixture
def funded(api: Api) -> tuple[Key, str]:
    account = create_account(api)
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/grants",
        json={"amount_cents": 1000, "idempotency_key": unique("grant"), "note": "test credit"},
    )
    assert response.status_code == 201, response.text
    return create_key(api, account), priced_model(api, NOW - timedelta(days=1))


def authorize(api: Api, key: Key, model: str, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "api_key": key.secret,
        "model": model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "max_tokens": 100,
    }
    if request_id is not None:
        body["request_id"] = request_id
    response = api.gateway("POST", "/v1/authorizations", json=body)
    assert response.status_code == 200, response.text
    hold = response.json()
    assert hold["estimate_microcents"] == ESTIMATE
    return dict(hold)


def credits(api: Api, key: Key) -> tuple[int, int, int]:
    body = api.as_key(key.secret, "GET", "/v1/credits").json()
    return body["balance_microcents"], body["held_microcents"], body["available_microcents"]


def hold(api: Api, key: Key, hold_id: str) -> dict[str, Any]:
    listed = api.admin(
        "GET", "/admin/v1/authorizations", params={"account_id": key.account_id, "limit": 1000}
    ).json()["data"]
    (found,) = [h for h in listed if h["id"] == hold_id]
    return dict(found)


def test_usage_within_the_hold(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    placed = authorize(api, key, model)
    assert credits(api, key) == (GRANT, ESTIMATE, GRANT - ESTIMATE)
    usage = chat_usage(1000, 40)  # 22,000 + 13,560
    event = usage_event(
        key, model, NOW - timedelta(seconds=5), usage, authorization_id=placed["id"]
    )
    assert statuses(ingest(api, event)) == ["recorded"]
    charged = 22_000 + 13_560
    assert credits(api, key) == (GRANT - charged, 0, GRANT - charged)
    settled = hold(api, key, placed["id"])
    assert settled["status"] == "settled"
    assert settled["usage_event_id"] is not None


def test_usage_above_the_hold_is_charged_in_full(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    placed = authorize(api, key, model)
    usage = chat_usage(1000, 500, reasoning=450)  # reasoning ran past max_tokens
    event = usage_event(key, model, NOW, usage, authorization_id=placed["id"])
    ingest(api, event)
    charged = 22_000 + 500 * 339
    assert charged > ESTIMATE
    assert credits(api, key) == (GRANT - charged, 0, GRANT - charged)
    assert hold(api, key, placed["id"])["status"] == "settled"


def test_usage_after_the_hold_expired(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    placed = authorize(api, key, model)
    api.clock.advance(seconds=api.settings.hold_ttl_seconds + 1)
    assert credits(api, key) == (GRANT, 0, GRANT)  # an expired hold no longer counts
    event = usage_event(
        key, model, NOW + timedelta(seconds=1), chat_usage(1000, 100), authorization_id=placed["id"]
    )
    ingest(api, event)
    assert credits(api, key) == (GRANT - ESTIMATE, 0, GRANT - ESTIMATE)
    # It did get its usage: not reported as lost.
    assert hold(api, key, placed["id"])["status"] == "settled"


def test_usage_without_any_hold(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    ingest(api, usage_event(key, model, NOW, chat_usage(1000, 100)))
    assert credits(api, key) == (GRANT - ESTIMATE, 0, GRANT - ESTIMATE)


def test_settled_by_request_id_without_authorization_id(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    placed = authorize(api, key, model, request_id="req-42")
    other = authorize(api, key, model, request_id="req-43")
    ingest(api, usage_event(key, model, NOW, chat_usage(1000, 10), request_id="req-42"))
    charged = 22_000 + 3_390
    assert credits(api, key) == (GRANT - charged, ESTIMATE, GRANT - charged - ESTIMATE)
    assert hold(api, key, placed["id"])["status"] == "settled"
    assert hold(api, key, other["id"])["status"] == "active"


def test_a_voided_hold_stays_voided_and_usage_is_charged(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    placed = authorize(api, key, model)
    assert api.gateway("DELETE", f"/v1/authorizations/{placed['id']}").status_code == 200
    ingest(api, usage_event(key, model, NOW, chat_usage(1000, 100), authorization_id=placed["id"]))
    assert credits(api, key) == (GRANT - ESTIMATE, 0, GRANT - ESTIMATE)
    assert hold(api, key, placed["id"])["status"] == "voided"


def test_another_accounts_hold_is_never_settled(api: Api, funded: tuple[Key, str]) -> None:
    key, model = funded
    placed = authorize(api, key, model)
    stranger = create_key(api, create_account(api))
    ingest(api, usage_event(stranger, model, NOW, authorization_id=placed["id"]))
    assert hold(api, key, placed["id"])["status"] == "active"


def test_an_unbilled_accounts_hold_is_settled_at_zero_charge(api: Api) -> None:
    key = create_key(api, create_account(api, billing="unbilled"))
    model = priced_model(api, NOW - timedelta(days=1))
    placed = authorize(api, key, model)
    ingest(api, usage_event(key, model, NOW, chat_usage(1000, 100), authorization_id=placed["id"]))
    assert hold(api, key, placed["id"])["status"] == "settled"
    assert credits(api, key)[0] == 0
