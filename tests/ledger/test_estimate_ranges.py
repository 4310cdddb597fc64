"""Ranges (docs/api.md#ranges): an authorization whose estimate would take the account's held sum
beyond a signed 64-bit integer is 400 ``invalid_parameter`` naming the field that makes it too large
(``n``, ``max_tokens`` or ``prompt_tokens``), on both backends, unbilled accounts included; and
``GET /v1/credits`` then answers, its held sum within range."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from metering.pricing import Estimate, EstimateRequest, field_beyond_range
from tests.conftest import NOW, Api
from tests.factories import (
    assert_error,
    authorize,
    create_account,
    create_key,
    credits_of,
    priced_model,
)

INT64_MAX = 2**63 - 1
MAX_RATE = 10**12  # microcents per million tokens: one microcent per token
MAX_TOKENS = 2**31 - 1


def granted(response: Any) -> int:
    assert response.status_code == 200, response.text
    return int(response.json()["estimate_microcents"])


# Without a concurrency limit an unbilled account's holds are inserted without any lock; with
# one, they go through the check-and-hold under the account's lock: the same rule either way.
@pytest.mark.parametrize("concurrency_limit", [None, 10**6])
def test_the_held_sum_of_an_unbilled_account_stays_in_range(
    api: Api, concurrency_limit: int | None
) -> None:
    model = priced_model(
        api,
        NOW - timedelta(days=1),
        rates=(MAX_RATE, MAX_RATE, MAX_RATE),
        context_length=MAX_TOKENS,
        reasoning_headroom_tokens=MAX_TOKENS,
    )
    account = create_account(api, billing="unbilled")
    if concurrency_limit is not None:
        response = api.admin(
            "PATCH",
            f"/admin/v1/accounts/{account}",
            json={"max_concurrent_requests": concurrency_limit},
        )
        assert response.status_code == 200, response.text
    key = create_key(api, account)
    per_choice = (MAX_TOKENS - 1 + MAX_TOKENS) * 10**6  # (max_tokens + headroom) at 1 µ¢/token
    widest = {"prompt_tokens": 1, "max_tokens": MAX_TOKENS - 1, "reasoning": True}

    held = 0
    while INT64_MAX - held >= 10**6 + 128 * per_choice:
        held += granted(authorize(api, key, model, n=128, **widest))
    assert held == (INT64_MAX // (10**6 + 128 * per_choice)) * (10**6 + 128 * per_choice)
    # One choice still fits, 128 do not: n makes it too large.
    assert_error(authorize(api, key, model, n=128, **widest), 400, "invalid_parameter", param="n")
    # A retry of that request id is refused the same way (it took no request id).
    response = authorize(api, key, model, n=128, request_id="retry-me", **widest)
    assert_error(response, 400, "invalid_parameter", param="n")
    assert_error(
        authorize(api, key, model, n=128, request_id="retry-me", **widest),
        400,
        "invalid_parameter",
        param="n",
    )

    choices = (INT64_MAX - held - 10**6) // per_choice
    held += granted(authorize(api, key, model, n=choices, **widest))
    # Not even one choice fits now, the prompt does: max_tokens makes it too large.
    assert_error(
        authorize(api, key, model, n=1, **widest), 400, "invalid_parameter", param="max_tokens"
    )
    # Fill up to less than the cost of a 2^31-2 token prompt.
    while INT64_MAX - held > 10**15:
        room = INT64_MAX - held
        output = min(MAX_TOKENS - 2, (room - 10**15) // 10**6)
        held += granted(authorize(api, key, model, prompt_tokens=1, max_tokens=output))
    assert_error(
        authorize(api, key, model, prompt_tokens=MAX_TOKENS - 2, max_tokens=1),
        400,
        "invalid_parameter",
        param="prompt_tokens",
    )
    # Small requests still pass, up to the end of the range.
    granted(authorize(api, key, model, prompt_tokens=1, max_tokens=1))
    credits = credits_of(api, key)
    assert credits["held_microcents"] == held + 2 * 10**6 <= INT64_MAX
    assert credits["available_microcents"] == -credits["held_microcents"]


def test_the_field_named() -> None:
    """The pure rule that names the field, for each part of the estimate."""
    request = EstimateRequest(api="chat_completions", prompt_tokens=10, max_tokens=10, n=4)
    estimate = Estimate(
        max_tokens=10, reserved_output_tokens=40, input_microcents=100, output_microcents=400
    )
    assert field_beyond_range(request, estimate, 99) == "prompt_tokens"
    assert field_beyond_range(request, estimate, 199) == "max_tokens"
    assert field_beyond_range(request, estimate, 200) == "n"
    assert field_beyond_range(request, estimate, 499) == "n"
    single = EstimateRequest(api="chat_completions", prompt_tokens=10, max_tokens=10)
    assert field_beyond_range(single, estimate, 499) == "max_tokens"


def test_a_balance_far_below_zero_with_holds_counted_is_refused_not_an_overflow(api: Api) -> None:
    """balance − held would pass the bottom of the range: the authorization is a 402, never a
    500 (the check-and-hold's ``available`` stops at the bottom of the range)."""
    model = priced_model(
        api,
        NOW - timedelta(days=1),
        rates=(MAX_RATE, MAX_RATE, MAX_RATE),
        context_length=MAX_TOKENS,
        reasoning_headroom_tokens=MAX_TOKENS,
    )
    account = create_account(api)
    key = create_key(api, account)
    grant_cents = 9 * 10**12
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/grants",
        json={"amount_cents": grant_cents, "idempotency_key": "big"},
    )
    assert response.status_code == 201, response.text
    widest = {"prompt_tokens": 1, "max_tokens": MAX_TOKENS - 1, "reasoning": True, "n": 128}
    held = granted(authorize(api, key, model, **widest))
    for index, cents in enumerate((-9 * 10**12, -9 * 10**12, -(INT64_MAX // 10**6 - 9 * 10**12))):
        response = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/adjustments",
            json={"amount_cents": cents, "idempotency_key": f"down-{index}", "reason": "test"},
        )
        assert response.status_code == 201, response.text
    balance = credits_of(api, key)["balance_microcents"]
    assert balance - held < -(2**63)  # what available would be
    response = authorize(api, key, model, prompt_tokens=1, max_tokens=1)
    assert_error(response, 402, "insufficient_credits")
