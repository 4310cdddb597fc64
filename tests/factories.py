"""Plain functions that set up data through the real admin API."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text

from metering.kit.timeutil import format_timestamp
from tests.conftest import Api

# GLM-5.3's published rates: 22 / 339 cents per million, cache reads 17.75 cents per million.
GLM_RATES = (22_000_000, 339_000_000, 17_750_000)


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Key:
    id: str
    secret: str
    account_id: str


def create_account(api: Api, billing: str = "prepaid", name: str | None = None) -> str:
    response = api.admin(
        "POST", "/admin/v1/accounts", json={"name": name or unique("acct"), "billing": billing}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def create_key(api: Api, account_id: str, limit_cents: Any = None, name: str | None = None) -> Key:
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account_id}/api-keys",
        json={"name": name or unique("key"), "monthly_spend_limit_cents": limit_cents},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Key(body["id"], body["key"], account_id)


def put_model(api: Api, model_id: str | None = None, **metadata: Any) -> str:
    model_id = model_id or unique("Model")
    body = {"display_name": model_id, "context_length": 131072, **metadata}
    response = api.admin("PUT", f"/admin/v1/models/{model_id}", json=body)
    assert response.status_code in (200, 201), response.text
    return str(response.json()["id"])


def add_price(
    api: Api, model_id: str, effective_at: datetime, rates: tuple[int, int, int] = GLM_RATES
) -> str:
    """A list price version at ``effective_at``, which may be in the past: the clock is moved
    back to that instant for the call (the admin API refuses past dates)."""
    saved = api.clock.now()
    if effective_at < saved:
        api.clock.set(effective_at)
    try:
        response = api.admin(
            "POST",
            f"/admin/v1/models/{model_id}/prices",
            json={
                "effective_at": format_timestamp(effective_at),
                "input_microcents_per_million": rates[0],
                "output_microcents_per_million": rates[1],
                "cache_read_microcents_per_million": rates[2],
            },
        )
    finally:
        api.clock.set(saved)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def priced_model(
    api: Api,
    effective_at: datetime,
    rates: tuple[int, int, int] = GLM_RATES,
    **metadata: Any,
) -> str:
    model_id = put_model(api, **metadata)
    add_price(api, model_id, effective_at, rates)
    return model_id


REQUEST_ID = re.compile(r"[0-9a-f]{12}")
# docs/api.md#conventions: the HTTP status carries the category, and each status has exactly one
# error type.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_credits",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
}


def assert_error(
    response: Any, status: int, code: str, *, param: str | None = None
) -> dict[str, Any]:
    """The error body with this status, type, code and param, and the matching request id."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code", "request_id"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    assert (error["type"], error["code"], error["param"]) == (ERROR_TYPES[status], code, param), (
        error
    )
    assert REQUEST_ID.fullmatch(error["request_id"]), error
    assert response.headers["x-request-id"] == error["request_id"]
    return dict(error)


def card_of(api: Api, model_id: str, secret: str | None = None) -> dict[str, Any] | None:
    """``model_id``'s card in ``GET /v1/models`` (with an account key if given), or None."""
    if secret is None:
        response = api.client.get("/v1/models")
    else:
        response = api.as_key(secret, "GET", "/v1/models")
    assert response.status_code == 200, response.text
    cards = [card for card in response.json()["data"] if card["id"] == model_id]
    assert len(cards) <= 1
    return cards[0] if cards else None


