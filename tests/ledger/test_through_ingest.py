"""Spend windows, a grant's expiry at its instant and a deficit's pay-off, proven the way money
really arrives: usage events through ``POST /v1/usage/events``, each sent while the test clock
stands at its moment, their charges checked against the price oracle (tests/oracle.py). (The
other tests of these rules seed the report aggregates or settle invented charges directly.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from tests import oracle
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    assert_error,
    authorize,
    chat_usage,
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
from tests.ledger.helpers import expected_estimate

MICROSECOND = timedelta(microseconds=1)
ESTIMATE = expected_estimate(1000, 100, GLM_RATES)  # authorize()'s request


def cents(microcents: int) -> str:
    """Microcents as an exact JSON number of cents."""
    return format(Decimal(microcents) / 10**6, "f")


def send_at(api: Api, at: datetime, event: dict[str, Any]) -> int:
    """Send ``event`` with the clock at ``at``; its charge, which must be the oracle's."""
    api.clock.set(at)
    body = ingest(api, event)
    (result,) = body["data"]
    assert result["status"] == "recorded", result
    expected = oracle.event_charge(event, GLM_RATES)
    assert result["charge"]["total_microcents"] == expected.total_microcents, result
    return expected.total_microcents


def set_window(api: Api, key: Key, limit_microcents: int, window: str) -> None:
    response = api.client.patch(
        f"/admin/v1/api-keys/{key.id}",
        content=(
            f'{{"spend_limit_cents": {cents(limit_microcents)}, "spend_limit_window": "{window}"}}'
        ).encode(),
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert (response.json()["spend_limit_microcents"], response.json()["spend_limit_window"]) == (
        limit_microcents,
        window,
    )


def own_key(api: Api, key: Key) -> dict[str, Any]:
    response = api.as_key(key.secret, "GET", "/v1/api-keys")
    assert response.status_code == 200, response.text
    return next(k for k in response.json()["data"] if k["id"] == key.id)


def grant_of(api: Api, grant_id: str) -> dict[str, Any]:
    response = api.admin("GET", f"/admin/v1/grants/{grant_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


# NOW is Sunday 2026-11-29 12:00 UTC: its day, its week (from Monday the 23rd) and its month.
WINDOWS = [
    ("day", datetime(2026, 11, 29, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
    ("week", datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
    ("month", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
]


@pytest.mark.parametrize(("window", "start", "end"), WINDOWS, ids=[w for w, _, _ in WINDOWS])
def test_a_spend_window_counts_the_charges_recorded_in_it(
    api: Api, window: str, start: datetime, end: datetime
) -> None:
    model = priced_model(api, start - timedelta(days=40))
    account = create_account(api)
    grant(api, account, 10_000)
    key = create_key(api, account)
    set_window(api, key, 10**9, window)
    # An event a microsecond before the window and one at its first instant, each sent at its
    # moment; one more sent now, late, that occurred before the window.
    before = send_at(api, start - MICROSECOND, usage_event(key, model, start - MICROSECOND))
    inside = send_at(api, start, usage_event(key, model, start, chat_usage(1001, 333)))
    late = usage_event(key, model, start - timedelta(hours=1), chat_usage(50_000, 5_000))
    assert send_at(api, NOW, late) > 0 and before > 0
    shown = own_key(api, key)
    assert (shown["spent_microcents"], shown["window_starts_at"]) == (
        inside,
        start.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    # Room for exactly one more request: its charges so far, plus one estimate.
    set_window(api, key, inside + ESTIMATE, window)
    held = authorize(api, key, model)
    assert held.status_code == 200, held.text
    error = assert_error(authorize(api, key, model), 402, "member_spend_limit")
    assert error["spend_limit_window"] == window, error
    assert exact_json(authorize(api, key, model))["error"]["spent_cents"] == (
        Decimal(inside + ESTIMATE) / 10**6
    )
    voided = api.gateway("DELETE", f"/v1/authorizations/{held.json()['id']}")
    assert voided.status_code == 200 and voided.json()["status"] == "voided", voided.text
    # An event of the window's last microsecond still counts; at its end a new window starts.
    last = send_at(api, end - MICROSECOND, usage_event(key, model, end - MICROSECOND))
    assert own_key(api, key)["spent_microcents"] == inside + last
    assert_error(authorize(api, key, model), 402, "member_spend_limit")
    api.clock.set(end)
    assert own_key(api, key)["spent_microcents"] == 0
    assert authorize(api, key, model).status_code == 200


def test_a_grant_pays_an_event_recorded_before_its_expiry_not_one_recorded_at_it(
    api: Api,
) -> None:
    model = priced_model(api, NOW - timedelta(days=1))
    account = create_account(api)
    key = create_key(api, account)
    expires = NOW + timedelta(hours=1)
    body = {
        "amount_cents": 1,
        "idempotency_key": unique("promo"),
        "category": "promotional",
        "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    made = api.admin("POST", f"/admin/v1/accounts/{account}/grants", json=body)
    assert made.status_code == 201, made.text
    promo = made.json()["id"]
    paid = grant(api, account, 100)["id"]
    first = send_at(api, expires - MICROSECOND, usage_event(key, model, expires - MICROSECOND))
    assert grant_of(api, promo)["remaining_microcents"] == 1_000_000 - first
    assert grant_of(api, paid)["remaining_microcents"] == 100_000_000
    second = send_at(api, expires, usage_event(key, model, expires))
    assert (grant_of(api, promo)["status"], grant_of(api, promo)["remaining_microcents"]) == (
        "expired",
        0,
    )
    assert grant_of(api, paid)["remaining_microcents"] == 100_000_000 - second
    credits = credits_of(api, key)
    assert credits["balance_microcents"] == 100_000_000 - second
    assert [g["id"] for g in credits["grants"]] == [paid]


def test_a_deficit_from_events_is_paid_off_by_the_next_grant(api: Api) -> None:
    model = priced_model(api, NOW - timedelta(days=1))
    account = create_account(api)
    key = create_key(api, account)
    grant(api, account, 1)
    big = chat_usage(100_000, 10_000)  # 5.59 cents at GLM's rates
    charges = [
        send_at(api, NOW + timedelta(minutes=m), usage_event(key, model, NOW, big)) for m in (1, 8)
    ]
    deficit = sum(charges) - 1_000_000
    credits = credits_of(api, key)
    assert (credits["balance_microcents"], credits["deficit_microcents"]) == (-deficit, deficit)
    assert_error(authorize(api, key, model), 402, "insufficient_credits")
    # A grant smaller than the deficit pays part of it and keeps nothing; the next pays the
    # rest and keeps what is left, which the next event is charged to.
    api.clock.advance(hours=3)
    partial = grant(api, account, 5)
    assert partial["remaining_microcents"] == 0
    deficit -= 5_000_000
    assert credits_of(api, key)["deficit_microcents"] == deficit
    api.clock.advance(days=1)
    made = grant(api, account, 20)
    assert made["remaining_microcents"] == 20_000_000 - deficit
    credits = credits_of(api, key)
    assert (credits["balance_microcents"], credits["deficit_microcents"]) == (
        20_000_000 - deficit,
        0,
    )
    later = api.clock.now() + timedelta(minutes=1)
    after = send_at(api, later, usage_event(key, model, later))
    assert grant_of(api, made["id"])["remaining_microcents"] == 20_000_000 - deficit - after
    listed = api.admin("GET", f"/admin/v1/accounts/{account}/ledger")
    assert listed.status_code == 200, listed.text
    # In the order they were recorded (each at its own instant of the test clock). The list is
    # newest first by row id, which on a Citus cluster is not the order of recording (a charge
    # written on a worker takes its id from that worker's range).
    recorded = sorted(listed.json()["data"], key=lambda entry: entry["created_at"])
    kinds = [entry["kind"] for entry in recorded]
    assert kinds == ["grant", "charge", "charge", "grant", "grant", "charge"], json.dumps(kinds)
    assert [e["amount_microcents"] for e in recorded] == [
        1_000_000,
        -charges[0],
        -charges[1],
        5_000_000,
        20_000_000,
        -after,
    ]
