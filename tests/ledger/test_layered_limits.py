"""The pre-flight's layered limits: a key's effective models are its account's ∩ its project's
∩ its own; its spend is limited by its project's limit, then its member's (over all of the
member's keys, in any project), then its own, each over its own window, after the credit check;
spend recorded through ``POST /v1/usage/events``, money from tests/oracle.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import pytest

from tests import oracle
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    assert_error,
    authorize,
    create_account,
    credits_of,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.ledger.helpers import DAY_BEFORE, expected_estimate
from tests.threads import run_together

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)  # each authorization below


def cents_text(microcents: int | None) -> str:
    return "null" if microcents is None else format(Decimal(microcents) / 10**6, "f")


def patch(api: Api, path: str, limit: int | None, window: str = "month") -> None:
    body = f'{{"spend_limit_cents": {cents_text(limit)}, "spend_limit_window": "{window}"}}'
    response = api.client.patch(
        path, content=body, headers={**api.admin_headers, "Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text


def post(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.admin("POST", path, json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def key_in(api: Api, account: str, **owners: Any) -> Key:
    body = post(api, f"/admin/v1/accounts/{account}/api-keys", {"name": unique("k"), **owners})
    return Key(body["id"], body["key"], account)


@dataclass
class Team:
    account: str
    model: str
    project: str
    ada: str  # a member with keys in two projects
    bob: str  # another member of the same project
    ada_in_project: Key
    ada_in_default: Key
    bob_in_project: Key
    spent_today: int  # what ada_in_project spent today (the oracle's figure)
    spent_yesterday: int  # and yesterday (same week and month)


@pytest.fixture
def team(api: Api) -> Team:
    account = create_account(api)
    grant(api, account, 10**6)
    model = priced_model(api, DAY_BEFORE)
    project = post(api, f"/admin/v1/accounts/{account}/projects", {"name": "research"})["id"]
    members = f"/admin/v1/accounts/{account}/members"
    ada = post(api, members, {"email": f"{unique('ada')}@x.io"})["id"]
    bob = post(api, members, {"email": f"{unique('bob')}@x.io"})["id"]
    ada_in_project = key_in(api, account, project_id=project, member_id=ada)
    ada_in_default = key_in(api, account, member_id=ada)
    bob_in_project = key_in(api, account, project_id=project, member_id=bob)
    today = usage_event(ada_in_project, model, NOW - timedelta(hours=1))
    yesterday = usage_event(
        ada_in_project, model, NOW - timedelta(days=1), usage={"prompt_tokens": 7}
    )
    ingest(api, today, yesterday)
    return Team(
        account,
        model,
        project,
        ada,
        bob,
        ada_in_project,
        ada_in_default,
        bob_in_project,
        oracle.event_charge(today, GLM_RATES).total_microcents,
        oracle.event_charge(yesterday, GLM_RATES).total_microcents,
    )


# Each case: the key used, the project's, Ada's and the key's own limit as (room, window) where
# room is what the limit leaves beyond what its scope spent in that window (None: no limit);
# then the answer: None (granted) or the code and the limit_scope.
FITS, SHORT = 0, -1  # the estimate fits exactly / is one microcent too many
CASES: list[tuple[str, Any, Any, Any, tuple[str, str] | None]] = [
    ("ada_in_project", (FITS, "month"), (FITS, "month"), (FITS, "month"), None),
    ("ada_in_project", (SHORT, "month"), None, None, ("project_spend_limit", "project")),
    (
        "ada_in_project",
        (SHORT, "month"),
        (SHORT, "month"),
        (SHORT, "month"),
        ("project_spend_limit", "project"),
    ),
    ("ada_in_project", None, (SHORT, "month"), (SHORT, "month"), ("member_spend_limit", "member")),
    ("ada_in_project", None, None, (SHORT, "month"), ("member_spend_limit", "key")),
    (
        "ada_in_project",
        (FITS, "month"),
        (FITS, "week"),
        (SHORT, "day"),
        ("member_spend_limit", "key"),
    ),
    # Ada's limit counts her key of the Default project too.
    ("ada_in_default", None, (SHORT, "month"), None, ("member_spend_limit", "member")),
    # The project's limit counts Ada's spend against Bob; Ada's limit is not Bob's.
    ("bob_in_project", (SHORT, "week"), None, None, ("project_spend_limit", "project")),
    ("bob_in_project", None, (SHORT, "month"), None, None),
]


def _spent(team: Team, scope: str, window: str, key: str) -> int:
    """What the scope spent in the window (NOW is a Sunday: yesterday is in its week)."""
    if scope == "key" and key != "ada_in_project":
        return 0
    if scope == "member" and key == "bob_in_project":
        return 0
    return team.spent_today + (0 if window == "day" else team.spent_yesterday)


@pytest.mark.parametrize(("key", "project", "member", "own", "expected"), CASES)
def test_limits_are_checked_project_then_member_then_key(
    api: Api, team: Team, key: str, project: Any, member: Any, own: Any, expected: Any
) -> None:
    chosen: Key = getattr(team, key)
    limits = {}
    for scope, path, given in (
        ("project", f"/admin/v1/projects/{team.project}", project),
        ("member", f"/admin/v1/members/{team.ada}", member),
        ("key", f"/admin/v1/api-keys/{chosen.id}", own),
    ):
        if given is None:
            patch(api, path, None)
            continue
        room, window = given
        limit = _spent(team, scope, window, key) + ESTIMATE + room
        limits[scope] = (limit, window)
        patch(api, path, limit, window)

    response = authorize(api, chosen, team.model, prompt_tokens=1000, max_tokens=100)
    if expected is None:
        assert response.status_code == 200, response.text
        assert response.json()["estimate_microcents"] == ESTIMATE
        return
    code, scope = expected
    error = assert_error(response, 402, code)
    limit, window = limits[scope]
    assert error["limit_scope"] == scope
    assert Decimal(str(error["spend_limit_cents"])) * 10**6 == limit
    assert error["spend_limit_window"] == window
    assert Decimal(str(error["spent_cents"])) * 10**6 == _spent(team, scope, window, key)


# Each scope's window a different one of the three, whichever scope has the widest, and each
# scope's other keys' holds in force counting toward it (Bob's toward the project, Ada's Default
# key's toward Ada): the first limit in order that is short refuses, the ones before it are met
# exactly, and the 402 says what that scope spent in its own window, its holds included.
SCOPE_CODES = {
    "project": "project_spend_limit",
    "member": "member_spend_limit",
    "key": "member_spend_limit",
}


@pytest.mark.parametrize("windows", [("day", "week", "month"), ("month", "day", "week")])
@pytest.mark.parametrize("short", list(SCOPE_CODES))
def test_each_scope_counts_its_own_window_and_holds_when_all_are_near(
    api: Api, team: Team, windows: tuple[str, str, str], short: str
) -> None:
    for other in (team.bob_in_project, team.ada_in_default):
        held = authorize(api, other, team.model, prompt_tokens=1000, max_tokens=100)
        assert held.status_code == 200, held.text
    paths = {
        "project": f"/admin/v1/projects/{team.project}",
        "member": f"/admin/v1/members/{team.ada}",
        "key": f"/admin/v1/api-keys/{team.ada_in_project.id}",
    }
    order = list(SCOPE_CODES)
    spent = {}
    for scope, window in zip(order, windows, strict=True):
        others_held = 0 if scope == "key" else ESTIMATE
        spent[scope] = _spent(team, scope, window, "ada_in_project") + others_held
        room = FITS if order.index(scope) < order.index(short) else SHORT
        patch(api, paths[scope], spent[scope] + ESTIMATE + room, window)

    response = authorize(api, team.ada_in_project, team.model, prompt_tokens=1000, max_tokens=100)
    error = assert_error(response, 402, SCOPE_CODES[short])
    assert error["limit_scope"] == short
    assert error["spend_limit_window"] == windows[order.index(short)]
    assert Decimal(str(error["spent_cents"])) * 10**6 == spent[short]


def test_credit_is_checked_before_every_spend_limit(api: Api, team: Team) -> None:
    patch(api, f"/admin/v1/projects/{team.project}", 0)
    poor = create_account(api)
    grant(api, poor, Decimal(ESTIMATE - 1) / 10**6)
    project = post(
        api, f"/admin/v1/accounts/{poor}/projects", {"name": "p", "spend_limit_cents": 0}
    )
    key = key_in(api, poor, project_id=project["id"])
    assert_error(
        authorize(api, key, team.model, prompt_tokens=1000, max_tokens=100),
        402,
        "insufficient_credits",
    )
    # With credit enough, the project's limit of 0 refuses it.
    grant(api, poor, 1)
    error = assert_error(
        authorize(api, key, team.model, prompt_tokens=1000, max_tokens=100),
        402,
        "project_spend_limit",
    )
    assert error["limit_scope"] == "project"


def test_effective_models_are_account_and_project_and_key(api: Api, team: Team) -> None:
    other = priced_model(api, DAY_BEFORE)
    narrowed = post(
        api,
        f"/admin/v1/accounts/{team.account}/projects",
        {"name": "narrow", "allowed_models": [team.model]},
    )
    both = key_in(api, team.account, project_id=narrowed["id"])
    response = api.admin(
        "PATCH", f"/admin/v1/api-keys/{both.id}", json={"allowed_models": [team.model, other]}
    )
    assert response.status_code == 200, response.text
    assert authorize(api, both, team.model, prompt_tokens=10, max_tokens=10).status_code == 200
    listed = api.as_key(both.secret, "GET", "/v1/models").json()["data"]
    assert [card["id"] for card in listed] == [team.model]
    assert_error(
        authorize(api, both, other, prompt_tokens=10, max_tokens=10),
        403,
        "model_not_allowed",
        param="model",
    )
    # The project's list widened: the key's own list still narrows it.
    api.admin("PATCH", f"/admin/v1/projects/{narrowed['id']}", json={"allowed_models": None})
    assert authorize(api, both, other, prompt_tokens=10, max_tokens=10).status_code == 200
    listed = api.as_key(both.secret, "GET", "/v1/models").json()["data"]
    assert sorted(card["id"] for card in listed) == sorted([team.model, other])
    api.admin("PATCH", f"/admin/v1/api-keys/{both.id}", json={"allowed_models": [other]})
    assert_error(
        authorize(api, both, team.model, prompt_tokens=10, max_tokens=10),
        403,
        "model_not_allowed",
        param="model",
    )


# Each case: the model lists of the account, the project and the key, as letters of three models
# (None: every model); a model the account does not list is unknown to the key (404), one it
# lists but the project or the key does not is refused (403), the rest are the key's models.
MODEL_CASES = [
    (None, None, None),
    ("ab", None, None),
    (None, "bc", None),
    (None, None, "ac"),
    ("ab", "bc", None),
    ("ab", None, "bc"),
    (None, "ab", "bc"),
    ("abc", "ab", "bc"),
    ("ab", "bc", "ac"),
    ("b", "abc", "abc"),
]


@pytest.mark.parametrize(("account_list", "project_list", "key_list"), MODEL_CASES)
def test_a_keys_models_are_its_accounts_and_its_projects_and_its_own(
    api: Api, account_list: str | None, project_list: str | None, key_list: str | None
) -> None:
    account = create_account(api)
    grant(api, account, 100)
    models = {letter: priced_model(api, DAY_BEFORE) for letter in "abc"}

    def named(letters: str | None) -> list[str] | None:
        return None if letters is None else [models[letter] for letter in letters]

    # The project's and the key's lists first: a list names only models its account sees.
    project = post(
        api,
        f"/admin/v1/accounts/{account}/projects",
        {"name": "p", "allowed_models": named(project_list)},
    )
    key = key_in(api, account, project_id=project["id"])
    narrowed = api.admin(
        "PATCH", f"/admin/v1/api-keys/{key.id}", json={"allowed_models": named(key_list)}
    )
    assert narrowed.status_code == 200, narrowed.text
    access = api.admin(
        "PUT", f"/admin/v1/accounts/{account}/model-access", json={"models": named(account_list)}
    )
    assert access.status_code == 200, access.text

    every = set("abc")
    seen = every & set(account_list or "abc")
    usable = seen & set(project_list or "abc") & set(key_list or "abc")
    for letter in sorted(every):
        response = authorize(api, key, models[letter], prompt_tokens=10, max_tokens=10)
        if letter in usable:
            assert response.status_code == 200, response.text
            assert response.json()["model"] == models[letter]
            voided = api.gateway("DELETE", f"/v1/authorizations/{response.json()['id']}")
            assert voided.status_code == 200, voided.text
        elif letter in seen:
            assert_error(response, 403, "model_not_allowed", param="model")
        else:
            assert_error(response, 404, "model_not_found", param="model")
    listed = api.as_key(key.secret, "GET", "/v1/models")
    assert listed.status_code == 200, listed.text
    ours = {card["id"] for card in listed.json()["data"]} & set(models.values())
    assert ours == {models[letter] for letter in usable}


ROOM = 13  # holds a limit below leaves room for


@pytest.mark.parametrize("scope", ["project", "member"])
def test_authorizations_at_once_get_exactly_the_room_a_limit_leaves(
    api: Api, team: Team, scope: str
) -> None:
    """200 authorizations from 20 threads through the app (on SQLite, its writers' group commit
    decides each as if alone): a project's limit shared by two members, or a member's over
    three keys in two projects, grants exactly the holds it has room for. (Two server
    processes on PostgreSQL and Citus: test_layered_limit_races.py.)"""
    if scope == "project":
        keys = [team.ada_in_project, team.bob_in_project]
        path = f"/admin/v1/projects/{team.project}"
    else:
        keys = [
            team.ada_in_project,
            team.ada_in_default,
            key_in(api, team.account, member_id=team.ada),
        ]
        path = f"/admin/v1/members/{team.ada}"
    patch(api, path, team.spent_today + team.spent_yesterday + ROOM * ESTIMATE)
    start = threading.Barrier(20)

    def client(index: int) -> list[Any]:
        start.wait()
        answers: list[Any] = []
        for turn in range(10):
            key = keys[(index + turn) % len(keys)]
            response = authorize(api, key, team.model, prompt_tokens=1000, max_tokens=100)
            if response.status_code == 200:
                assert response.json()["estimate_microcents"] == ESTIMATE, response.text
                answers.append(200)
            else:
                error = response.json()["error"]
                answers.append((response.status_code, error["code"], error.get("limit_scope")))
        return answers

    results = [
        a for answers in run_together(*(partial(client, i) for i in range(20))) for a in answers
    ]
    code = "project_spend_limit" if scope == "project" else "member_spend_limit"
    assert results.count(200) == ROOM, {str(r) for r in results}
    assert results.count((402, code, scope)) == 200 - ROOM, {str(r) for r in results}
    held = credits_of(api, team.ada_in_default)
    assert (held["held_microcents"], held["balance_microcents"]) == (
        ROOM * ESTIMATE,
        10**6 * 10**6 - team.spent_today - team.spent_yesterday,
    )
