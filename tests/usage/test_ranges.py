"""Ranges (docs/api.md#ranges): an event whose charge would take a stored amount or sum beyond a
signed 64-bit integer is quarantined ``invalid_usage``, and the rest of its batch, other accounts'
events included, is recorded as if it were not there; nothing ever becomes a float (SQLite)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import text

from metering.kit.ranges import INT64_MAX, INT64_MIN
from tests import oracle
from tests.conftest import NOW, Api
from tests.factories import (
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.usage.helpers import balance, events_of, quarantine_of, rollups_of

AT = NOW - timedelta(minutes=10)
MAX_RATE = 10**12  # microcents per million tokens: the schema's maximum
MAX_TOKENS = 2**31 - 1
BIG_USAGE = chat_usage(MAX_TOKENS, MAX_TOKENS)
# The charge of BIG_USAGE at the maximum rates (each component rounded half up).
BIG_CHARGE = 2 * ((MAX_TOKENS * MAX_RATE + 500_000) // 1_000_000)
MAX_RATES = (MAX_RATE, MAX_RATE, MAX_RATE)


def adjust(api: Api, account_id: str, amount_cents: int) -> None:
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account_id}/adjustments",
        json={"amount_cents": amount_cents, "idempotency_key": unique("adj"), "reason": "test"},
    )
    assert response.status_code == 201, response.text


def max_rate_model(api: Api) -> str:
    return priced_model(
        api,
        NOW - timedelta(days=1),
        rates=(MAX_RATE, MAX_RATE, MAX_RATE),
        context_length=MAX_TOKENS,
    )


def typeofs(api: Api) -> set[str]:
    """The storage classes of every money column of every row (SQLite only)."""
    with api.database.unit_of_work() as session:
        return set(
            session.execute(
                text(
                    "SELECT typeof(balance_microcents) FROM accounts UNION "
                    "SELECT typeof(amount_microcents) FROM ledger_entries UNION "
                    "SELECT typeof(cost_microcents) FROM usage_rollups UNION "
                    "SELECT typeof(total_microcents) FROM usage_events"
                )
            ).scalars()
        )


def results_by_status(body: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in body["data"]:
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    return counts


class TestBalanceOutOfRange:
    def test_events_beyond_the_range_are_quarantined_and_the_rest_is_recorded(
        self, api: Api
    ) -> None:
        model = max_rate_model(api)
        # A balance near the bottom of the range: -9×10^18 microcents.
        near = create_account(api)
        adjust(api, near, -9 * 10**12)
        start = balance(api, near)
        room = start - INT64_MIN  # how much can still be charged
        fitting = room // BIG_CHARGE
        assert 10 < fitting < 100
        near_key = create_key(api, near)
        other = create_account(api)
        grant(api, other, 100)
        other_key = create_key(api, other)
        unbilled_key = create_key(api, create_account(api, billing="unbilled"))

        big = [usage_event(near_key, model, AT, BIG_USAGE) for _ in range(fitting + 5)]
        small = [usage_event(other_key, model, AT, chat_usage(10, 1)) for _ in range(3)]
        free = [usage_event(unbilled_key, model, AT, BIG_USAGE) for _ in range(3)]
        # Interleaved: the other accounts' events come before, among and after the big ones.
        batch = [small[0], free[0], *big[:10], small[1], free[1], *big[10:], small[2], free[2]]
        body = ingest(api, *batch)

        by_id = {r["request_id"]: r for r in body["data"]}
        assert [by_id[e["request_id"]]["status"] for e in big] == ["recorded"] * fitting + [
            "quarantined"
        ] * 5
        for event in big[fitting:]:
            error = by_id[event["request_id"]]["error"]
            assert (error["code"], error["param"]) == ("invalid_usage", "usage")
        assert all(by_id[e["request_id"]]["status"] == "recorded" for e in small + free)
        assert (body["recorded"], body["quarantined"]) == (fitting + 6, 5)
        assert [r["index"] for r in body["data"]] == list(range(len(batch)))

        assert balance(api, near) == start - fitting * BIG_CHARGE >= INT64_MIN
        assert len(events_of(api, near)) == fitting
        assert len(events_of(api, other)) == 3
        entries = quarantine_of(api, near)
        assert sorted(e["request_id"] for e in entries) == sorted(
            e["request_id"] for e in big[fitting:]
        )
        assert {e["code"] for e in entries} == {"invalid_usage"}

        # Resent: the recorded ones are duplicates, the others still quarantined (once each).
        again = ingest(api, *batch)
        assert (again["duplicates"], again["quarantined"]) == (fitting + 6, 5)
        assert len(quarantine_of(api, near)) == 5
        assert balance(api, near) == start - fitting * BIG_CHARGE
        if api.backend == "sqlite":
            assert typeofs(api) == {"integer"}

    def test_a_full_batch_beyond_the_range(self, api: Api) -> None:
        """999 events of one account whose charges take its balance beyond the range after the
        first few, and one event of another account (issue 35: isolated in a fixed number of
        queries, benchmarked in bench/bench_refusals.py): the few that fit are recorded, the
        rest quarantined once each, the other account's event recorded, the money exact."""
        model = max_rate_model(api)
        near = create_account(api)
        adjust(api, near, -9 * 10**12)
        start = balance(api, near)
        fitting = (start - INT64_MIN) // BIG_CHARGE
        near_key = create_key(api, near)
        other = create_account(api)
        grant(api, other, 100)
        other_key = create_key(api, other)
        big = [usage_event(near_key, model, AT, BIG_USAGE) for _ in range(999)]
        small = usage_event(other_key, model, AT, chat_usage(10, 1))
        batch = [*big[:500], small, *big[500:]]
        body = ingest(api, *batch)
        assert [r["index"] for r in body["data"]] == list(range(1000))
        by_id = {r["request_id"]: r for r in body["data"]}
        assert [by_id[e["request_id"]]["status"] for e in big] == ["recorded"] * fitting + [
            "quarantined"
        ] * (999 - fitting)
        assert by_id[small["request_id"]]["status"] == "recorded"
        assert (body["recorded"], body["quarantined"]) == (fitting + 1, 999 - fitting)
        assert balance(api, near) == start - fitting * BIG_CHARGE
        small_charge = oracle.event_charge(small, MAX_RATES).total_microcents
        assert balance(api, other) == 100 * 10**6 - small_charge
        entries = quarantine_of(api, near)
        assert sorted(e["request_id"] for e in entries) == sorted(
            e["request_id"] for e in big[fitting:]
        )
        assert {(e["code"], e["attempts"]) for e in entries} == {("invalid_usage", 1)}
        assert len(events_of(api, near)) == fitting

        # Reprocessed: they stay, one more attempt each, the balance unchanged.
        ids = sorted(e["id"] for e in entries)
        again = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ids}).json()
        assert (again["recorded"], again["quarantined"]) == (0, 999 - fitting)
        assert [item["id"] for item in again["data"]] == ids
        assert {e["attempts"] for e in quarantine_of(api, near)} == {2}
        assert balance(api, near) == start - fitting * BIG_CHARGE

    def test_a_single_event_beyond_the_range(self, api: Api) -> None:
        """One event per request (PostgreSQL's single-event path) is quarantined the same way."""
        model = max_rate_model(api)
        account = create_account(api)
        adjust(api, account, -9 * 10**12)
        # Room for 10^12 microcents more: less than the big charge, more than a small one.
        adjust(api, account, -(INT64_MAX // 10**6 - 9 * 10**12) + 10**6)
        key = create_key(api, account)
        start = balance(api, account)
        assert start - INT64_MIN < BIG_CHARGE
        body = ingest(api, usage_event(key, model, AT, BIG_USAGE))
        (result,) = body["data"]
        assert (result["status"], result["error"]["code"]) == ("quarantined", "invalid_usage")
        assert balance(api, account) == start
        small = ingest(api, usage_event(key, model, AT, chat_usage(10, 1)))
        assert small["recorded"] == 1


class TestRollupOutOfRange:
    def test_a_rollup_never_leaves_the_range(self, api: Api) -> None:
        """A day's cost for a key reaches the top of the range: the event that would pass it is
        quarantined, the balance (granted enough) is not the limit here."""
        model = max_rate_model(api)
        account = create_account(api)
        grant(api, account, 9 * 10**12)
        key = create_key(api, account)
        fitting = INT64_MAX // BIG_CHARGE
        results: list[str] = []
        sent = 0
        while sent < fitting + 3:
            size = min(1000, fitting + 3 - sent)
            body = ingest(api, *[usage_event(key, model, AT, BIG_USAGE) for _ in range(size)])
            results.extend(r["status"] for r in body["data"])
            sent += size
        assert results == ["recorded"] * fitting + ["quarantined"] * 3
        costs = {row[5] for row in rollups_of(api, account).values()}
        assert costs == {fitting * BIG_CHARGE}
        if api.backend == "sqlite":
            assert typeofs(api) == {"integer"}


def _fail_charges_of(api: Api, account_id: str) -> tuple[str, ...]:
    """Statements making the database refuse every charge of ``account_id`` (a trigger: a real
    database error, no mock), and those that stop it."""
    if api.backend == "sqlite":
        return (
            f"CREATE TRIGGER test_refuse BEFORE INSERT ON ledger_entries "
            f"WHEN NEW.account_id = '{account_id}' BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
    return (
        *_allow_triggers(api),
        "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'refused'; END $$",
        f"CREATE TRIGGER test_refuse BEFORE INSERT ON ledger_entries FOR EACH ROW "
        f"WHEN (NEW.account_id = '{account_id}') EXECUTE FUNCTION test_refuse()",
    )


def _allow_triggers(api: Api) -> tuple[str, ...]:
    """Citus makes (and drops) a trigger of a distributed table on each of its shards, once the
    transaction allows it."""
    return ("SET LOCAL citus.enable_unsafe_triggers = on",) if api.backend == "citus" else ()


def _run(api: Api, *statements: str) -> None:
    with api.database.unit_of_work() as session:
        for statement in statements:
            session.execute(text(statement))
        session.commit()


class TestUnexpectedRefusal:
    def test_one_accounts_failure_does_not_refuse_the_others(self, fresh_api: Api) -> None:
        """An unexpected database error in one account's part: the other accounts' events are
        recorded all the same, the request fails (500), and the gateway's retry finds them
        recorded (duplicates) and the refused account's events not lost."""
        api = fresh_api
        model = priced_model(api, NOW - timedelta(days=1))
        failing, healthy = create_account(api), create_account(api)
        for account in (failing, healthy):
            grant(api, account, 100)
        failing_key, healthy_key = create_key(api, failing), create_key(api, healthy)
        batch = [
            usage_event(key, model, AT)
            for _ in range(4)
            for key in (healthy_key, failing_key, healthy_key)
        ]
        _run(api, *_fail_charges_of(api, failing))
        response = api.gateway("POST", "/v1/usage/events", json={"events": batch})
        assert response.status_code == 500, response.text
        assert len(events_of(api, healthy)) == 8
        assert events_of(api, failing) == []
        response = api.gateway("POST", "/v1/usage/events", json={"events": batch})
        assert response.status_code == 500, response.text
        assert len(events_of(api, healthy)) == 8

        drop = ["DROP TRIGGER test_refuse"]
        if api.backend != "sqlite":
            drop = [
                *_allow_triggers(api),
                "DROP TRIGGER test_refuse ON ledger_entries",
                "DROP FUNCTION test_refuse()",
            ]
        _run(api, *drop)
        body = ingest(api, *batch)
        assert (body["recorded"], body["duplicates"]) == (4, 8)
        assert len(events_of(api, failing)) == 4


class TestReprocessOutOfRange:
    def test_reprocess_keeps_it_until_the_balance_allows_it(self, api: Api) -> None:
        model = max_rate_model(api)
        account = create_account(api)
        adjust(api, account, -9 * 10**12)
        adjust(api, account, -(INT64_MAX // 10**6 - 9 * 10**12) + 10**6)
        key = create_key(api, account)
        other = create_key(api, create_account(api, billing="unbilled"))
        big = usage_event(key, model, AT, BIG_USAGE)
        body = ingest(api, big, usage_event(other, model, AT, chat_usage(5, 5, cached=6)))
        assert [r["status"] for r in body["data"]] == ["quarantined", "quarantined"]
        ids = [e["id"] for e in quarantine_of(api, account)]
        assert len(ids) == 1
        # The other entry (invalid usage of another kind) is retried in the same request.
        others = [e["id"] for e in quarantine_of(api, other.account_id)]

        response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ids + others})
        assert response.status_code == 200, response.text
        result = response.json()
        assert (result["recorded"], result["quarantined"]) == (0, 2)
        (entry,) = quarantine_of(api, account)
        assert (entry["code"], entry["attempts"]) == ("invalid_usage", 2)

        # The next day: the deficit the day's debits add up to (its allocation day, a 64-bit
        # sum) stays in range as well.
        api.clock.set(api.clock.now() + timedelta(days=1))
        adjust(api, account, 9 * 10**12)
        response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ids})
        assert response.status_code == 200, response.text
        assert response.json()["recorded"] == 1
        assert quarantine_of(api, account) == []
        assert [e.request_id for e in events_of(api, account)] == [big["request_id"]]
