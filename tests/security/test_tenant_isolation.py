"""Tenant isolation sweep, on both backends: one account's key, armed with everything it could
learn or guess about another account (its id, key ids, key prefixes, request ids, hold ids,
model and override), on every route of the service.

* The routes an account key may call (``/v1/usage``, ``/v1/credits``, ``/v1/models``,
  ``/v1/api-keys``) take no
  account id: whatever is put in their parameters, they answer for the caller's own account
  (200) or refuse the parameter (400); nothing of the other account ever appears.
* Every other route (admin and gateway) answers an account key with 401, whatever it names.
* Afterwards the other account reads exactly as before, through its own key and the admin API.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest

from metering.payments import endpoints as payment_endpoints
from tests.conftest import NOW, Api
from tests.factories import (
    Key,
    assert_error,
    authorization_request,
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    usage_event,
)
from tests.security.helpers import assert_books_reconcile, assert_contract_response

ACCOUNT_KEY_ROUTES = {
    ("GET", "/v1/usage"),
    ("GET", "/v1/credits"),
    ("GET", "/v1/models"),
    ("GET", "/v1/api-keys"),
    ("GET", "/v1/projects"),
    ("GET", "/v1/members"),
    ("GET", "/v1/requests/{request_id}"),
    # The account's webhook endpoints (tests/notifications/test_endpoints.py: one account's key
    # never sees or changes another's).
    ("POST", "/v1/webhook-endpoints"),
    ("GET", "/v1/webhook-endpoints"),
    ("GET", "/v1/webhook-endpoints/{endpoint_id}"),
    ("PATCH", "/v1/webhook-endpoints/{endpoint_id}"),
    ("DELETE", "/v1/webhook-endpoints/{endpoint_id}"),
    ("POST", "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
    ("POST", "/v1/webhook-endpoints/{endpoint_id}/test"),
    ("GET", "/v1/webhook-endpoints/{endpoint_id}/deliveries"),
}
PUBLIC_ROUTES = {"/healthz", "/readyz", "/metrics"}
# Payments are off in these apps (no Stripe key): their routes are unknown paths here (404), and
# tests/payments holds them with payments on (an account key there: 401 on every admin route).
PAYMENT_ROUTES = {
    (method, route.path)
    for router in (payment_endpoints.router, payment_endpoints.admin_router)
    for route in router.routes
    for method in getattr(route, "methods", ())
}


@dataclass
class Tenant:
    account: str
    keys: list[Key]
    model: str
    request_id: str
    hold_id: str
    key_names: list[str]
    grant_id: str


def make_tenant(api: Api, *, override: bool) -> Tenant:
    account = create_account(api)
    names = [f"secret-name-{account[-6:]}-{i}" for i in range(2)]
    keys = [create_key(api, account, name=name, limit_cents=500) for name in names]
    granted = grant(api, account, 1000)
    model = priced_model(api, NOW - timedelta(days=10))
    if override:
        response = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/rates",
            json={
                "model": model,
                "effective_at": "2026-11-29T12:00:00Z",
                "input_microcents_per_million": 1_234_567,
                "output_microcents_per_million": 7_654_321,
                "cache_read_microcents_per_million": 111_111,
            },
        )
        assert response.status_code == 201, response.text
    event = usage_event(keys[0], model, NOW - timedelta(hours=2), chat_usage(4321, 123))
    ingest(api, event, usage_event(keys[1], "Not-A-Model", NOW - timedelta(hours=1)))
    hold = api.gateway("POST", "/v1/authorizations", json=authorization_request(keys[1], model))
    assert hold.status_code == 200, hold.text
    return Tenant(
        account, keys, model, event["request_id"], hold.json()["id"], names, granted["id"]
    )


def snapshot(api: Api, tenant: Tenant) -> dict[str, Any]:
    """Everything that can be read about ``tenant``, by its operator and by its own key."""
    account, key = tenant.account, tenant.keys[0]
    reads = {
        "account": api.admin("GET", f"/admin/v1/accounts/{account}"),
        "keys": api.admin("GET", f"/admin/v1/accounts/{account}/api-keys"),
        "ledger": api.admin("GET", f"/admin/v1/accounts/{account}/ledger"),
        "credits": api.admin("GET", f"/admin/v1/accounts/{account}/credits"),
        "grants": api.admin("GET", f"/admin/v1/accounts/{account}/grants"),
        "holds": api.admin("GET", f"/admin/v1/authorizations?account_id={account}"),
        "quarantine": api.admin("GET", f"/admin/v1/quarantine?account_id={account}"),
        "event": api.admin(
            "GET", f"/admin/v1/usage/events/{tenant.request_id}?account_id={account}"
        ),
        "own credits": api.as_key(key.secret, "GET", "/v1/credits"),
        "own models": api.as_key(key.secret, "GET", "/v1/models"),
        "own api keys": api.as_key(key.secret, "GET", "/v1/api-keys"),
        "own usage": api.as_key(key.secret, "GET", "/v1/usage?starting_at=2026-11-20"),
        "own usage by key": api.as_key(
            key.secret, "GET", "/v1/usage?starting_at=2026-11-20&group_by=api_key"
        ),
    }
    for name, response in reads.items():
        assert response.status_code == 200, (name, response.text)
    return {name: response.json() for name, response in reads.items()}


@pytest.fixture
def tenants(api: Api) -> tuple[Tenant, Tenant]:
    return make_tenant(api, override=True), make_tenant(api, override=False)


def routes(api: Api) -> list[tuple[str, str]]:
    paths = api.client.get("/openapi.json").json()["paths"]
    return sorted(
        (method.upper(), path)
        for path, operations in paths.items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    )


def fill(path: str, victim: Tenant) -> str:
    values = {
        "account_id": victim.account,
        "key_id": victim.keys[0].id,
        "model_id": victim.model,
        "authorization_id": victim.hold_id,
        "request_id": victim.request_id,
        "grant_id": victim.grant_id,
        "endpoint_id": "whep_victim",
        "event_id": "evt_victim",
        "project_id": "proj_" + victim.account.removeprefix("acct_"),
        "member_id": "mem_victim",
        "payment_id": "pay_victim",
    }
    for name, value in values.items():
        path = path.replace("{" + name + "}", quote(value, safe=""))
    assert "{" not in path, path
    return path


def body_for(method: str, path: str, victim: Tenant) -> dict[str, Any] | None:
    """A plausible body that names the victim (what the caller hopes to change)."""
    if method in ("GET", "DELETE"):
        return None
    bodies: dict[str, dict[str, Any]] = {
        "/grants": {"amount_cents": 1_000_000, "idempotency_key": "steal"},
        "/adjustments": {"amount_cents": -1000, "idempotency_key": "steal", "reason": "x"},
        "/api-keys": {"name": "mine now"},
        "/rates": {
            "model": victim.model,
            "effective_at": "2026-11-29T12:00:00Z",
            "input_microcents_per_million": 0,
            "output_microcents_per_million": 0,
            "cache_read_microcents_per_million": 0,
        },
        "/prices": {
            "effective_at": "2026-11-29T12:00:00Z",
            "input_microcents_per_million": 0,
            "output_microcents_per_million": 0,
            "cache_read_microcents_per_million": 0,
        },
        "/v1/authorizations": {
            "api_key": victim.keys[0].id,
            "model": victim.model,
            "api": "chat_completions",
            "prompt_tokens": 1,
        },
        "/v1/usage/events": {
            "events": [usage_event(victim.keys[0], victim.model, NOW, chat_usage(10**6, 10**6))]
        },
        "/reprocess": {},
        "/accounts": {"name": victim.account},
    }
    for suffix, body in bodies.items():
        if path.endswith(suffix):
            return body
    if method in ("PUT", "PATCH"):
        return {"name": "renamed", "display_name": "x", "context_length": 1}
    return {}


def assert_reveals_nothing(response: Any, victim: Tenant) -> None:
    text = response.text
    for secret in (
        victim.account,
        *(key.id for key in victim.keys),
        *(key.secret[:12] for key in victim.keys),
        *victim.key_names,
        victim.request_id,
        victim.hold_id,
        "1234567",  # the victim's override input rate
        "7654321",
    ):
        assert secret not in text, (secret, response.request.url, text[:300])


class TestAccountKeyRoutes:
    def test_the_other_accounts_ids_in_every_parameter(
        self, api: Api, tenants: tuple[Tenant, Tenant]
    ) -> None:
        victim, attacker = tenants
        before = snapshot(api, victim)
        mine = snapshot(api, attacker)
        secret = attacker.keys[0].secret
        ids = [victim.account, victim.keys[0].id, victim.keys[1].id, victim.model]
        queries = [
            f"{name}={quote(value)}" for name in ("account_id", "api_key_id") for value in ids
        ]
        usage_queries = [
            *(f"starting_at=2026-11-20&{q}" for q in queries),
            *(f"starting_at=2026-11-20&api_key_ids={quote(k.id)}" for k in victim.keys),
            f"starting_at=2026-11-20&models={quote(victim.model)}",
            f"starting_at=2026-11-20&group_by=api_key&api_key_ids={victim.keys[0].id}",
            f"starting_at=2026-11-20&group_by=api_key&format=csv&models={victim.model}",
            f"starting_at=2026-11-20&models={victim.model}&models={attacker.model}",
        ]
        for query in usage_queries:
            response = api.as_key(secret, "GET", f"/v1/usage?{query}")
            assert_contract_response(response)
            assert response.status_code in (200, 400), response.text
            assert_reveals_nothing(response, victim)
            if response.status_code == 200 and "format=csv" not in query:
                body = response.json()
                # Only the caller's own usage: its model, or nothing.
                own = mine["own usage"]["totals"]["requests"]
                assert body["totals"]["requests"] in (0, own), body["totals"]
        for path in ("/v1/credits", "/v1/models"):
            for query in ["", *queries]:
                response = api.as_key(secret, "GET", f"{path}?{query}")
                assert_contract_response(response)
                assert response.status_code == 200, response.text
                assert_reveals_nothing(response, victim)
                expected = mine["own credits"] if path == "/v1/credits" else mine["own models"]
                assert response.json() == expected  # the caller's own view, unchanged
        for query in ["", *queries]:
            response = api.as_key(secret, "GET", f"/v1/api-keys?{query}")
            assert_contract_response(response)
            assert response.status_code in (200, 400), response.text
            assert_reveals_nothing(response, victim)
            if response.status_code == 200:
                assert response.json() == mine["own api keys"]
        assert snapshot(api, victim) == before
        assert_books_reconcile(api)

    @pytest.mark.parametrize(
        "headers",
        [
            pytest.param(lambda v, a: {"x-api-key": v.keys[0].id}, id="key id as secret"),
            pytest.param(
                lambda v, a: {"Authorization": f"Bearer {v.keys[0].secret[:10]}"}, id="prefix"
            ),
            pytest.param(
                lambda v, a: {"Authorization": f"Bearer {v.keys[0].secret[:-1]}"}, id="truncated"
            ),
            pytest.param(
                lambda v, a: {"Authorization": f"Bearer {v.keys[0].secret.upper()}"},
                id="case-folded",
            ),
            pytest.param(lambda v, a: {"Authorization": f"Bearer {v.account}"}, id="account id"),
        ],
    )
    def test_what_one_knows_of_another_key_is_no_credential(
        self, api: Api, tenants: tuple[Tenant, Tenant], headers: Any
    ) -> None:
        victim, attacker = tenants
        paths = ("/v1/credits", "/v1/usage?starting_at=2026-11-20", "/v1/models", "/v1/api-keys")
        for path in paths:
            response = api.client.get(path, headers=headers(victim, attacker))
            assert_error(response, 401, "invalid_api_key")

    def test_the_callers_own_credential_wins_over_a_second_header(
        self, api: Api, tenants: tuple[Tenant, Tenant]
    ) -> None:
        victim, attacker = tenants
        mine = snapshot(api, attacker)["own credits"]
        response = api.client.get(
            "/v1/credits",
            headers={
                "Authorization": f"Bearer {attacker.keys[0].secret}",
                "x-api-key": victim.keys[0].secret,
            },
        )
        assert response.json() == mine


class TestEveryOtherRoute:
    def test_an_account_key_is_401_on_every_admin_and_gateway_route(
        self, api: Api, tenants: tuple[Tenant, Tenant]
    ) -> None:
        victim, attacker = tenants
        before = snapshot(api, victim)
        checked = []
        for method, template in routes(api):
            if (method, template) in ACCOUNT_KEY_ROUTES or template in PUBLIC_ROUTES:
                continue
            path = fill(template, victim)
            if (method, template) in PAYMENT_ROUTES:
                value = f"Bearer {attacker.keys[0].secret}"
                off = api.client.request(method, path, headers={"Authorization": value})
                assert_error(off, 404, "not_found")
                continue
            for header in ("Authorization", "x-api-key"):
                value = attacker.keys[0].secret
                if header == "Authorization":
                    value = f"Bearer {value}"
                response = api.client.request(
                    method, path, headers={header: value}, json=body_for(method, template, victim)
                )
                assert_contract_response(response)
                assert response.status_code == 401, (method, path, header, response.text)
                assert response.json()["error"]["param"] is None
                assert_reveals_nothing(response, victim)
            checked.append((method, template))
        # Every admin route and the gateway's three were swept.
        assert len([c for c in checked if c[1].startswith("/admin/v1/")]) >= 20
        assert {
            ("POST", "/v1/authorizations"),
            ("DELETE", "/v1/authorizations/{authorization_id}"),
            ("POST", "/v1/usage/events"),
        } <= set(checked)
        assert snapshot(api, victim) == before
        assert_books_reconcile(api)

    def test_the_public_routes_reveal_no_account(
        self, api: Api, tenants: tuple[Tenant, Tenant]
    ) -> None:
        victim, attacker = tenants
        for path in sorted(PUBLIC_ROUTES):
            response = api.as_key(attacker.keys[0].secret, "GET", path)
            assert response.status_code == 200, response.text
            assert_reveals_nothing(response, victim)
