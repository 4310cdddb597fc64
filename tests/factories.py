"""Plain functions that set up data through the real admin API."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
