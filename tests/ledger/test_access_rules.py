"""The access rules on both backends through the real app: requests in flight (429), model access
(404 vs 403), spend windows at their boundaries, GET /v1/api-keys and GET /v1/models per key,
and the order of the checks as a table. (The races on PostgreSQL with two server processes are
in test_access_races.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from metering.accounts.windows import window_bounds
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    assert_error,
    authorization_request,
    authorize,
    create_key,
    credits_of,
    exact_json,
    ingest,
    priced_model,
    put_model,
    usage_event,
)
from tests.ledger.helpers import add_key_spend, books, expected_estimate, prepaid

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)
DAY_BEFORE = NOW - timedelta(days=1)


def patch_account(api: Api, account: str, **fields: Any) -> dict[str, Any]:
    response = api.admin("PATCH", f"/admin/v1/accounts/{account}", json=fields)
    assert response.status_code == 200, response.text
    return dict(response.json())


def model_access(api: Api, account: str, models: list[str] | None) -> Any:
    return api.admin("PUT", f"/admin/v1/accounts/{account}/model-access", json={"models": models})


def patch_key(api: Api, key: Key, **fields: Any) -> Any:
    return api.admin("PATCH", f"/admin/v1/api-keys/{key.id}", json=fields)


def void(api: Api, hold_id: str) -> None:
    assert api.gateway("DELETE", f"/v1/authorizations/{hold_id}").status_code == 200


def assert_429(response: Any) -> None:
    assert_error(response, 429, "concurrency_limit_exceeded")
    assert response.headers["retry-after"] == "1"
    assert response.headers["ratelimit-reset"] == "1"


# -- requests in flight ------------------------------------------------------------------------


@pytest.mark.parametrize("billing", ["prepaid", "unbilled"])
def test_the_limit_counts_active_holds_and_each_release_frees_a_slot(
    api: Api, billing: str
) -> None:
    setup = prepaid(api, 1000, billing=billing)
    account = patch_account(api, setup.account, max_concurrent_requests=3)
    assert account["max_concurrent_requests"] == 3
    granted = [authorize(api, setup.key, setup.model) for _ in range(3)]
    assert [r.status_code for r in granted] == [200, 200, 200]
    assert_429(authorize(api, setup.key, setup.model))
    # A replay of a known request id is never refused by the limit.
    replay = api.gateway(
        "POST",
        "/v1/authorizations",
        json={
            **authorization_request(setup.key, setup.model),
            "request_id": granted[0].json()["request_id"],
        },
    )
    assert replay.status_code == 200 and replay.json()["id"] == granted[0].json()["id"]
    # A void frees one slot, exactly.
    void(api, granted[0].json()["id"])
    assert authorize(api, setup.key, setup.model).status_code == 200
    assert_429(authorize(api, setup.key, setup.model))
    # A usage event settling a hold frees one.
    hold = granted[1].json()
    event = usage_event(setup.key, setup.model, NOW, request_id=hold["request_id"])
    assert ingest(api, event)["recorded"] == 1
    assert authorize(api, setup.key, setup.model).status_code == 200
    assert_429(authorize(api, setup.key, setup.model))
    # Expiry frees them all at that instant; a shorter hold_ttl_seconds sooner.
    api.clock.advance(seconds=3600)
    short = [authorize(api, setup.key, setup.model, hold_ttl_seconds=1) for _ in range(3)]
    assert [r.status_code for r in short] == [200, 200, 200]
    assert short[0].json()["expires_at"] == "2026-11-29T13:00:01Z"
    assert_429(authorize(api, setup.key, setup.model))
    api.clock.advance(seconds=1)
    assert authorize(api, setup.key, setup.model).status_code == 200
    # Clearing the limit lifts it.
    patch_account(api, setup.account, max_concurrent_requests=None)
    assert all(authorize(api, setup.key, setup.model).status_code == 200 for _ in range(4))
    verify_clean(api)


def test_an_unbilled_accounts_holds_from_before_its_limit_are_counted(api: Api) -> None:
    setup = prepaid(api, billing="unbilled")
    before = [authorize(api, setup.key, setup.model) for _ in range(2)]
    assert [r.status_code for r in before] == [200, 200]
    patch_account(api, setup.account, max_concurrent_requests=2)
    assert_429(authorize(api, setup.key, setup.model))
    void(api, before[0].json()["id"])
    assert authorize(api, setup.key, setup.model).status_code == 200
    assert_429(authorize(api, setup.key, setup.model))
    verify_clean(api)


def test_hold_ttl_seconds_is_bounded_and_part_of_idempotency(api: Api) -> None:
    setup = prepaid(api, 1000)
    for bad in (0, 604_801, "60", 1.5, True):
        response = authorize(api, setup.key, setup.model, hold_ttl_seconds=bad)
        assert_error(response, 400, "invalid_parameter", param="hold_ttl_seconds")
    body = authorization_request(setup.key, setup.model, hold_ttl_seconds=604_800)
    first = api.gateway("POST", "/v1/authorizations", json=body)
    assert first.json()["expires_at"] == "2026-12-06T12:00:00Z"
    assert api.gateway("POST", "/v1/authorizations", json=body).json()["id"] == first.json()["id"]
    for other in (
        {**body, "hold_ttl_seconds": 60},
        {k: v for k, v in body.items() if k != "hold_ttl_seconds"},
    ):
        conflict = api.gateway("POST", "/v1/authorizations", json=other)
        assert_error(conflict, 409, "idempotency_conflict", param="request_id")


def test_max_concurrent_requests_is_validated(api: Api) -> None:
    setup = prepaid(api)
    for bad in (0, -1, 1_000_001, "5", 2.0, True):
        response = api.admin(
            "PATCH", f"/admin/v1/accounts/{setup.account}", json={"max_concurrent_requests": bad}
        )
        assert_error(response, 400, "invalid_parameter", param="max_concurrent_requests")


def verify_clean(api: Api) -> None:
    from metering.ledger.service import held_counter_mismatches

    with api.database.unit_of_work() as session:
        assert held_counter_mismatches(session) == []


# -- model access ------------------------------------------------------------------------------


def _body_without(response: Any, *names: str) -> dict[str, Any]:
    error = dict(response.json()["error"])
    error.pop("request_id")
    for name in names:
        error["message"] = error["message"].replace(repr(name), "'…'")
    return error


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("account_list", ["all", "names it", "omits it"])
@pytest.mark.parametrize("key_list", ["all", "names it", "omits it"])
def test_404_or_403_for_every_combination(
    api: Api, hidden: bool, account_list: str, key_list: str
) -> None:
    setup = prepaid(api, 1000, hidden=hidden)
    other = priced_model(api, DAY_BEFORE)
    if account_list != "all":
        models = [setup.model, other] if account_list == "names it" else [other]
        assert model_access(api, setup.account, models).status_code == 200
    if key_list != "all":
        models = [setup.model, other] if key_list == "names it" else [other]
        if account_list == "omits it" and key_list == "names it":
            # A key cannot be given a model its account does not see: the list is set before
            # the account is narrowed, and the stale entry grants nothing.
            assert model_access(api, setup.account, None).status_code == 200
            assert patch_key(api, setup.key, allowed_models=models).status_code == 200
            assert model_access(api, setup.account, [other]).status_code == 200
        else:
            assert patch_key(api, setup.key, allowed_models=models).status_code == 200
    response = authorize(api, setup.key, setup.model.lower())
    if account_list == "omits it":
        assert_error(response, 404, "model_not_found", param="model")
        unknown = authorize(api, setup.key, "No-Such-Model")
        assert _body_without(response, setup.model.lower()) == _body_without(
            unknown, "No-Such-Model"
        )
    elif key_list == "omits it":
        assert_error(response, 403, "model_not_allowed", param="model")
    else:
        assert response.status_code == 200, response.text
        assert response.json()["model"] == setup.model
    listed = [
        card["id"] for card in api.as_key(setup.key.secret, "GET", "/v1/models").json()["data"]
    ]
    shown = account_list != "omits it" and key_list != "omits it"
    shown = shown and (not hidden or "names it" in (account_list, key_list))
    assert (setup.model in listed) == shown
    public = [card["id"] for card in api.client.get("/v1/models").json()["data"]]
    assert (setup.model in public) == (not hidden)


def test_model_lists_are_validated_and_shown(api: Api) -> None:
    setup = prepaid(api)
    other = priced_model(api, DAY_BEFORE)
    response = model_access(api, setup.account, ["No-Such-Model"])
    assert_error(response, 400, "invalid_parameter", param="models")
    account = model_access(api, setup.account, [other.upper(), setup.model, other]).json()
    assert account["model_access"] == sorted({other, setup.model}, key=str.encode)
    response = patch_key(api, setup.key, allowed_models=[put_model(api)])
    assert_error(response, 400, "invalid_parameter", param="allowed_models")
    key = patch_key(api, setup.key, allowed_models=[setup.model.lower()]).json()
    assert key["allowed_models"] == [setup.model]
    # Narrowing the account keeps the key's list as it is (shown, granting nothing).
    model_access(api, setup.account, [other])
    keys = api.as_key(setup.key.secret, "GET", "/v1/api-keys").json()["data"]
    assert keys[0]["allowed_models"] == [setup.model]
    assert_error(authorize(api, setup.key, setup.model), 404, "model_not_found", param="model")


# -- spend windows -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "at", "start", "end"),
    [
        ("day", datetime(2026, 11, 29, 23, 59, 59, 999999, UTC), "2026-11-29", "2026-11-30"),
        ("week", datetime(2026, 11, 29, 23, 59, 59, 999999, UTC), "2026-11-23", "2026-11-30"),
        ("week", datetime(2026, 11, 30, 0, 0, tzinfo=UTC), "2026-11-30", "2026-12-07"),
        ("month", datetime(2026, 12, 31, 23, 59, 59, 999999, UTC), "2026-12-01", "2027-01-01"),
        ("month", datetime(2028, 2, 29, 12, tzinfo=UTC), "2028-02-01", "2028-03-01"),
        ("day", datetime(2028, 2, 29, 0, 0, tzinfo=UTC), "2028-02-29", "2028-03-01"),
        ("week", datetime(2028, 3, 1, 8, tzinfo=UTC), "2028-02-28", "2028-03-06"),
    ],
)
def test_window_bounds(window: str, at: datetime, start: str, end: str) -> None:
    bounds = window_bounds(window, at)
    assert [b.date().isoformat() for b in bounds] == [start, end]
    assert all(b.tzinfo is not None and b.time() == datetime.min.time() for b in bounds)


def test_a_weekly_limit_at_its_boundaries(api: Api) -> None:
    setup = prepaid(api, 1000)
    key = create_key(api, setup.account)
    response = patch_key(api, key, spend_limit_cents=1, spend_limit_window="week")
    assert response.json()["spend_limit_window"] == "week"
    limit = 1_000_000
    # NOW is Sunday 2026-11-29: spent on Monday the 23rd counts; on Sunday the 22nd it does not.
    add_key_spend(api, key, datetime(2026, 11, 23, tzinfo=UTC), limit - ESTIMATE)
    add_key_spend(api, key, datetime(2026, 11, 22, tzinfo=UTC), 10**9)
    api.clock.set(datetime(2026, 11, 29, 23, 59, 59, 999999, UTC))
    first = authorize(api, key, setup.model)
    assert first.status_code == 200, first.text
    refused = authorize(api, key, setup.model)
    error = assert_error(refused, 402, "member_spend_limit")
    assert (error["spend_limit_cents"], error["spend_limit_window"]) == (1, "week")
    assert error["spent_cents"] == (limit - ESTIMATE + ESTIMATE) / 1_000_000
    void(api, first.json()["id"])
    own = {k["id"]: k for k in api.as_key(key.secret, "GET", "/v1/api-keys").json()["data"]}
    assert own[key.id]["window_starts_at"] == "2026-11-23T00:00:00Z"
    assert own[key.id]["spent_microcents"] == limit - ESTIMATE
    # Monday 00:00: a new week, the old spend no longer counts.
    api.clock.set(datetime(2026, 11, 30, tzinfo=UTC))
    add_key_spend(api, key, datetime(2026, 11, 30, tzinfo=UTC), limit - 2 * ESTIMATE)
    assert [authorize(api, key, setup.model).status_code for _ in range(3)] == [200, 200, 402]
    own = {k["id"]: k for k in api.as_key(key.secret, "GET", "/v1/api-keys").json()["data"]}
    assert own[key.id]["window_starts_at"] == "2026-11-30T00:00:00Z"
    assert own[key.id]["spent_microcents"] == limit - 2 * ESTIMATE


@pytest.mark.parametrize("window", ["day", "week", "month"])
def test_the_refusal_names_the_limit_of_the_keys_window(api: Api, window: str) -> None:
    """The 402's limit fields are the key's own, as its object shows them: the window's amount
    under ``spend_limit_cents``, and the older ``monthly_spend_limit_cents`` only for a month."""
    setup = prepaid(api, 1000)
    key = create_key(api, setup.account)
    limit = 3 * ESTIMATE
    shown = api.client.patch(
        f"/admin/v1/api-keys/{key.id}",
        content=f'{{"spend_limit_cents": {Decimal(limit) / 10**6}, '
        f'"spend_limit_window": "{window}"}}',
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert shown.status_code == 200, shown.text
    add_key_spend(api, key, NOW, ESTIMATE)
    assert [authorize(api, key, setup.model).status_code for _ in range(2)] == [200, 200]
    error = exact_json(authorize(api, key, setup.model))["error"]
    assert error["code"] == "member_spend_limit"
    body = exact_json(shown)
    for field in ("spend_limit_cents", "spend_limit_window", "monthly_spend_limit_cents"):
        assert error[field] == body[field], field
    assert error["spend_limit_cents"] == Decimal(limit) / 10**6
    assert error["spend_limit_window"] == window
    assert error["monthly_spend_limit_cents"] == (
        body["spend_limit_cents"] if window == "month" else None
    )
    assert error["spent_cents"] == Decimal(3 * ESTIMATE) / 10**6  # charges and the two holds
    assert error["credits_required_cents_estimate"] == Decimal(ESTIMATE) / 10**6


def test_spend_limit_forms(api: Api) -> None:
    setup = prepaid(api)
    created = api.admin(
        "POST",
        f"/admin/v1/accounts/{setup.account}/api-keys",
        json={"name": "d", "spend_limit_cents": 2.5, "spend_limit_window": "day"},
    ).json()
    assert (created["spend_limit_cents"], created["spend_limit_window"]) == (2.5, "day")
    assert created["monthly_spend_limit_cents"] is None
    monthly = patch_key(api, Key(created["id"], "", setup.account), monthly_spend_limit_cents=7)
    body = monthly.json()
    assert (body["spend_limit_cents"], body["spend_limit_window"]) == (7, "month")
    assert body["monthly_spend_limit_cents"] == 7
    for both in (
        {"monthly_spend_limit_cents": 1, "spend_limit_cents": 1},
        {"monthly_spend_limit_cents": 1, "spend_limit_window": "week"},
    ):
        response = patch_key(api, setup.key, **both)
        assert_error(response, 400, "invalid_parameter", param="monthly_spend_limit_cents")
    for bad in ("year", None, 7):
        response = patch_key(api, setup.key, spend_limit_window=bad)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "spend_limit_window"


def test_get_api_keys_lists_the_callers_account_only(api: Api) -> None:
    setup = prepaid(api)
    second = create_key(api, setup.account)
    elsewhere = prepaid(api)
    response = api.as_key(setup.key.secret, "GET", "/v1/api-keys", params={"limit": 1})
    page = response.json()
    assert page["object"] == "list" and page["has_more"] is True
    first_id, second_id = sorted([setup.key.id, second.id])  # one created_at: by id
    assert [k["id"] for k in page["data"]] == [first_id]
    rest = api.as_key(
        setup.key.secret, "GET", "/v1/api-keys", params={"after": page["next_cursor"]}
    ).json()
    assert [k["id"] for k in rest["data"]] == [second_id]
    assert set(rest["data"][0]) == {
        "id",
        "object",
        "name",
        "created_at",
        "revoked_at",
        "allowed_models",
        "spend_limit_cents",
        "spend_limit_window",
        "spent_cents",
        "spent_microcents",
        "window_starts_at",
        "project_id",
        "member_id",
    }
    assert elsewhere.key.id not in str(page) + str(rest)
    assert_error(api.client.get("/v1/api-keys"), 401, "missing_api_key")


# -- the order of the checks (docs/api.md#post-v1authorizations) -------------------------------


def _order_case(api: Api, failing: set[str]) -> tuple[Any, Key, str]:
    """An account and key (a member's, in a project of its own) for which exactly the
    ``failing`` checks fail; the request body."""
    setup = prepaid(api, 1000)
    made = {}
    for scope in ("project", "member"):
        limit = {"spend_limit_cents": 0.000001} if scope in failing else {}
        fields = {"name": "p"} if scope == "project" else {"email": "m@example.com"}
        response = api.admin(
            "POST", f"/admin/v1/accounts/{setup.account}/{scope}s", json={**fields, **limit}
        )
        assert response.status_code == 201, response.text
        made[f"{scope}_id"] = response.json()["id"]
    response = api.admin(
        "POST", f"/admin/v1/accounts/{setup.account}/api-keys", json={"name": "m", **made}
    )
    assert response.status_code == 201, response.text
    key = Key(response.json()["id"], response.json()["key"], setup.account)
    other = priced_model(api, DAY_BEFORE)
    if "model_404" in failing:
        model_access(api, setup.account, [other])
    if "model_403" in failing:
        patch_key(api, key, allowed_models=[other])
    if "concurrency" in failing:
        patch_account(api, setup.account, max_concurrent_requests=1)
        # the one request in flight, by the account's other key (no spend limit)
        assert authorize(api, setup.key, other).status_code == 200
    if "credit" in failing:
        adjustment = {"amount_cents": -1000, "idempotency_key": "drain", "reason": "test"}
        response = api.admin(
            "POST", f"/admin/v1/accounts/{setup.account}/adjustments", json=adjustment
        )
        assert response.status_code == 201, response.text
    if "spend" in failing:
        patch_key(api, key, spend_limit_cents=0.000001)
    body = authorization_request(key, setup.model)
    if "estimate" in failing:
        body["prompt_tokens"] = 10**6
    if "body" in failing:
        body["n"] = 0.5
    if "key" in failing:
        body["api_key"] = "mk_nope"
    return body, key, setup.account


CHECKS = [
    "body",
    "key",
    "model_404",
    "model_403",
    "estimate",
    "concurrency",
    "credit",
    "project",
    "member",
    "spend",
]
EXPECTED = {  # status, code, limit_scope
    "body": (400, "invalid_parameter", None),
    "key": (401, "invalid_api_key", None),
    "model_404": (404, "model_not_found", None),
    "model_403": (403, "model_not_allowed", None),
    "estimate": (400, "context_length_exceeded", None),
    "concurrency": (429, "concurrency_limit_exceeded", None),
    "credit": (402, "insufficient_credits", None),
    "project": (402, "project_spend_limit", "project"),
    "member": (402, "member_spend_limit", "member"),
    "spend": (402, "member_spend_limit", "key"),
}


@pytest.mark.parametrize("first", CHECKS)
def test_the_order_of_the_checks(api: Api, first: str) -> None:
    """Every check from ``first`` on fails: the answer is ``first``'s."""
    failing = set(CHECKS[CHECKS.index(first) :])
    body, _key, _account = _order_case(api, failing)
    response = api.gateway("POST", "/v1/authorizations", json=body)
    status, code, scope = EXPECTED[first]
    error = response.json()["error"]
    assert (response.status_code, error["code"], error.get("limit_scope")) == (
        status,
        code,
        scope,
    ), response.text


def test_a_replay_comes_before_the_model_checks(api: Api) -> None:
    setup = prepaid(api, 1000)
    body = authorization_request(setup.key, setup.model)
    first = api.gateway("POST", "/v1/authorizations", json=body)
    assert first.status_code == 200
    other = priced_model(api, DAY_BEFORE)
    model_access(api, setup.account, [other])
    patch_account(api, setup.account, max_concurrent_requests=1)
    replay = api.gateway("POST", "/v1/authorizations", json=body)
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    conflict = api.gateway("POST", "/v1/authorizations", json={**body, "n": 2})
    assert_error(conflict, 409, "idempotency_conflict", param="request_id")
    assert books(api, setup.account) is not None
    assert credits_of(api, setup.key)["held_microcents"] == ESTIMATE


def test_the_report_shows_a_private_model_by_its_id(api: Api) -> None:
    private = prepaid(api, 1000, hidden=True)
    assert model_access(api, private.account, [private.model]).status_code == 200
    public = prepaid(api, 1000)
    public_key = create_key(api, public.account)
    for key in (private.key, public_key):
        assert ingest(api, usage_event(key, private.model, NOW))["recorded"] == 1

    def models_of(key: Key) -> list[str]:
        report = api.as_key(key.secret, "GET", "/v1/usage", params={"starting_at": "2026-11-29"})
        assert report.status_code == 200, report.text
        return [r["model"] for bucket in report.json()["data"] for r in bucket["results"]]

    assert models_of(private.key) == [private.model]
    assert models_of(public_key) == ["unavailable"]
