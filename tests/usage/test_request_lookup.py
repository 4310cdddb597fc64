"""``GET /v1/requests/{request_id}``: what one request cost, component by component (rates in
force, exact and charged amounts, by tests/oracle.py), with its key's project and member and the
hold it settled; another account's request, or none, is 404."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

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
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.ledger.helpers import DAY_BEFORE


def test_a_request_is_shown_component_by_component_with_the_hold_it_settled(api: Api) -> None:
    account = create_account(api)
    grant(api, account, 100)
    model = priced_model(api, DAY_BEFORE)
    member = api.admin(
        "POST", f"/admin/v1/accounts/{account}/members", json={"email": f"{unique('m')}@x.io"}
    ).json()["id"]
    made = api.admin(
        "POST", f"/admin/v1/accounts/{account}/api-keys", json={"name": "k", "member_id": member}
    ).json()
    key = Key(made["id"], made["key"], account)
    request_id = unique("req")
    hold = authorize(
        api, key, model, prompt_tokens=3333, max_tokens=777, request_id=request_id
    ).json()
    usage = chat_usage(3333, 701, cached=1234, reasoning=17)
    event = usage_event(
        key,
        model,
        NOW - timedelta(minutes=1),
        usage,
        request_id=request_id,
        authorization_id=hold["id"],
    )
    ingest(api, event)

    body = api.as_key(key.secret, "GET", f"/v1/requests/{request_id}").json()
    charge = oracle.event_charge(event, GLM_RATES)
    assert (body["object"], body["request_id"], body["api_key_id"]) == (
        "request",
        request_id,
        key.id,
    )
    assert (body["project_id"], body["member_id"]) == (
        "proj_" + account.removeprefix("acct_"),
        member,
    )
    assert (body["model"], body["api"]) == (model, "chat_completions")
    tokens = {"input": 3333 - 1234, "cache_read": 1234, "output": 701}
    rates = {"input": GLM_RATES[0], "output": GLM_RATES[1], "cache_read": GLM_RATES[2]}
    charged = {
        "input": charge.input_microcents,
        "cache_read": charge.cache_read_microcents,
        "output": charge.output_microcents,
    }
    for component in body["components"]:
        name = component["component"]
        assert component["tokens"] == tokens[name]
        assert component["rate_microcents_per_million"] == rates[name]
        exact = Decimal(tokens[name] * rates[name]) / 10**6
        assert Decimal(component["exact_microcents"]) == exact
        assert (
            component["microcents"] == charged[name] == oracle.component(tokens[name], rates[name])
        )
    assert [c["component"] for c in body["components"]] == ["input", "cache_read", "output"]
    assert body["total_microcents"] == charge.total_microcents
    assert body["authorization"] == {
        "id": hold["id"],
        "estimate_microcents": hold["estimate_microcents"],
        "estimate_cents": hold["credits_required_cents_estimate"],
        "status": "settled",
    }

    stranger = create_key(api, create_account(api))
    missing = api.as_key(stranger.secret, "GET", f"/v1/requests/{request_id}")
    assert_error(missing, 404, "not_found", param="request_id")
    assert_error(
        api.as_key(key.secret, "GET", "/v1/requests/nope"), 404, "not_found", param="request_id"
    )
    assert api.client.get(f"/v1/requests/{request_id}").status_code == 401
