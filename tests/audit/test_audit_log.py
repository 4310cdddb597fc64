"""The audit log (docs/api.md#get-adminv1audit-events): every admin mutation writes exactly one
event, in its own transaction (a change rolled back leaves none), replays and no-ops write nothing,
secrets are redacted, and the log is append-only. The list of mutations is the app's own routes, so
a new admin route without a case here fails the test."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from metering.audit.service import ACTIONS
from metering.cli import main
from metering.models import Account, AuditEvent
from metering.payments import endpoints as payment_endpoints
from metering.web.routes import http_routes
from tests.conftest import ADMIN_TOKEN, NOW, Api, migrated_database, running_api
from tests.factories import (
    Key,
    assert_error,
    create_account,
    create_key,
    grant,
    ingest,
    put_model,
    unique,
    usage_event,
)
from tests.test_catalog_api import price_body
from tests.web.test_operator_tokens import sha8

ACTOR = sha8(ADMIN_TOKEN)


def audit_count(api: Api) -> int:
    with api.database.unit_of_work() as session:
        return int(session.execute(select(func.count()).select_from(AuditEvent)).scalar_one())


def newest(api: Api, **filters: Any) -> list[dict[str, Any]]:
    response = api.admin("GET", "/admin/v1/audit-events", params=filters)
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


@dataclass
class World:
    account: str
    key: Key
    model: str
    endpoint: str  # a webhook endpoint of the account
    event: str  # a webhook.test event sent to it
    member: str  # a member of the account
    project: str  # a project of the account (not its Default one, which is never archived)


# A public address (TEST-NET-3): saved without resolving anything.
HOOK_URL = "https://11.22.33.44/hook"


@pytest.fixture
def world(api: Api) -> World:
    account = create_account(api)
    key = create_key(api, account)
    endpoint = api.admin(
        "POST",
        "/admin/v1/webhook-endpoints",
        json={"url": HOOK_URL, "event_types": ["webhook.test"], "account_id": account},
    )
    assert endpoint.status_code == 201, endpoint.text
    endpoint_id = endpoint.json()["id"]
    event = api.admin("POST", f"/admin/v1/webhook-endpoints/{endpoint_id}/test")
    assert event.status_code == 200, event.text
    member = api.admin(
        "POST", f"/admin/v1/accounts/{account}/members", json={"email": f"{unique('m')}@x.io"}
    )
    assert member.status_code == 201, member.text
    project = api.admin("POST", f"/admin/v1/accounts/{account}/projects", json={"name": "w"})
    assert project.status_code == 201, project.text
    return World(
        account,
        key,
        put_model(api),
        endpoint_id,
        event.json()["id"],
        member.json()["id"],
        project.json()["id"],
    )


@dataclass(frozen=True)
class Mutation:
    action: str
    send: Callable[[Api, World], Any]
    account: bool  # whether the event names the world's account
    target_type: str


def _reprocess(api: Api, world: World) -> Any:
    ingest(api, usage_event(world.key, unique("Unknown"), NOW - timedelta(hours=1)))
    entries = api.admin("GET", "/admin/v1/quarantine", params={"account_id": world.account})
    ids = [entry["id"] for entry in entries.json()["data"]]
    return api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ids})


def _void(api: Api, world: World) -> Any:
    """A grant made without the API (so only the void is audited), then voided."""
    from metering.ledger.service import add_entry

    with api.database.unit_of_work() as session:
        grant, _ = add_entry(session, world.account, "grant", 10**6, unique("v"), None, NOW)
        session.commit()
    return api.admin("POST", f"/admin/v1/grants/{grant['id']}/void", json={"reason": "fraud"})


MUTATIONS: dict[tuple[str, str], Mutation] = {
    ("POST", "/admin/v1/accounts"): Mutation(
        "account.create",
        lambda api, w: api.admin("POST", "/admin/v1/accounts", json={"name": unique("a")}),
        False,
        "account",
    ),
    ("PATCH", "/admin/v1/accounts/{account_id}"): Mutation(
        "account.update",
        lambda api, w: api.admin(
            "PATCH", f"/admin/v1/accounts/{w.account}", json={"max_concurrent_requests": 10}
        ),
        True,
        "account",
    ),
    ("PUT", "/admin/v1/accounts/{account_id}/model-access"): Mutation(
        "model_access.update",
        lambda api, w: api.admin(
            "PUT", f"/admin/v1/accounts/{w.account}/model-access", json={"models": [w.model]}
        ),
        True,
        "account",
    ),
    ("POST", "/admin/v1/accounts/{account_id}/api-keys"): Mutation(
        "api_key.create",
        lambda api, w: api.admin(
            "POST", f"/admin/v1/accounts/{w.account}/api-keys", json={"name": "k"}
        ),
        True,
        "api_key",
    ),
    ("PATCH", "/admin/v1/api-keys/{key_id}"): Mutation(
        "api_key.update",
        lambda api, w: api.admin(
            "PATCH", f"/admin/v1/api-keys/{w.key.id}", json={"monthly_spend_limit_cents": 12.5}
        ),
        True,
        "api_key",
    ),
    ("DELETE", "/admin/v1/api-keys/{key_id}"): Mutation(
        "api_key.revoke",
        lambda api, w: api.admin("DELETE", f"/admin/v1/api-keys/{w.key.id}"),
        True,
        "api_key",
    ),
    ("POST", "/admin/v1/accounts/{account_id}/projects"): Mutation(
        "project.create",
        lambda api, w: api.admin(
            "POST", f"/admin/v1/accounts/{w.account}/projects", json={"name": "p"}
        ),
        True,
        "project",
    ),
    ("PATCH", "/admin/v1/projects/{project_id}"): Mutation(
        "project.update",
        lambda api, w: api.admin("PATCH", f"/admin/v1/projects/{w.project}", json={"name": "q"}),
        True,
        "project",
    ),
    ("DELETE", "/admin/v1/projects/{project_id}"): Mutation(
        "project.archive",
        lambda api, w: api.admin("DELETE", f"/admin/v1/projects/{w.project}"),
        True,
        "project",
    ),
    ("POST", "/admin/v1/accounts/{account_id}/members"): Mutation(
        "member.create",
        lambda api, w: api.admin(
            "POST", f"/admin/v1/accounts/{w.account}/members", json={"email": "new@x.io"}
        ),
        True,
        "member",
    ),
    ("PATCH", "/admin/v1/members/{member_id}"): Mutation(
        "member.update",
        lambda api, w: api.admin("PATCH", f"/admin/v1/members/{w.member}", json={"role": "admin"}),
        True,
        "member",
    ),
    ("DELETE", "/admin/v1/members/{member_id}"): Mutation(
        "member.remove",
        lambda api, w: api.admin("DELETE", f"/admin/v1/members/{w.member}"),
        True,
        "member",
    ),
    ("POST", "/admin/v1/accounts/{account_id}/grants"): Mutation(
        "grant.create",
        lambda api, w: api.admin(
            "POST",
            f"/admin/v1/accounts/{w.account}/grants",
            json={"amount_cents": 500, "idempotency_key": "g1"},
        ),
        True,
        "credit_grant",
    ),
    ("POST", "/admin/v1/grants/{grant_id}/void"): Mutation(
        "grant.void", lambda api, w: _void(api, w), True, "credit_grant"
    ),
    ("POST", "/admin/v1/accounts/{account_id}/adjustments"): Mutation(
        "adjustment.create",
        lambda api, w: api.admin(
            "POST",
            f"/admin/v1/accounts/{w.account}/adjustments",
            json={"amount_cents": -5, "idempotency_key": "a1", "reason": "refund"},
        ),
        True,
        "ledger_entry",
    ),
    ("PUT", "/admin/v1/models/{model_id}"): Mutation(
        "model.update",
        lambda api, w: api.admin(
            "PUT",
            f"/admin/v1/models/{w.model}",
            json={"display_name": "Renamed", "context_length": 4096},
        ),
        False,
        "model",
    ),
    ("POST", "/admin/v1/models/{model_id}/prices"): Mutation(
        "price.create",
        lambda api, w: api.admin(
            "POST", f"/admin/v1/models/{w.model}/prices", json=price_body(NOW + timedelta(hours=1))
        ),
        False,
        "price_version",
    ),
    ("POST", "/admin/v1/accounts/{account_id}/rates"): Mutation(
        "account_rate.create",
        lambda api, w: api.admin(
            "POST",
            f"/admin/v1/accounts/{w.account}/rates",
            json={"model": w.model, **price_body(NOW + timedelta(hours=1))},
        ),
        True,
        "account_rate",
    ),
    ("POST", "/admin/v1/quarantine/reprocess"): Mutation(
        "quarantine.reprocess", _reprocess, False, "quarantine"
    ),
    ("POST", "/admin/v1/accounts/{account_id}/portal-sessions"): Mutation(
        "portal_session.create",
        lambda api, w: api.admin("POST", f"/admin/v1/accounts/{w.account}/portal-sessions"),
        True,
        "account",
    ),
    ("POST", "/admin/v1/webhook-endpoints"): Mutation(
        "webhook_endpoint.create",
        lambda api, w: api.admin(
            "POST",
            "/admin/v1/webhook-endpoints",
            json={"url": HOOK_URL, "event_types": ["webhook.test"], "account_id": w.account},
        ),
        True,
        "webhook_endpoint",
    ),
    ("PATCH", "/admin/v1/webhook-endpoints/{endpoint_id}"): Mutation(
        "webhook_endpoint.update",
        lambda api, w: api.admin(
            "PATCH", f"/admin/v1/webhook-endpoints/{w.endpoint}", json={"enabled": False}
        ),
        True,
        "webhook_endpoint",
    ),
    ("DELETE", "/admin/v1/webhook-endpoints/{endpoint_id}"): Mutation(
        "webhook_endpoint.delete",
        lambda api, w: api.admin("DELETE", f"/admin/v1/webhook-endpoints/{w.endpoint}"),
        True,
        "webhook_endpoint",
    ),
    ("POST", "/admin/v1/webhook-endpoints/{endpoint_id}/rotate-secret"): Mutation(
        "webhook_endpoint.rotate",
        lambda api, w: api.admin("POST", f"/admin/v1/webhook-endpoints/{w.endpoint}/rotate-secret"),
        True,
        "webhook_endpoint",
    ),
    ("POST", "/admin/v1/webhook-endpoints/{endpoint_id}/test"): Mutation(
        "webhook_endpoint.test",
        lambda api, w: api.admin("POST", f"/admin/v1/webhook-endpoints/{w.endpoint}/test"),
        True,
        "webhook_event",
    ),
    ("POST", "/admin/v1/webhook-events/{event_id}/resend"): Mutation(
        "webhook_event.resend",
        lambda api, w: api.admin("POST", f"/admin/v1/webhook-events/{w.event}/resend", json={}),
        True,
        "webhook_event",
    ),
}


# Payments are off in this app (no Stripe key: 404), so their admin routes are unknown paths
# here; tests/payments holds their audit with payments on (a top-up's payment.create and
# payment.succeed or payment.fail: test_saved_cards.py; auto_recharge.update:
# test_auto_recharge.py).
WITH_PAYMENTS_ON = {
    (method, route.path)
    for route in payment_endpoints.admin_router.routes
    for method in getattr(route, "methods", ())
    if method not in ("GET", "HEAD")
}


def test_every_admin_mutation_has_a_case(api: Api) -> None:
    routes = {
        (method, route.path)
        for route in http_routes(api.client.app)  # type: ignore[arg-type]
        if route.path.startswith("/admin/v1/")
        for method in route.methods
        if method not in ("GET", "HEAD")
    }
    assert routes - WITH_PAYMENTS_ON == set(MUTATIONS)
    assert {m.action for m in MUTATIONS.values()} <= set(ACTIONS)


@pytest.mark.parametrize("route", sorted(MUTATIONS), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_admin_mutation_writes_exactly_one_event(
    api: Api, world: World, route: tuple[str, str]
) -> None:
    mutation = MUTATIONS[route]
    before = audit_count(api)
    response = mutation.send(api, world)
    assert response.status_code in (200, 201), response.text
    assert audit_count(api) == before + 1
    (event,) = newest(api, limit=1)
    assert event["object"] == "audit_event" and event["id"].startswith("aud_")
    assert (event["action"], event["actor"], event["target_type"]) == (
        mutation.action,
        ACTOR,
        mutation.target_type,
    )
    assert event["request_id"] == response.headers["x-request-id"]
    assert event["at"] == "2026-11-29T12:00:00Z"
    assert event["account_id"] == (world.account if mutation.account else None) or (
        mutation.action == "account.create" and event["account_id"] == response.json()["id"]
    )
    if "id" in response.json():
        assert event["target_id"] == str(response.json()["id"])
    assert isinstance(event["changes"], dict) and event["changes"]


def _as_key(method: str, path: str, body: Any = None) -> Callable[[Api, World], Any]:
    def send(api: Api, w: World) -> Any:
        extra = {} if body is None else {"json": body}
        return api.as_key(w.key.secret, method, path.format(endpoint_id=w.endpoint), **extra)

    return send


TEST_ONLY = ["webhook.test"]
# An account key's changes to its webhook endpoints (audited like the operators', as the key).
KEY_MUTATIONS: dict[tuple[str, str], Mutation] = {
    ("POST", "/v1/webhook-endpoints"): Mutation(
        "webhook_endpoint.create",
        _as_key("POST", "/v1/webhook-endpoints", {"url": HOOK_URL, "event_types": TEST_ONLY}),
        True,
        "webhook_endpoint",
    ),
    ("PATCH", "/v1/webhook-endpoints/{endpoint_id}"): Mutation(
        "webhook_endpoint.update",
        _as_key("PATCH", "/v1/webhook-endpoints/{endpoint_id}", {"enabled": False}),
        True,
        "webhook_endpoint",
    ),
    ("DELETE", "/v1/webhook-endpoints/{endpoint_id}"): Mutation(
        "webhook_endpoint.delete",
        _as_key("DELETE", "/v1/webhook-endpoints/{endpoint_id}"),
        True,
        "webhook_endpoint",
    ),
    ("POST", "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"): Mutation(
        "webhook_endpoint.rotate",
        _as_key("POST", "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
        True,
        "webhook_endpoint",
    ),
    ("POST", "/v1/webhook-endpoints/{endpoint_id}/test"): Mutation(
        "webhook_endpoint.test",
        _as_key("POST", "/v1/webhook-endpoints/{endpoint_id}/test"),
        True,
        "webhook_event",
    ),
}


def test_every_account_key_mutation_of_webhook_endpoints_has_a_case(api: Api) -> None:
    routes = {
        (method, route.path)
        for route in http_routes(api.client.app)  # type: ignore[arg-type]
        if route.path.startswith("/v1/webhook-endpoints")
        for method in route.methods
        if method not in ("GET", "HEAD")
    }
    assert routes == set(KEY_MUTATIONS)


@pytest.mark.parametrize("route", sorted(KEY_MUTATIONS), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_account_key_mutation_writes_exactly_one_event_as_the_key(
    api: Api, world: World, route: tuple[str, str]
) -> None:
    mutation = KEY_MUTATIONS[route]
    before = audit_count(api)
    response = mutation.send(api, world)
    assert response.status_code in (200, 201), response.text
    assert audit_count(api) == before + 1
    (event,) = newest(api, limit=1)
    assert (event["action"], event["actor"], event["target_type"]) == (
        mutation.action,
        world.key.id,
        mutation.target_type,
    )
    assert event["account_id"] == world.account
    assert event["request_id"] == response.headers["x-request-id"]
    assert "whsec_" not in json.dumps(event)
    if mutation.target_type == "webhook_endpoint":
        assert event["target_id"] == str(response.json()["id"])
    # A change that changes nothing records nothing.
    if route[0] == "PATCH":
        assert mutation.send(api, world).status_code == 200
        assert audit_count(api) == before + 1


class TestNothingChangedNothingWritten:
    def test_replays_and_no_ops(self, api: Api, world: World) -> None:
        grants = f"/admin/v1/accounts/{world.account}/grants"
        adjustments = f"/admin/v1/accounts/{world.account}/adjustments"
        body = {"amount_cents": 5, "idempotency_key": "same"}
        assert api.admin("POST", grants, json=body).status_code == 201
        fix = {"amount_cents": -1, "idempotency_key": "fix", "reason": "r"}
        assert api.admin("POST", adjustments, json=fix).status_code == 201
        model = {"display_name": "D", "context_length": 4096, "deprecation_date": "2030-01-01"}
        assert api.admin("PUT", f"/admin/v1/models/{world.model}", json=model).status_code == 200
        assert api.admin("DELETE", f"/admin/v1/api-keys/{world.key.id}").status_code == 200
        before = audit_count(api)
        assert api.admin("POST", grants, json=body).status_code == 200  # a replay
        assert api.admin("POST", adjustments, json=fix).status_code == 200
        assert api.admin("PUT", f"/admin/v1/models/{world.model}", json=model).status_code == 200
        assert api.admin("DELETE", f"/admin/v1/api-keys/{world.key.id}").status_code == 200
        name = api.admin("GET", f"/admin/v1/accounts/{world.account}/api-keys").json()["data"]
        same = {"name": name[0]["name"], "monthly_spend_limit_cents": None}
        assert api.admin("PATCH", f"/admin/v1/api-keys/{world.key.id}", json=same).status_code == (
            200
        )
        assert api.admin("PATCH", f"/admin/v1/api-keys/{world.key.id}", json={}).status_code == 200
        nothing = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": [2**40]})
        assert nothing.json()["data"] == []
        assert audit_count(api) == before

    def test_refusals(self, api: Api, world: World) -> None:
        before = audit_count(api)
        assert_error(
            api.admin(
                "POST",
                f"/admin/v1/models/{world.model}/prices",
                json=price_body(NOW - timedelta(1)),
            ),
            409,
            "price_history_immutable",
            param="effective_at",
        )
        grants = f"/admin/v1/accounts/{world.account}/grants"
        first = api.admin("POST", grants, json={"amount_cents": 1, "idempotency_key": "x"})
        assert first.status_code == 201, first.text
        assert first.json()["account_id"] == world.account, first.text
        conflict = api.admin("POST", grants, json={"amount_cents": 2, "idempotency_key": "x"})
        assert_error(conflict, 409, "idempotency_conflict", param="idempotency_key")
        assert_error(
            api.admin(
                "POST",
                "/admin/v1/accounts/acct_nope/grants",
                json={"amount_cents": 1, "idempotency_key": "y"},
            ),
            404,
            "not_found",
            param="account_id",
        )
        assert audit_count(api) == before + 1  # the one grant that was made


class TestSameTransaction:
    """A request that fails after its change (and its audit event) were written rolls both
    back: the change is not there, and neither is its event."""

    def test_a_failure_after_the_change_rolls_back_the_event(
        self, api: Api, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from metering.accounts import service

        def broken(_account: Any) -> dict[str, Any]:
            raise RuntimeError("failed after the change")

        monkeypatch.setattr(service, "account_body", broken)
        name = unique("rolled-back")
        before = audit_count(api)
        response = api.admin("POST", "/admin/v1/accounts", json={"name": name})
        assert_error(response, 500, "internal_error")
        assert audit_count(api) == before
        with api.database.unit_of_work() as session:
            found = session.execute(select(Account.id).where(Account.name == name)).first()
        assert found is None

    def test_a_failed_model_put_leaves_no_event(
        self, api: Api, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from metering.catalog import service

        def broken(_model: Any) -> dict[str, Any]:
            raise RuntimeError("failed after the change")

        model = unique("M")
        monkeypatch.setattr(service, "model_admin_body", broken)
        before = audit_count(api)
        response = api.admin(
            "PUT", f"/admin/v1/models/{model}", json={"display_name": "x", "context_length": 8}
        )
        assert_error(response, 500, "internal_error")
        monkeypatch.undo()
        assert audit_count(api) == before
        assert_error(
            api.admin("GET", f"/admin/v1/models/{model}"), 404, "model_not_found", param="model"
        )


def test_secrets_are_redacted(api: Api) -> None:
    account = create_account(api)
    key = create_key(api, account)
    (event,) = newest(api, account_id=account, action="api_key.create")
    assert event["changes"]["key"] == "[redacted]"
    assert event["target_id"] == key.id
    with api.database.unit_of_work() as session:
        stored = " ".join(session.execute(select(AuditEvent.changes)).scalars())
    assert key.secret not in stored
    assert key.secret[10:] not in api.admin("GET", "/admin/v1/audit-events").text


class TestList:
    def test_newest_first_filters_and_pages(self, api: Api) -> None:
        account = create_account(api)
        api.clock.advance(hours=1)
        grant(api, account, 100)
        api.clock.advance(hours=1)
        key = create_key(api, account)
        events = newest(api, account_id=account)
        assert [e["action"] for e in events] == ["api_key.create", "grant.create", "account.create"]
        assert [e["action"] for e in newest(api, account_id=account, action="grant.create")] == [
            "grant.create"
        ]
        window = {"starting_at": "2026-11-29T13:00:00Z", "ending_at": "2026-11-29T14:00:00Z"}
        assert [e["action"] for e in newest(api, account_id=account, **window)] == ["grant.create"]
        assert newest(api, account_id=account, actor="someone-else") == []
        assert len(newest(api, account_id=account, actor=ACTOR)) == 3
        first = api.admin(
            "GET", "/admin/v1/audit-events", params={"account_id": account, "limit": 2}
        ).json()
        assert first["has_more"] and len(first["data"]) == 2
        rest = api.admin(
            "GET",
            "/admin/v1/audit-events",
            params={"account_id": account, "limit": 2, "after": first["next_cursor"]},
        ).json()
        assert [e["action"] for e in first["data"] + rest["data"]] == [e["action"] for e in events]
        assert not rest["has_more"] and rest["next_cursor"] is None
        assert events[0]["target_id"] == key.id

    @pytest.mark.parametrize(
        ("params", "code", "param"),
        [
            ({"action": "account.delete"}, "unsupported_value", "action"),
            ({"starting_at": "yesterday"}, "invalid_timestamp", "starting_at"),
            ({"ending_at": 0}, "invalid_timestamp", "ending_at"),
            ({"after": "nonsense"}, "invalid_parameter", "after"),
            ({"limit": 0}, "invalid_parameter", "limit"),
        ],
    )
    def test_bad_parameters(self, api: Api, params: dict[str, Any], code: str, param: str) -> None:
        response = api.admin("GET", "/admin/v1/audit-events", params=params)
        assert_error(response, 400, code, param=param)


def test_the_log_is_append_only(api: Api) -> None:
    create_account(api)
    for statement in ("UPDATE audit_events SET actor = 'x'", "DELETE FROM audit_events"):
        with (
            pytest.raises(DBAPIError, match="append-only"),
            api.database.unit_of_work() as session,
        ):
            session.execute(text(statement))
    assert audit_count(api) > 0


class TestCommandLine:
    def test_catalog_import_is_recorded_as_cli(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        backend = "sqlite"
        with migrated_database(backend, tmp_path) as url:
            monkeypatch.setenv("METERING_DATABASE_URL", url)
            catalog = tmp_path / "catalog.json"
            model = {
                "id": "Audited-1",
                "display_name": "A",
                "context_length": 100,
                "prices": [
                    {
                        "effective_at": "2026-01-01T00:00:00Z",
                        "input_microcents_per_million": 1,
                        "output_microcents_per_million": 2,
                        "cache_read_microcents_per_million": 3,
                    }
                ],
            }
            catalog.write_text(json.dumps({"models": [model]}))
            assert main(["catalog", "import", str(catalog)]) == 0
            assert main(["catalog", "import", str(catalog)]) == 0  # nothing changes: no event
            with running_api(backend, url, tmp_path) as api:
                events = newest(api)
            assert [(e["action"], e["actor"], e["request_id"]) for e in events] == [
                ("price.create", "cli", None),
                ("model.create", "cli", None),
            ]
            assert events[1]["changes"]["display_name"] == "A"
            assert events[0]["changes"]["input_microcents_per_million"] == 1