def usage_object(api: str, prompt: int, cached: int, output: int, reasoning: int) -> dict[str, Any]:
    """A ``usage`` object as ``api`` returns it (the normalisation table of
    docs/api.md#post-v1usageevents read backwards, written by hand, not by the code under test):
    ``prompt`` counts every input token, cache reads included (on ``messages`` too: its
    ``input_tokens`` already includes them), ``output`` counts reasoning (not reported by
    ``messages``)."""
    if api == "chat_completions":
        return {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }
    if api == "responses":
        return {
            "input_tokens": prompt,
            "output_tokens": output,
            "total_tokens": prompt + output,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens_details": {"reasoning_tokens": reasoning},
        }
    assert api == "messages", api
    return {
        "input_tokens": prompt,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def chat_usage(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """A Chat Completions ``usage`` object as the API returns it."""
    return usage_object("chat_completions", prompt, cached, completion, reasoning)


def usage_event(
    key: Key,
    model: str,
    occurred_at: datetime,
    usage: dict[str, Any] | None = None,
    *,
    request_id: str | None = None,
    api: str = "chat_completions",
    outcome: str = "completed",
    **extra: Any,
) -> dict[str, Any]:
    """One event of ``POST /v1/usage/events`` (chat usage of 1000 prompt / 100 output tokens
    unless ``usage`` is given)."""
    return {
        "request_id": request_id or secrets.token_hex(6),
        "api_key_id": key.id,
        "model": model,
        "api": api,
        "usage": usage if usage is not None else chat_usage(1000, 100),
        "occurred_at": format_timestamp(occurred_at),
        "outcome": outcome,
        **extra,
    }


def ingest(api: Api, *events: dict[str, Any]) -> dict[str, Any]:
    """Send events to ``POST /v1/usage/events`` as the gateway; the 200 body."""
    response = api.gateway("POST", "/v1/usage/events", json={"events": list(events)})
    assert response.status_code == 200, response.text
    return dict(response.json())


def exact_json(response: Any) -> Any:
    """A response body with its decimal numbers as Decimal (money is never compared as float)."""
    import json
    from decimal import Decimal

    return json.loads(response.text, parse_float=Decimal)


def grant(
    api: Api, account_id: str, amount_cents: Any, idempotency_key: str | None = None
) -> dict[str, Any]:
    """Prepaid credit through ``POST /admin/v1/accounts/{id}/grants``; the new credit grant.
    ``amount_cents`` may be a Decimal: it is sent as an exact JSON number."""
    import json
    from decimal import Decimal

    amount = (
        format(amount_cents, "f") if isinstance(amount_cents, Decimal) else json.dumps(amount_cents)
    )
    key = json.dumps(idempotency_key or unique("grant"))
    response = api.client.post(
        f"/admin/v1/accounts/{account_id}/grants",
        content=f'{{"amount_cents": {amount}, "idempotency_key": {key}}}',
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    return dict(exact_json(response))


def authorization_request(key: Key, model: str, /, **fields: Any) -> dict[str, Any]:
    """A ``POST /v1/authorizations`` body (chat, 1000 prompt tokens, max_tokens 100 unless
    given); pass ``max_tokens=None`` to omit it."""
    body: dict[str, Any] = {
        "api_key": key.secret,
        "request_id": secrets.token_hex(6),
        "model": model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "max_tokens": 100,
        **fields,
    }
    return {name: value for name, value in body.items() if value is not None}


def authorize(api: Api, key: Key, model: str, /, **fields: Any) -> Any:
    """``POST /v1/authorizations`` as the gateway; the response (any status)."""
    return api.gateway(
        "POST", "/v1/authorizations", json=authorization_request(key, model, **fields)
    )


def credits_of(api: Api, key: Key) -> dict[str, Any]:
    """``GET /v1/credits`` with the key; the body with exact decimals."""
    response = api.as_key(key.secret, "GET", "/v1/credits")
    assert response.status_code == 200, response.text
    return dict(exact_json(response))


def expect(response: Any, status: int) -> Any:
    """``response`` must have this status (a call whose answer a test otherwise ignores: a
    5xx there must fail the test too); its JSON body."""
    assert response.status_code == status, response.text
    return response.json()


def counted_by(api: Api, metric: str, label: str, values: tuple[str, ...]) -> dict[str, int]:
    """A counter of ``/metrics`` by one label's values (0 for a value not yet counted)."""
    counts = dict.fromkeys(values, 0)
    for line in api.client.get("/metrics").text.splitlines():
        for value in values:
            if line.startswith(f'{metric}{{{label}="{value}"}} '):
                counts[value] = int(float(line.rpartition(" ")[2]))
    return counts


def change_in_database(api: Api, sql: str, **params: Any) -> None:
    """A change made straight in the database, as another process or an operator's SQL would:
    nothing in the API process hears of it."""
    with api.database.unit_of_work() as session:
        session.execute(text(sql), params)
        session.commit()
