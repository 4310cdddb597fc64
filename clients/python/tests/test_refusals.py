"""Every error code metering answers → its exception class → the OpenAI and Anthropic renderings.

The table below is docs/api.md's (status, type, code), written out here: the client's own
registry is held equal to it, so a code added to one and not the other fails."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

import metering_client.errors as errors
from metering_client import ERROR_CLASSES, MeteringError, MeteringUnavailable

CODES = [
    (400, "invalid_request_error", "invalid_json_request", "InvalidJsonRequest"),
    (400, "invalid_request_error", "missing_parameter", "MissingParameter"),
    (400, "invalid_request_error", "invalid_parameter", "InvalidParameter"),
    (400, "invalid_request_error", "unsupported_value", "UnsupportedValue"),
    (400, "invalid_request_error", "invalid_timestamp", "InvalidTimestamp"),
    (400, "invalid_request_error", "unaligned_timestamp", "UnalignedTimestamp"),
    (400, "invalid_request_error", "too_many_buckets", "TooManyBuckets"),
    (400, "invalid_request_error", "invalid_window", "InvalidWindow"),
    (400, "invalid_request_error", "context_length_exceeded", "ContextLengthExceeded"),
    (400, "invalid_request_error", "batch_too_large", "BatchTooLarge"),
    (401, "authentication_error", "missing_api_key", "MissingApiKey"),
    (401, "authentication_error", "invalid_api_key", "InvalidApiKey"),
    (402, "insufficient_credits", "insufficient_credits", "InsufficientCredits"),
    (402, "insufficient_credits", "member_spend_limit", "MemberSpendLimit"),
    (402, "insufficient_credits", "project_spend_limit", "ProjectSpendLimit"),
    (403, "permission_error", "model_not_allowed", "ModelNotAllowed"),
    (403, "permission_error", "read_only_token", "ReadOnlyToken"),
    (404, "not_found_error", "not_found", "NotFound"),
    (404, "not_found_error", "model_not_found", "ModelNotFound"),
    (405, "invalid_request_error", "method_not_allowed", "MethodNotAllowed"),
    (409, "conflict_error", "idempotency_conflict", "IdempotencyConflict"),
    (409, "conflict_error", "price_history_immutable", "PriceHistoryImmutable"),
    (409, "conflict_error", "member_exists", "MemberExists"),
    (413, "invalid_request_error", "request_body_too_large", "RequestBodyTooLarge"),
    (429, "rate_limit_error", "concurrency_limit_exceeded", "ConcurrencyLimitExceeded"),
    (500, "api_error", "internal_error", "InternalError"),
    (503, "api_error", "database_unavailable", "DatabaseUnavailable"),
]
# The Messages API's error types, Anthropic's names by status.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
}


def body(status: int, type_: str, code: str, **extra: object) -> dict[str, object]:
    return {
        "error": {
            "message": f"{code} happened",
            "type": type_,
            "param": "model" if status == 403 else ("api_key" if status == 401 else None),
            "code": code,
            **extra,
            "request_id": "0123456789ab",
        }
    }


def test_every_code_of_the_contract_has_its_class() -> None:
    assert {code: cls.__name__ for code, cls in ERROR_CLASSES.items()} == {
        code: name for _, _, code, name in CODES
    }


@pytest.mark.parametrize(("status", "type_", "code", "name"), CODES, ids=[c[2] for c in CODES])
def test_code_to_exception_to_renderings(status: int, type_: str, code: str, name: str) -> None:
    headers = {"retry-after": "1", "ratelimit-reset": "1"} if status == 429 else {}
    error = MeteringError.from_response(status, body(status, type_, code), headers)

    assert type(error) is getattr(errors, name)
    assert (error.status, error.type, error.code) == (status, type_, code)
    assert error.request_id == "0123456789ab"
    assert error.message == f"{code} happened"

    openai = error.to_openai()
    assert openai.status == status
    assert openai.body == {
        "error": {
            "message": f"{code} happened",
            "type": type_,
            # The customer's key came in a header, not a body field named api_key.
            "param": "model" if status == 403 else None,
            "code": code,
            "request_id": "0123456789ab",
        }
    }
    anthropic = error.to_anthropic()
    assert anthropic.status == status
    assert anthropic.body == {
        "type": "error",
        "error": {
            "type": ANTHROPIC_TYPES[status],
            "message": f"{code} happened",
            "code": code,
            "request_id": "0123456789ab",
        },
    }
    expected_headers = {"Retry-After": "1", "RateLimit-Reset": "1"} if status == 429 else {}
    assert openai.headers == anthropic.headers == expected_headers
    assert json.loads(openai.content()) == openai.body


def test_the_fields_of_a_code_are_passed_on_exactly() -> None:
    # As the client parses metering's JSON: decimals exact (json.loads(..., parse_float=Decimal)).
    raw = (
        json.dumps(
            body(
                402,
                "insufficient_credits",
                "insufficient_credits",
                credits_available_cents=Decimal("0.373536"),
                credits_required_cents_estimate=Decimal("22.215884"),
            ),
            default=str,
        )
        .replace('"0.373536"', "0.373536")
        .replace('"22.215884"', "22.215884")
    )
    error = MeteringError.from_response(402, json.loads(raw, parse_float=Decimal))
    assert error.extra == {
        "credits_available_cents": Decimal("0.373536"),
        "credits_required_cents_estimate": Decimal("22.215884"),
    }
    for rendering in (error.to_openai(), error.to_anthropic()):
        text = rendering.content().decode()
        assert '"credits_available_cents":0.373536' in text
        assert '"credits_required_cents_estimate":22.215884' in text


def test_an_amount_a_float_would_round_stays_exact() -> None:
    error = errors.InsufficientCredits(
        "m", extra={"credits_available_cents": Decimal("9000000000000.123456")}
    )
    assert error.to_openai().body["error"]["credits_available_cents"] == "9000000000000.123456"
    error = errors.InsufficientCredits("m", extra={"spent_cents": Decimal("5000")})
    assert error.to_openai().body["error"]["spent_cents"] == 5000


def test_retry_after_is_metering_s_and_one_second_without_it() -> None:
    answer = body(429, "rate_limit_error", "concurrency_limit_exceeded")
    error = MeteringError.from_response(429, answer, {"Retry-After": "7"})
    assert error.retry_after == 7
    assert error.to_openai().headers == {"Retry-After": "7", "RateLimit-Reset": "7"}
    assert MeteringError.from_response(429, answer).to_anthropic().headers["Retry-After"] == "1"


def test_an_unknown_code_is_its_status_s_class_and_keeps_the_code() -> None:
    error = MeteringError.from_response(402, body(402, "insufficient_credits", "team_budget_spent"))
    assert type(error) is errors.InsufficientCreditsError
    assert error.code == "team_budget_spent"
    assert error.to_anthropic().body["error"]["type"] == "billing_error"

    # A known code under an unexpected status: the status decides.
    error = MeteringError.from_response(409, body(409, "conflict_error", "insufficient_credits"))
    assert type(error) is errors.ConflictError
    # A gateway in between that answered without metering's body.
    error = MeteringError.from_response(502, "<html>bad gateway</html>")
    assert isinstance(error, errors.ServerError)
    assert error.status == 502
    assert error.to_openai().status == 502


def test_metering_unavailable_renders_as_the_reference_transient_429() -> None:
    error = MeteringUnavailable("The billing service is temporarily unavailable.", retry_after=1)
    assert error.to_openai().status == 429
    assert error.to_openai().body["error"]["code"] == "auth_backend_unavailable"
    assert error.to_openai().body["error"]["type"] == "rate_limit_error"
    assert error.to_openai().headers == {"Retry-After": "1", "RateLimit-Reset": "1"}
    assert error.to_anthropic().body["error"]["type"] == "rate_limit_error"


def test_a_gateway_may_put_its_own_request_id() -> None:
    error = MeteringError.from_response(404, body(404, "not_found_error", "model_not_found"))
    assert error.to_openai(request_id="gw-1").body["error"]["request_id"] == "gw-1"
    assert error.to_anthropic(request_id="gw-1").body["error"]["request_id"] == "gw-1"
