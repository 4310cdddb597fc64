"""Reports by project and by member: the per-key rollups added up through each key's fixed
project and member, equal to an independent sum (tests/oracle.py) of the events the test sent;
the filters; the CSV's columns; a key's spend stays its member's after the member is removed."""

from __future__ import annotations

import csv
import io
import random
from collections import defaultdict
from datetime import timedelta
from typing import Any

from tests import oracle
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    chat_usage,
    create_account,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.ledger.helpers import DAY_BEFORE

START = (NOW - timedelta(days=1)).strftime("%Y-%m-%d")
END = (NOW + timedelta(days=1)).strftime("%Y-%m-%d")


def _post(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.admin("POST", path, json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _report(api: Api, key: Key, **params: Any) -> Any:
    response = api.as_key(
        key.secret, "GET", "/v1/usage", params={"starting_at": START, "ending_at": END, **params}
    )
    assert response.status_code == 200, response.text
    return response


def _sums(body: dict[str, Any], group: str) -> dict[tuple[str, Any], tuple[int, int]]:
    """(day, group) → (requests, cost_microcents), from a JSON report."""
    found = {}
    for bucket in body["data"]:
        for result in bucket["results"]:
            assert result["cost_usd"] is None
            found[(bucket["starting_at"][:10], result[group])] = (
                result["requests"],
                result["cost_microcents"],
            )
    return found


def test_reports_by_project_and_member_are_the_sums_of_the_events(api: Api) -> None:
    account = create_account(api)
    grant(api, account, 10**4)
    model = priced_model(api, DAY_BEFORE - timedelta(days=1))
    default = "proj_" + account.removeprefix("acct_")
    project = _post(api, f"/admin/v1/accounts/{account}/projects", {"name": "research"})["id"]
    members = f"/admin/v1/accounts/{account}/members"
    ada = _post(api, members, {"email": f"{unique('ada')}@x.io"})
    bob = _post(api, members, {"email": f"{unique('bob')}@x.io"})
    owners = {
        "ada_research": (project, ada["id"]),
        "bob_research": (project, bob["id"]),
        "ada_default": (default, ada["id"]),
        "service": (default, None),
    }
    keys = {}
    for name, (project_id, member_id) in owners.items():
        body = _post(
            api,
            f"/admin/v1/accounts/{account}/api-keys",
            {"name": name, "project_id": project_id, "member_id": member_id},
        )
        keys[name] = Key(body["id"], body["key"], account)

    chosen = random.Random(32)
    events = []
    for _ in range(40):
        name = chosen.choice(sorted(keys))
        at = NOW - timedelta(hours=chosen.randrange(1, 30))
        usage = chat_usage(chosen.randrange(1, 5000), chosen.randrange(0, 900))
        events.append((name, at, usage_event(keys[name], model, at, usage)))
    ingest(api, *(event for _, _, event in events))

    by_project: defaultdict[tuple[str, Any], list[int]] = defaultdict(lambda: [0, 0])
    by_member: defaultdict[tuple[str, Any], list[int]] = defaultdict(lambda: [0, 0])
    for name, at, event in events:
        cost = oracle.event_charge(event, GLM_RATES).total_microcents
        day = at.strftime("%Y-%m-%d")
        for sums, owner in ((by_project, owners[name][0]), (by_member, owners[name][1])):
            sums[(day, owner)][0] += 1
            sums[(day, owner)][1] += cost
    expected_projects = {k: tuple(v) for k, v in by_project.items()}
    expected_members = {k: tuple(v) for k, v in by_member.items()}

    caller = keys["service"]
    body = _report(api, caller, group_by="project").json()
    assert body["group_by"] == "project"
    assert _sums(body, "project") == expected_projects
    names = {r["project"]: r["project_name"] for b in body["data"] for r in b["results"]}
    assert names == {project: "research", default: "Default"}
    members_body = _report(api, caller, group_by="member").json()
    assert _sums(members_body, "member") == expected_members
    emails = {r["member"]: r["member_email"] for b in members_body["data"] for r in b["results"]}
    assert emails == {ada["id"]: ada["email"], bob["id"]: bob["email"], None: None}

    # Filters: a project's keys only, a member's keys only, both at once.
    only = _sums(_report(api, caller, group_by="member", project_ids=project).json(), "member")
    assert only == _sum_where(events, owners, lambda o: o[0] == project, 1)
    ada_only = _sums(
        _report(api, caller, group_by="project", member_ids=ada["id"]).json(), "project"
    )
    assert ada_only == _sum_where(events, owners, lambda o: o[1] == ada["id"], 0)

    # CSV: the group and its name after the bucket's bounds.
    rows = list(
        csv.reader(io.StringIO(_report(api, caller, group_by="project", format="csv").text))
    )
    assert rows[0] == [
        "starting_at",
        "ending_at",
        "project",
        "project_name",
        "requests",
        "input_tokens",
        "cache_read_tokens",
        "output_tokens",
        "cost_usd",
        "cost_microcents",
    ]
    assert sum(int(row[-1]) for row in rows[1:] if row[2]) == sum(
        cost for _, cost in expected_projects.values()
    )

    # A removed member's keys' spend stays the member's (named by its address), an archived
    # project's the project's.
    removed = api.admin("DELETE", f"/admin/v1/members/{ada['id']}")
    assert removed.status_code == 200 and removed.json()["removed_at"] is not None, removed.text
    archived = api.admin("DELETE", f"/admin/v1/projects/{project}")
    assert archived.status_code == 200 and archived.json()["archived_at"] is not None
    after = _report(api, caller, group_by="member").json()
    assert _sums(after, "member") == expected_members
    assert {r["member"]: r["member_email"] for b in after["data"] for r in b["results"]} == emails
    after = _report(api, caller, group_by="project").json()
    assert _sums(after, "project") == expected_projects
    assert {r["project"]: r["project_name"] for b in after["data"] for r in b["results"]} == names


def _sum_where(
    events: list[tuple[str, Any, dict[str, Any]]],
    owners: dict[str, tuple[str, Any]],
    keep: Any,
    group: int,
) -> dict[tuple[str, Any], tuple[int, int]]:
    sums: defaultdict[tuple[str, Any], list[int]] = defaultdict(lambda: [0, 0])
    for name, at, event in events:
        if keep(owners[name]):
            entry = sums[(at.strftime("%Y-%m-%d"), owners[name][group])]
            entry[0] += 1
            entry[1] += oracle.event_charge(event, GLM_RATES).total_microcents
    return {k: tuple(v) for k, v in sums.items()}
