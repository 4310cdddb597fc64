"""The estimate through ``POST /v1/authorizations``: every branch of the estimate, the validation
400s, key and model resolution, on both backends. Expected figures are computed here from the
rules."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    add_price,
    assert_error,
    authorization_request,
    authorize,
    exact_json,
    put_model,
)
from tests.ledger.helpers import DAY_BEFORE, expected_estimate, prepaid

RICH = 10**9  # cents: never the limiting factor here

# name -> model metadata
MODELS: dict[str, dict[str, Any]] = {
    "wide": {"context_length": 131072},  # default min(65536, 65536)
    "capped": {
        "context_length": 8192,
        "max_output_tokens": 2048,
        "reasoning_headroom_tokens": 1024,
    },
    "huge": {"context_length": 1_048_576},  # default 65536 (< half the context)
    "tiny": {"context_length": 1000},  # default min(65536, 500) = 500
}

# (model, api, prompt_tokens, max_tokens, n, reasoning) -> (effective max_tokens, reserved output)
GRANTED = [
    ("wide", "chat_completions", 1000, None, 1, False, 65536, 65536),
    ("wide", "chat_completions", 100_000, None, 1, False, 31072, 31072),  # context − prompt
    ("wide", "chat_completions", 1000, 200_000, 1, False, 65536, 65536),  # > context: ignored
    ("wide", "chat_completions", 1000, 131_072, 1, False, 65536, 65536),  # chat: retried w/o
    ("wide", "responses", 1000, 130_072, 1, False, 130_072, 130_072),  # fits exactly
    ("wide", "messages", 0, 131_072, 1, False, 131_072, 131_072),  # a zero prompt fits it all
    ("huge", "responses", 10, None, 1, False, 65536, 65536),
    ("capped", "chat_completions", 100, 4000, 1, False, 2048, 2048),  # lowered to the cap
    ("capped", "chat_completions", 7000, 2000, 1, False, 1192, 1192),  # chat default, bounded
    ("capped", "chat_completions", 100, None, 2, True, 2048, (2048 + 1024) * 2),  # headroom × n
    ("capped", "chat_completions", 100, None, 2, False, 2048, 4096),
    ("capped", "responses", 100, 500, 3, False, 500, 1500),
    ("capped", "messages", 100, 9000, 1, True, 2048, 3072),  # > context: the default
    ("tiny", "chat_completions", 100, None, 1, False, 500, 500),
    ("tiny", "messages", 999, 1, 1, False, 1, 1),
    ("tiny", "chat_completions", 700, None, 1, False, 300, 300),
]


@pytest.mark.parametrize(
    ("model", "api_name", "prompt", "max_tokens", "n", "reasoning", "limit", "reserved"), GRANTED
)
def test_estimate_branches(
    api: Api,
    model: str,
    api_name: str,
    prompt: int,
    max_tokens: int | None,
    n: int,
    reasoning: bool,
    limit: int,
    reserved: int,
) -> None:
    setup = prepaid(api, RICH, **MODELS[model])
    response = authorize(
        api,
        setup.key,
        setup.model,
        api=api_name,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        n=n,
        reasoning=reasoning,
    )
    assert response.status_code == 200, response.text
    body = exact_json(response)
    estimate = expected_estimate(prompt, reserved, GLM_RATES)
    assert body["max_tokens"] == limit
    assert body["estimate_microcents"] == estimate
    assert body["credits_required_cents_estimate"] == Decimal(estimate) / 10**6


# (model, api, prompt_tokens, max_tokens) -> (code, param)
CONTEXT_ERRORS = [
    ("wide", "responses", 1000, 131_072, "max_tokens"),
    ("wide", "messages", 1000, 131_000, "max_tokens"),
    ("capped", "responses", 7000, 2000, "max_tokens"),
    ("tiny", "chat_completions", 1000, None, "prompt_tokens"),  # prompt >= context
    ("tiny", "messages", 5000, 10, "prompt_tokens"),
]


@pytest.mark.parametrize(("model", "api_name", "prompt", "max_tokens", "param"), CONTEXT_ERRORS)
def test_context_length_exceeded(
    api: Api, model: str, api_name: str, prompt: int, max_tokens: int | None, param: str
) -> None:
    setup = prepaid(api, RICH, **MODELS[model])
    response = authorize(
        api, setup.key, setup.model, api=api_name, prompt_tokens=prompt, max_tokens=max_tokens
    )
    error = assert_error(response, 400, "context_length_exceeded", param=param)
    assert error["context_length_limit"] == MODELS[model]["context_length"]
    assert error["model"] == setup.model
    assert (
        setup.model in error["message"] or str(MODELS[model]["context_length"]) in error["message"]
    )


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"api": "messages", "max_tokens": None}, "missing_parameter", "max_tokens"),
        ({"max_tokens": 0}, "invalid_parameter", "max_tokens"),
        ({"max_tokens": -5}, "invalid_parameter", "max_tokens"),
        ({"api": "messages", "max_tokens": 0}, "invalid_parameter", "max_tokens"),
        ({"n": 0}, "invalid_parameter", "n"),
        ({"n": -1}, "invalid_parameter", "n"),
        ({"prompt_tokens": -1}, "invalid_parameter", "prompt_tokens"),
        ({"api": "completions"}, "unsupported_value", "api"),
        ({"api": None}, "missing_parameter", "api"),
        ({"model": None}, "missing_parameter", "model"),
        ({"model": ""}, "invalid_parameter", "model"),
        ({"prompt_tokens": None}, "missing_parameter", "prompt_tokens"),
        ({"prompt_tokens": 10**30}, "invalid_parameter", "prompt_tokens"),
        ({"max_tokens": 10**30}, "invalid_parameter", "max_tokens"),
        ({"max_tokens": -(10**30)}, "invalid_parameter", "max_tokens"),
        ({"n": 10**30}, "invalid_parameter", "n"),
        ({"n": 129}, "invalid_parameter", "n"),
        ({"prompt_tokens": "1000"}, "invalid_parameter", "prompt_tokens"),
        ({"prompt_tokens": True}, "invalid_parameter", "prompt_tokens"),
        ({"reasoning": "yes"}, "invalid_parameter", "reasoning"),
        ({"request_id": "has space"}, "invalid_parameter", "request_id"),
        ({"request_id": "x" * 65}, "invalid_parameter", "request_id"),
        ({"request_id": ""}, "invalid_parameter", "request_id"),
        ({"surprise": 1}, "invalid_parameter", "surprise"),
    ],
    ids=str,
)
def test_invalid_requests(api: Api, fields: dict[str, Any], code: str, param: str) -> None:
    setup = prepaid(api, RICH)
    body = authorization_request(setup.key, setup.model, **fields)
    for name, value in fields.items():
        if value is None:
            body.pop(name, None)
    response = api.gateway("POST", "/v1/authorizations", json=body)
    assert_error(response, 400, code, param=param)


@pytest.mark.parametrize("raw", ['{"prompt_tokens": 1000.5', "[]", "", "null", '"x"'])
def test_malformed_bodies(api: Api, raw: str) -> None:
    headers = {**api.gateway_headers, "Content-Type": "application/json"}
    response = api.client.post("/v1/authorizations", content=raw, headers=headers)
    assert_error(response, 400, "invalid_json_request")


def test_a_fractional_token_count_is_400(api: Api) -> None:
    setup = prepaid(api, RICH)
    body = authorization_request(setup.key, setup.model)
    raw = exact_text(body).replace('"prompt_tokens": 1000', '"prompt_tokens": 1000.5')
    headers = {**api.gateway_headers, "Content-Type": "application/json"}
    response = api.client.post("/v1/authorizations", content=raw, headers=headers)
    assert_error(response, 400, "invalid_parameter", param="prompt_tokens")


def exact_text(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body)


class TestRounding:
    def test_each_part_is_rounded_half_up_separately(self, api: Api) -> None:
        # 1 token at 0.5 µ¢ → 1; 1 token at 1.5 µ¢ → 2: 3 in all (4.0 rounded once would be 2).
        setup = prepaid(api, RICH, rates=(500_000, 1_500_000, 0), context_length=1000)
        body = authorize(api, setup.key, setup.model, prompt_tokens=1, max_tokens=1).json()
        assert body["estimate_microcents"] == 3

    def test_just_below_a_half_rounds_down(self, api: Api) -> None:
        setup = prepaid(api, RICH, rates=(1, 1, 1), context_length=1_000_000)
        body = authorize(api, setup.key, setup.model, prompt_tokens=499_999, max_tokens=1).json()
        assert body["estimate_microcents"] == 0
        body = authorize(api, setup.key, setup.model, prompt_tokens=500_000, max_tokens=1).json()
        assert body["estimate_microcents"] == 1

    def test_a_free_model_holds_nothing_and_is_granted_without_credit(self, api: Api) -> None:
        setup = prepaid(api, 0, rates=(0, 0, 0))
        response = authorize(api, setup.key, setup.model)
        assert response.status_code == 200, response.text
        assert response.json()["estimate_microcents"] == 0


class TestPriceInForce:
    def test_the_accounts_own_rates_are_used(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        response = api.admin(
            "POST",
            f"/admin/v1/accounts/{setup.account}/rates",
            json={
                "model": setup.model,
                "effective_at": "2026-11-29T12:00:00Z",
                "input_microcents_per_million": 1_000_000,
                "output_microcents_per_million": 2_000_000,
                "cache_read_microcents_per_million": 0,
            },
        )
        assert response.status_code == 201, response.text
        body = authorize(api, setup.key, setup.model, prompt_tokens=1000, max_tokens=100).json()
        assert body["estimate_microcents"] == 1000 + 200

    def test_a_version_applies_from_its_effective_at(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        later = NOW + timedelta(hours=1)
        add_price(api, setup.model, later, (2_000_000, 0, 0))
        before = authorize(api, setup.key, setup.model, prompt_tokens=1000, max_tokens=1)
        assert before.json()["estimate_microcents"] == expected_estimate(1000, 1, GLM_RATES)
        api.clock.set(later)
        at = authorize(api, setup.key, setup.model, prompt_tokens=1000, max_tokens=1)
        assert at.json()["estimate_microcents"] == 2000

    def test_no_price_in_force_is_model_not_found(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        unpriced = put_model(api)
        response = authorize(api, setup.key, unpriced)
        error = assert_error(response, 404, "model_not_found", param="model")
        assert "price" in error["message"]
        future = put_model(api)
        add_price(api, future, NOW + timedelta(days=1))
        assert_error(authorize(api, setup.key, future), 404, "model_not_found", param="model")


class TestModelResolution:
    def test_case_insensitive_and_returned_in_catalog_spelling(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        response = authorize(api, setup.key, setup.model.swapcase())
        assert response.status_code == 200, response.text
        assert response.json()["model"] == setup.model

    def test_unknown_model(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        response = authorize(api, setup.key, "No-Such-Model")
        assert_error(response, 404, "model_not_found", param="model")

    def test_retired_from_the_start_of_its_deprecation_date(self, api: Api) -> None:
        today = NOW.date().isoformat()
        tomorrow = (NOW + timedelta(days=1)).date().isoformat()
        setup = prepaid(api, RICH, deprecation_date=tomorrow)
        assert authorize(api, setup.key, setup.model).status_code == 200
        api.clock.set(NOW.replace(hour=23, minute=59, second=59, microsecond=999_999))
        assert authorize(api, setup.key, setup.model).status_code == 200
        api.clock.set(NOW.replace(hour=0) + timedelta(days=1))
        assert_error(authorize(api, setup.key, setup.model), 404, "model_not_found", param="model")
        retired = prepaid(api, RICH, deprecation_date=today)
        assert_error(
            authorize(api, retired.key, retired.model), 404, "model_not_found", param="model"
        )

    def test_hidden_models_are_served(self, api: Api) -> None:
        """Held and estimated like any other model (hidden only leaves the public list)."""
        setup = prepaid(api, RICH, hidden=True)
        response = authorize(api, setup.key, setup.model.lower())
        assert response.status_code == 200, response.text
        body = exact_json(response)
        estimate = expected_estimate(1000, 100, GLM_RATES)
        assert (body["status"], body["model"], body["max_tokens"]) == ("active", setup.model, 100)
        assert body["estimate_microcents"] == estimate
        credits = exact_json(api.as_key(setup.key.secret, "GET", "/v1/credits"))
        assert credits["held_microcents"] == estimate


class TestCredentials:
    def test_the_clients_key_is_401_with_param_api_key(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        body = authorization_request(setup.key, setup.model)
        for value, code in ((None, "missing_api_key"), ("", "missing_api_key")):
            response = api.gateway("POST", "/v1/authorizations", json={**body, "api_key": value})
            assert_error(response, 401, code, param="api_key")
        response = api.gateway("POST", "/v1/authorizations", json={**body, "api_key": "mk_nope"})
        assert_error(response, 401, "invalid_api_key", param="api_key")
        without = {k: v for k, v in body.items() if k != "api_key"}
        response = api.gateway("POST", "/v1/authorizations", json=without)
        assert_error(response, 401, "missing_api_key", param="api_key")

    def test_a_revoked_key_is_refused(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        assert authorize(api, setup.key, setup.model).status_code == 200
        assert api.admin("DELETE", f"/admin/v1/api-keys/{setup.key.id}").status_code == 200
        response = authorize(api, setup.key, setup.model)
        assert_error(response, 401, "invalid_api_key", param="api_key")

    def test_the_gateway_token_is_401_with_param_null(self, api: Api) -> None:
        setup = prepaid(api, RICH)
        body = authorization_request(setup.key, setup.model)
        for headers, code in (
            ({}, "missing_api_key"),
            ({"Authorization": "Bearer rotated-away"}, "invalid_api_key"),
            (api.admin_headers, "invalid_api_key"),
            ({"Authorization": f"Bearer {setup.key.secret}"}, "invalid_api_key"),
        ):
            response = api.client.post("/v1/authorizations", json=body, headers=headers)
            assert_error(response, 401, code, param=None)
            response = api.client.delete("/v1/authorizations/auth_x", headers=headers)
            assert_error(response, 401, code, param=None)


def test_the_granted_body(api: Api) -> None:
    setup = prepaid(api, RICH)
    response = authorize(
        api, setup.key, setup.model, request_id="fd025fb80f35", prompt_tokens=1200, max_tokens=1024
    )
    assert response.status_code == 200, response.text
    body = exact_json(response)
    estimate = expected_estimate(1200, 1024, GLM_RATES)
    assert body == {
        "id": body["id"],
        "object": "authorization",
        "status": "active",
        "request_id": "fd025fb80f35",
        "account_id": setup.account,
        "api_key_id": setup.key.id,
        "model": setup.model,
        "max_tokens": 1024,
        "estimate_microcents": estimate,
        "credits_required_cents_estimate": Decimal(estimate) / 10**6,
        "expires_at": "2026-11-29T13:00:00Z",
    }
    assert body["id"].startswith("auth_")
    assert estimate == 26_400 + 347_136
    assert DAY_BEFORE < NOW
