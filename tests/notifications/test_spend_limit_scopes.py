"""``spend_limit.threshold_reached`` of a project's and a member's limit (docs/api.md#event-types):
the charges of every key of the project, or of the member (in any project), reach 80% and 100%
of its limit; the event names its ``limit_scope``, the project or member, and the key whose charge
reached it; once per project or member, window and percent; nothing below the threshold or
for keys outside the scope. Usage is recorded through ``POST /v1/usage/events``; the spend each
event carries is the oracle's sum of the events sent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from metering.accounts.windows import window_bounds
from metering.kit.timeutil import format_timestamp
from metering.models import Account
from tests import oracle
from tests.conftest import Api
from tests.factories import Key, chat_usage, create_account, grant, ingest, priced_model, unique
from tests.factories import usage_event as one_event
from tests.notifications.conftest import Hooks
from tests.notifications.test_events import CENT_RATES
from tests.notifications.test_spend_limit_events import default_project, reached


def _post(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.admin("POST", path, json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


@dataclass
class Team:
    """An account with ample credit, a project, a member (Ada) with a key in that project and
    one in the Default project, a service key in the project, and a model of one cent an
    event."""

    api: Api
    account: str
    model: str
    project: str
    ada: str
    ada_in_project: Key
    ada_in_default: Key
    service_in_project: Key

    def spend(self, key: Key, count: int, at: Any = None) -> list[dict[str, Any]]:
        """``count`` events of the key in one batch (at the clock's now unless ``at``); the
        events sent."""
        when = self.api.clock.now() if at is None else at
        events = [one_event(key, self.model, when, chat_usage(1000, 0)) for _ in range(count)]
        body = ingest(self.api, *events)
        assert [r["status"] for r in body["data"]] == ["recorded"] * count, body
        return events


def _team(api: Api, project_limit: Any = None, ada_limit: Any = None, window: str = "day") -> Team:
    account = create_account(api)
    grant(api, account, 1000)
    model = priced_model(api, api.clock.now() - timedelta(days=40), CENT_RATES)
    project = _post(
        api,
        f"/admin/v1/accounts/{account}/projects",
        {
            "name": unique("proj"),
            "spend_limit_cents": project_limit,
            "spend_limit_window": window,
        },
    )["id"]
    ada = _post(
        api,
        f"/admin/v1/accounts/{account}/members",
        {
            "email": f"{unique('ada')}@example.com",
            "spend_limit_cents": ada_limit,
            "spend_limit_window": window,
        },
    )["id"]

    def key(**owners: Any) -> Key:
        body = _post(api, f"/admin/v1/accounts/{account}/api-keys", {"name": unique("k"), **owners})
        assert (body["project_id"], body["member_id"]) == (
            owners.get("project_id", default_project(account)),
            owners.get("member_id"),
        )
        return Key(body["id"], body["key"], account)

    return Team(
        api,
        account,
        model,
        project,
        ada,
        key(project_id=project, member_id=ada),
        key(member_id=ada),
        key(project_id=project),
    )


def _charged(*batches: list[dict[str, Any]]) -> int:
    """The oracle's charge of the events sent, in microcents."""
    return oracle.total([e for batch in batches for e in batch], CENT_RATES)


def _event(team: Team, scope: str, key: Key, project: str, member: str | None) -> dict[str, Any]:
    """The fields of a threshold event that do not depend on the spend."""
    return {
        "account_id": team.account,
        "limit_scope": scope,
        "api_key_id": key.id,
        "project_id": project,
        "member_id": member,
    }


def _shown(events: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    return [
        (e["limit_scope"], e["percent"], e["spent_microcents"], e["limit_microcents"])
        for e in events
    ]


class TestProjectLimit:
    def test_every_key_of_the_project_counts_and_each_threshold_fires_once(
        self, hooks: Hooks
    ) -> None:
        api = hooks.api
        team = _team(api, project_limit=10, window="week")
        first = team.spend(team.ada_in_project, 5)
        outside = team.spend(team.ada_in_default, 20)  # Ada's, in another project: not counted
        assert reached(api, team.account) == []
        second = team.spend(team.service_in_project, 3)  # 8 of 10 cents: 80%
        spent = _charged(first, second)
        assert spent == 8_000_000 and _charged(outside) == 20_000_000
        start, _ = window_bounds("week", api.clock.now())
        (event,) = reached(api, team.account)
        assert event == {
            **_event(team, "project", team.service_in_project, team.project, None),
            "window": "week",
            "window_starts_at": format_timestamp(start),
            "spent_cents": "8",
            "spent_microcents": spent,
            "limit_cents": "10",
            "limit_microcents": 10_000_000,
            "percent": 80,
        }
        third = team.spend(team.ada_in_project, 1)  # 90%: nothing new
        assert len(reached(api, team.account)) == 1
        fourth = team.spend(team.ada_in_project, 4)  # 130%: 100 reached, once
        team.spend(team.service_in_project, 2)
        events = reached(api, team.account)
        assert _shown(events) == [
            ("project", 80, spent, 10_000_000),
            ("project", 100, _charged(first, second, third, fourth), 10_000_000),
        ]
        assert events[1]["api_key_id"] == team.ada_in_project.id
        assert events[1]["member_id"] == team.ada

    def test_below_the_threshold_nothing_fires(self, hooks: Hooks) -> None:
        api = hooks.api
        team = _team(api, project_limit=10)
        team.spend(team.ada_in_project, 4)
        team.spend(team.service_in_project, 3)  # 7 of 10 cents
        team.spend(team.ada_in_default, 30)
        assert reached(api, team.account) == []

    def test_one_event_at_a_time_reaches_it(self, hooks: Hooks) -> None:
        """One event per request: PostgreSQL's lean path (metering.usage.single)."""
        api = hooks.api
        team = _team(api, project_limit=5)  # thresholds: 4 and 5 cents
        seen = []
        for key in [team.ada_in_project, team.service_in_project] * 3:
            team.spend(key, 1)
            seen.append([e["percent"] for e in reached(api, team.account)])
        assert seen == [[], [], [], [80], [80, 100], [80, 100]]

    def test_a_new_window_re_arms_it(self, hooks: Hooks) -> None:
        api = hooks.api
        team = _team(api, project_limit=10, window="day")
        team.spend(team.service_in_project, 8)
        api.clock.advance(days=1)
        team.spend(team.service_in_project, 7)  # a new day: 70% of it
        assert [e["percent"] for e in reached(api, team.account)] == [80]
        team.spend(team.ada_in_project, 1)
        events = reached(api, team.account)
        assert [(e["percent"], e["spent_microcents"]) for e in events] == [
            (80, 8_000_000),
            (80, 8_000_000),
        ]
        assert events[0]["window_starts_at"] != events[1]["window_starts_at"]


class TestMemberLimit:
    def test_the_members_keys_in_every_project_count(self, hooks: Hooks) -> None:
        api = hooks.api
        team = _team(api, ada_limit=10, window="month")
        first = team.spend(team.ada_in_default, 6)
        team.spend(team.service_in_project, 20)  # not Ada's: not counted
        assert reached(api, team.account) == []
        second = team.spend(team.ada_in_project, 5)  # 11 of 10: 80 then 100
        spent = _charged(first, second)
        start, _ = window_bounds("month", api.clock.now())
        common = {
            **_event(team, "member", team.ada_in_project, team.project, team.ada),
            "window": "month",
            "window_starts_at": format_timestamp(start),
            "spent_cents": "11",
            "spent_microcents": spent,
            "limit_cents": "10",
            "limit_microcents": 10_000_000,
        }
        assert reached(api, team.account) == [
            {**common, "percent": 80},
            {**common, "percent": 100},
        ]
        team.spend(team.ada_in_default, 3)
        assert len(reached(api, team.account)) == 2

    def test_below_the_threshold_nothing_fires(self, hooks: Hooks) -> None:
        api = hooks.api
        team = _team(api, ada_limit=10)
        team.spend(team.ada_in_default, 4)
        team.spend(team.ada_in_project, 3)  # 7 of 10
        team.spend(team.service_in_project, 30)
        assert reached(api, team.account) == []


class TestEveryScope:
    def test_one_batch_reaches_the_project_the_member_and_the_key_each_once(
        self, hooks: Hooks
    ) -> None:
        api = hooks.api
        team = _team(api, project_limit=20, ada_limit=10, window="day")
        response = api.admin(
            "PATCH",
            f"/admin/v1/api-keys/{team.ada_in_project.id}",
            json={"spend_limit_cents": 5, "spend_limit_window": "day"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["spend_limit_cents"] == 5
        batch = team.spend(team.ada_in_project, 16)  # 80% of the project, past Ada's and the key's
        spent = _charged(batch)
        events = reached(api, team.account)
        assert sorted(_shown(events)) == sorted(
            [
                ("project", 80, spent, 20_000_000),
                ("member", 80, spent, 10_000_000),
                ("member", 100, spent, 10_000_000),
                ("key", 80, spent, 5_000_000),
                ("key", 100, spent, 5_000_000),
            ]
        )
        for event in events:
            assert (event["api_key_id"], event["project_id"], event["member_id"]) == (
                team.ada_in_project.id,
                team.project,
                team.ada,
            )
        # 80 before 100 within each scope.
        for scope in ("member", "key"):
            assert [e["percent"] for e in events if e["limit_scope"] == scope] == [80, 100]
        team.spend(team.ada_in_project, 1)
        assert len(reached(api, team.account)) == 5

    def test_a_project_and_member_without_limits_fire_nothing(self, hooks: Hooks) -> None:
        api = hooks.api
        team = _team(api)
        # Unmarked: the ingest reads no project or member limit for this account.
        assert _marked(api, team.account) is False
        team.spend(team.ada_in_project, 30)
        team.spend(team.ada_in_default, 30)
        assert reached(api, team.account) == []
        response = api.admin(
            "PATCH", f"/admin/v1/members/{team.ada}", json={"spend_limit_cents": 100}
        )
        assert response.status_code == 200, response.text
        assert _marked(api, team.account) is True
        team.spend(team.ada_in_project, 20)  # 80 of 100 cents
        (event,) = reached(api, team.account)
        assert (event["limit_scope"], event["member_id"], event["percent"]) == (
            "member",
            team.ada,
            80,
        )


def _marked(api: Api, account: str) -> bool:
    """Whether the account is marked as having project or member limits."""
    with api.database.reading() as session:
        found = session.execute(select(Account.scope_limits).where(Account.id == account))
        return bool(found.scalar_one())
