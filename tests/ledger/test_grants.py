"""Credit grants: the spending order as a pure function (tables and properties), the same
order as settlement's set-based SQL on both backends (against the pure function), and the
routes, deficit, adjustments, voids, expiry at the instant and ``metering verify``'s pending."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from metering.kit.timeutil import format_timestamp
from metering.ledger.grants import Grant, allocate, pay_off, spending_key
from metering.ledger.settlement import ChargeToSettle
from metering.models import Account, CreditAllocationDay, CreditGrant, LedgerEntry
from metering.states.grants import reads_as
from metering.usage.recording import settle_usage
from metering.usage.verify import verify
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    assert_error,
    authorize,
    create_account,
    create_key,
    credits_of,
    exact_json,
    unique,
)
from tests.ledger.helpers import books, expected_estimate, prepaid

HOUR = timedelta(hours=1)
_event_ids = iter(range(5_000_000, 10**9))


def g(
    name: str,
    priority: int,
    expires: int | None,
    entry: int,
    remaining: int,
    status: str = "active",
) -> Grant:
    """A grant for the tables: ``expires`` in hours after NOW (None: never)."""
    at = None if expires is None else NOW + expires * HOUR
    return Grant(name, priority, at, entry, remaining, status)


# -- the pure function ---------------------------------------------------------------------------

TABLE = [
    # (grants, amount, takes, shortfall)
    ([g("a", 50, None, 1, 100)], 30, [("a", 30)], 0),
    ([g("a", 50, None, 1, 100)], 130, [("a", 100)], 30),
    ([g("a", 50, None, 1, 100)], 0, [], 0),
    ([], 5, [], 5),
    # priority first, whatever the creation order
    (
        [g("paid", 50, None, 1, 100), g("promo", 10, None, 2, 100)],
        150,
        [("promo", 100), ("paid", 50)],
        0,
    ),
    # at equal priority the sooner expiry first, never-expiring last
    (
        [g("never", 50, None, 1, 10), g("late", 50, 48, 2, 10), g("soon", 50, 2, 3, 10)],
        25,
        [("soon", 10), ("late", 10), ("never", 5)],
        0,
    ),
    # ties on priority and expiry: creation order
    ([g("b", 50, 5, 2, 10), g("a", 50, 5, 1, 10)], 15, [("a", 10), ("b", 5)], 0),
    # priority beats expiry
    ([g("soon", 60, 1, 1, 10), g("later", 40, 100, 2, 10)], 12, [("later", 10), ("soon", 2)], 0),
    # expired (at exactly NOW: expires 0 hours after), voided, depleted grants are not live
    (
        [
            g("expired", 0, 0, 1, 10),
            g("voided", 0, None, 2, 10, "voided"),
            g("gone", 0, None, 3, 0),
            g("live", 90, None, 4, 10),
        ],
        15,
        [("live", 10)],
        5,
    ),
]


@pytest.mark.parametrize(("grants", "amount", "takes", "shortfall"), TABLE)
def test_spending_order_table(
    grants: list[Grant], amount: int, takes: list[tuple[str, int]], shortfall: int
) -> None:
    result = allocate(grants, amount, NOW)
    assert list(result.takes) == takes
    assert result.shortfall == shortfall


def test_a_later_grant_pays_off_the_deficit_first() -> None:
    assert pay_off(30, 100) == (30, 70)
    assert pay_off(300, 100) == (100, 0)
    assert pay_off(0, 100) == (0, 100)


def test_status_precedence() -> None:
    assert reads_as("voided", 0, NOW - HOUR, NOW) == "voided"
    assert reads_as("active", 0, NOW, NOW) == "expired"  # at expires_at exactly
    assert reads_as("active", 5, NOW + timedelta(microseconds=1), NOW) == "active"
    assert reads_as("active", 0, None, NOW) == "depleted"
    assert reads_as("expired", 0, NOW - HOUR, NOW) == "expired"


grant_lists = st.lists(
    st.builds(
        Grant,
        id=st.uuids().map(str),
        priority=st.integers(0, 100),
        expires_at=st.none() | st.integers(-3, 5).map(lambda h: NOW + h * HOUR),
        entry_id=st.integers(1, 10**6),
        remaining=st.integers(0, 10**12),
        status=st.sampled_from(["active", "active", "active", "voided", "expired"]),
    ),
    max_size=12,
    unique_by=(lambda grant: grant.id, lambda grant: grant.entry_id),
)


@given(grants=grant_lists, amount=st.integers(0, 2 * 10**12))
def test_allocation_properties(grants: list[Grant], amount: int) -> None:
    result = allocate(grants, amount, NOW)
    by_id = {grant.id: grant for grant in grants}
    live = sorted(
        (
            x
            for x in grants
            if x.status == "active"
            and x.remaining > 0
            and (x.expires_at is None or x.expires_at > NOW)
        ),
        key=lambda x: (x.priority, x.expires_at is None, x.expires_at or NOW, x.entry_id),
    )
    # Conservation: what the grants pay plus the shortfall is the amount.
    assert sum(take for _, take in result.takes) + result.shortfall == amount
    # Only live grants pay, none beyond its remainder, each at most once, nothing of zero.
    assert len({grant_id for grant_id, _ in result.takes}) == len(result.takes)
    for grant_id, take in result.takes:
        assert 0 < take <= by_id[grant_id].remaining
    # A prefix of the live grants in order, all but the last spent whole.
    assert [grant_id for grant_id, _ in result.takes] == [x.id for x in live[: len(result.takes)]]
    for grant_id, take in result.takes[:-1]:
        assert take == by_id[grant_id].remaining
    # A shortfall only when every live grant is spent whole.
    if result.shortfall:
        assert len(result.takes) == len(live)
        assert result.takes == tuple((x.id, x.remaining) for x in live)
    # The sort key is the documented one.
    assert [spending_key(x) for x in live] == sorted(spending_key(x) for x in live)


# -- through the service ---------------------------------------------------------------------------


def post_grant(api: Api, account: str, amount_cents: Any, **body: Any) -> dict[str, Any]:
    """A grant through the API (``amount_cents`` may be a Decimal, sent as an exact number)."""
    import json

    amount = format(amount_cents, "f") if isinstance(amount_cents, Decimal) else str(amount_cents)
    fields = json.dumps({"idempotency_key": unique("g"), **body})
    response = api.client.post(
        f"/admin/v1/accounts/{account}/grants",
        content=f'{{"amount_cents": {amount}, {fields[1:]}',
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    return dict(exact_json(response))


def adjust(api: Api, account: str, amount_cents: Any) -> dict[str, Any]:
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/adjustments",
        json={"amount_cents": amount_cents, "idempotency_key": unique("adj"), "reason": "fix"},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def charge(api: Api, account: str, key_id: str, *amounts: int) -> None:
    """One batch of charges of ``account`` through settlement (``SETTLE_USAGE``)."""
    charges = [
        ChargeToSettle(account, key_id, unique("r"), next(_event_ids), amount, None, True)
        for amount in amounts
    ]
    with api.database.unit_of_work() as session:
        # On Citus the one-account form, as the ingest there.
        mine = account if api.backend == "citus" else None
        settle_usage(session, charges, (), api.clock.now(), account_id=mine)
        session.commit()


def stored_grants(api: Api, account: str) -> list[Any]:
    with api.database.unit_of_work() as session:
        return list(
            session.execute(
                select(CreditGrant)
                .where(CreditGrant.account_id == account)
                .order_by(CreditGrant.entry_id)
            ).scalars()
        )


def deficit_of(api: Api, account: str) -> int:
    with api.database.unit_of_work() as session:
        return int(
            session.execute(
                select(Account.deficit_microcents).where(Account.id == account)
            ).scalar_one()
        )


def entries(api: Api, account: str) -> list[Any]:
    with api.database.unit_of_work() as session:
        return list(
            session.execute(
                select(LedgerEntry)
                .where(LedgerEntry.account_id == account)
                .order_by(LedgerEntry.id)
            ).scalars()
        )


def assert_books(api: Api, account: str) -> None:
    """Σ remainders of active grants − deficit = balance = Σ ledger entries."""
    balance, ledger = books(api, account)
    held = sum(x.remaining_microcents for x in stored_grants(api, account) if x.status == "active")
    assert balance == ledger == held - deficit_of(api, account)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(
        st.tuples(
            st.sampled_from(["paid", "promotional"]),
            st.none() | st.integers(0, 100),
            st.none() | st.integers(1, 6),  # expires this many hours after NOW
            st.integers(1, 5_000_000),  # microcents
        ),
        min_size=1,
        max_size=6,
    ),
    batches=st.lists(st.lists(st.integers(0, 4_000_000), min_size=1, max_size=5), max_size=3),
    later=st.integers(0, 7),
)
def test_settlement_allocates_as_the_pure_function(
    api: Api,
    specs: list[tuple[str, int | None, int | None, int]],
    batches: list[list[int]],
    later: int,
) -> None:
    """The set-based SQL of settlement and the pure function agree, batch after batch, with
    the clock moved past some expiries in between."""
    api.clock.set(NOW)
    account = create_account(api)
    key = create_key(api, account)
    for category, priority, hours, amount in specs:
        body: dict[str, Any] = {"category": category}
        if priority is not None:
            body["priority"] = priority
        if hours is not None:
            body["expires_at"] = format_timestamp(NOW + hours * HOUR)
        post_grant(api, account, Decimal(amount) / 1_000_000, **body)
    api.clock.set(NOW + later * HOUR)
    deficit = 0
    for batch in batches:
        now = api.clock.now()
        model = [
            Grant(x.id, x.priority, x.expires_at, x.entry_id, x.remaining_microcents, x.status)
            for x in stored_grants(api, account)
        ]
        expected = allocate(model, sum(batch), now)
        charge(api, account, key.id, *batch)
        after = {x.id: x.remaining_microcents for x in stored_grants(api, account)}
        taken = dict(expected.takes)
        for grant in model:
            if (
                grant.status == "active"
                and grant.expires_at is not None
                and grant.expires_at <= now
            ):
                assert after[grant.id] == 0  # its expiry was written by this debit
            else:
                assert after[grant.id] == grant.remaining - taken.get(grant.id, 0)
        deficit += expected.shortfall
        assert deficit_of(api, account) == deficit
        assert_books(api, account)
        api.clock.advance(seconds=1800)


class TestRoutes:
    def test_defaults_and_validation(self, api: Api) -> None:
        account = create_account(api)
        paid = post_grant(api, account, 1)
        promo = post_grant(api, account, 2, category="promotional")
        assert (paid["category"], paid["priority"]) == ("paid", 50)
        assert (promo["category"], promo["priority"]) == ("promotional", 10)
        for body, param in [
            ({"expires_at": format_timestamp(NOW)}, "expires_at"),
            ({"expires_at": format_timestamp(NOW - HOUR)}, "expires_at"),
            ({"expires_at": 1234}, "expires_at"),
            ({"priority": 101}, "priority"),
            ({"priority": -1}, "priority"),
            ({"priority": "5"}, "priority"),
            ({"category": "adjustment"}, "category"),
        ]:
            response = api.admin(
                "POST",
                f"/admin/v1/accounts/{account}/grants",
                json={"amount_cents": 1, "idempotency_key": unique("bad"), **body},
            )
            assert response.status_code == 400, (body, response.text)
            assert response.json()["error"]["param"] == param, body

    def test_idempotency_with_defaults_applied(self, api: Api) -> None:
        account = create_account(api)
        body = {"amount_cents": 5, "idempotency_key": "promo-1", "category": "promotional"}
        path = f"/admin/v1/accounts/{account}/grants"
        first = api.admin("POST", path, json=body)
        assert first.status_code == 201
        again = api.admin("POST", path, json={**body, "priority": 10})
        assert again.status_code == 200 and again.json() == first.json()
        conflict = api.admin("POST", path, json={**body, "priority": 11})
        assert_error(conflict, 409, "idempotency_conflict", param="idempotency_key")

    def test_a_replay_after_expiry_returns_the_grant_as_it_stands(self, api: Api) -> None:
        account = create_account(api)
        expires = format_timestamp(NOW + HOUR)
        body = {"amount_cents": 5, "idempotency_key": "exp-1", "expires_at": expires}
        path = f"/admin/v1/accounts/{account}/grants"
        assert api.admin("POST", path, json=body).status_code == 201
        api.clock.set(NOW + 2 * HOUR)
        replay = api.admin("POST", path, json=body)
        assert replay.status_code == 200, replay.text
        assert replay.json()["status"] == "expired"
        assert replay.json()["remaining_microcents"] == 0

    def test_list_get_and_404(self, api: Api) -> None:
        account = create_account(api)
        made = [post_grant(api, account, n) for n in (1, 2, 3)]
        listed = api.admin("GET", f"/admin/v1/accounts/{account}/grants?limit=2").json()
        assert [x["id"] for x in listed["data"]] == [made[2]["id"], made[1]["id"]]
        assert listed["has_more"] is True
        rest = api.admin(
            "GET", f"/admin/v1/accounts/{account}/grants?after={listed['next_cursor']}"
        ).json()
        assert [x["id"] for x in rest["data"]] == [made[0]["id"]]
        one = api.admin("GET", f"/admin/v1/grants/{made[0]['id']}")
        assert one.status_code == 200 and one.json() == exact_json_of(made[0])
        assert_error(
            api.admin("GET", "/admin/v1/grants/grant_nope"), 404, "not_found", param="grant_id"
        )
        missing = api.admin("GET", "/admin/v1/accounts/acct_nope/grants")
        assert_error(missing, 404, "not_found", param="account_id")
        assert_error(
            api.admin("POST", "/admin/v1/grants/grant_nope/void", json={}),
            404,
            "not_found",
            param="grant_id",
        )


def exact_json_of(body: dict[str, Any]) -> dict[str, Any]:
    """A body read with exact decimals, as plain JSON would read it."""
    import json

    from metering.kit import jsonenc

    return dict(json.loads(jsonenc.dumps(body)))


class TestSpending:
    def test_charges_spend_promotional_first_then_a_deficit_paid_off(self, api: Api) -> None:
        setup = prepaid(api)
        paid = post_grant(api, setup.account, 1)  # 1,000,000 microcents
        promo = post_grant(api, setup.account, 1, category="promotional")
        charge(api, setup.account, setup.key.id, 600_000, 600_000)
        remaining = {x.id: x.remaining_microcents for x in stored_grants(api, setup.account)}
        assert remaining == {promo["id"]: 0, paid["id"]: 800_000}
        charge(api, setup.account, setup.key.id, 1_300_000)
        assert deficit_of(api, setup.account) == 500_000
        body = credits_of(api, setup.key)
        assert body["balance_microcents"] == -500_000
        assert body["deficit_microcents"] == 500_000 and body["grants"] == []
        later = post_grant(api, setup.account, 2)
        assert later["remaining_microcents"] == 1_500_000
        assert deficit_of(api, setup.account) == 0
        assert credits_of(api, setup.key)["balance_microcents"] == 1_500_000
        with api.database.unit_of_work() as session:
            kinds = [
                (row.kind, row.grant_id, row.amount_microcents)
                for row in session.execute(
                    select(CreditAllocationDay).where(
                        CreditAllocationDay.account_id == setup.account
                    )
                ).scalars()
            ]
        # One row per day, kind and grant: the paid grant's two parts are one sum.
        assert sorted(kinds, key=str) == sorted(
            [
                ("spend", promo["id"], 1_000_000),
                ("spend", paid["id"], 1_000_000),
                ("deficit", "", 500_000),
                ("payoff", later["id"], 500_000),
            ],
            key=str,
        )
        assert_books(api, setup.account)

    def test_adjustments(self, api: Api) -> None:
        setup = prepaid(api)
        promo = post_grant(api, setup.account, 1, category="promotional")
        entry = adjust(api, setup.account, 2)
        assert entry["kind"] == "adjustment" and entry["grant_id"].startswith("grant_")
        made = api.admin("GET", f"/admin/v1/grants/{entry['grant_id']}").json()
        assert (made["category"], made["priority"], made["expires_at"]) == ("adjustment", 50, None)
        negative = adjust(api, setup.account, -1.5)
        assert negative["grant_id"] is None
        remaining = {x.id: x.remaining_microcents for x in stored_grants(api, setup.account)}
        assert remaining == {promo["id"]: 0, entry["grant_id"]: 1_500_000}
        adjust(api, setup.account, -2)
        assert deficit_of(api, setup.account) == 500_000
        assert credits_of(api, setup.key)["balance_microcents"] == -500_000
        assert_books(api, setup.account)

    def test_void(self, api: Api) -> None:
        setup = prepaid(api)
        made = post_grant(api, setup.account, 3)
        charge(api, setup.account, setup.key.id, 1_000_000)
        response = api.admin(
            "POST", f"/admin/v1/grants/{made['id']}/void", json={"reason": "chargeback"}
        )
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "voided"
        assert response.json()["remaining_microcents"] == 0
        assert credits_of(api, setup.key)["balance_microcents"] == 0
        void = entries(api, setup.account)[-1]
        assert (void.kind, void.amount_microcents, void.grant_id) == (
            "void",
            -2_000_000,
            made["id"],
        )
        again = api.admin("POST", f"/admin/v1/grants/{made['id']}/void", json={})
        assert again.status_code == 200 and again.json() == response.json()
        assert len(entries(api, setup.account)) == 3  # nothing more
        listing = api.admin("GET", f"/admin/v1/accounts/{setup.account}/ledger").json()["data"]
        assert listing[0]["kind"] == "void" and listing[0]["reason"] == "chargeback"
        assert_books(api, setup.account)
        # One audit event for the void that forfeited something, none for the second call.
        audit = api.admin(
            "GET",
            "/admin/v1/audit-events",
            params={"account_id": setup.account, "action": "grant.void"},
        )
        assert audit.status_code == 200, audit.text
        events = audit.json()["data"]
        assert len(events) == 1, events
        assert (events[0]["target_type"], events[0]["target_id"]) == ("credit_grant", made["id"])
        assert events[0]["changes"] == {
            "status": "voided",
            "forfeited_microcents": 2_000_000,
            "reason": "chargeback",
        }


class TestExpiry:
    def test_the_boundary_is_expires_at_exactly(self, api: Api) -> None:
        """A charge recorded a microsecond before ``expires_at`` is paid by the grant; one
        recorded at ``expires_at`` is not."""
        expires = NOW + HOUR
        for offset, paid_by_grant in ((timedelta(microseconds=-1), True), (timedelta(0), False)):
            api.clock.set(NOW)
            setup = prepaid(api)
            made = post_grant(
                api, setup.account, 1, category="promotional", expires_at=format_timestamp(expires)
            )
            api.clock.set(expires + offset)
            charge(api, setup.account, setup.key.id, 400_000)
            stored = {x.id: x for x in stored_grants(api, setup.account)}[made["id"]]
            if paid_by_grant:
                assert stored.remaining_microcents == 600_000
                assert deficit_of(api, setup.account) == 0
            else:
                assert (stored.remaining_microcents, stored.status) == (0, "expired")
                assert deficit_of(api, setup.account) == 400_000
                expiry = [e for e in entries(api, setup.account) if e.kind == "expiry"]
                assert [(e.amount_microcents, e.grant_id, e.effective_at) for e in expiry] == [
                    (-1_000_000, made["id"], expires)
                ]
                listing = api.admin("GET", f"/admin/v1/accounts/{setup.account}/ledger").json()
                (shown,) = [x for x in listing["data"] if x["kind"] == "expiry"]
                assert shown["effective_at"] == format_timestamp(expires)
                assert shown["created_at"] == format_timestamp(expires + offset)
            assert_books(api, setup.account)

    def test_credits_and_authorizations_see_the_expiry_at_the_instant(self, api: Api) -> None:
        setup = prepaid(api)
        estimate = expected_estimate(1000, 100, GLM_RATES)
        expires = NOW + HOUR
        post_grant(
            api,
            setup.account,
            Decimal(estimate) / 1_000_000,
            category="promotional",
            expires_at=format_timestamp(expires),
        )
        api.clock.set(expires - timedelta(microseconds=1))
        body = credits_of(api, setup.key)
        assert body["available_microcents"] == estimate and len(body["grants"]) == 1
        api.clock.set(expires)
        body = credits_of(api, setup.key)
        assert body["balance_microcents"] == 0 and body["grants"] == []
        refused = authorize(api, setup.key, setup.model, prompt_tokens=1000, max_tokens=100)
        assert_error(refused, 402, "insufficient_credits")
        # Nothing written yet: verify counts it as pending, not a mismatch.
        with api.database.reading() as session:
            report = verify(session, api.clock.now())
        # (other tests here book charges without usage events: only this account matters)
        assert [m for m in report.mismatches or [] if setup.account in m] == []
        assert report.pending_expiries >= 1
        assert books(api, setup.account) == (estimate, estimate)
        # The next balance write writes it.
        post_grant(api, setup.account, Decimal(estimate) / 1_000_000)
        assert books(api, setup.account) == (estimate, estimate)
        granted = authorize(api, setup.key, setup.model, prompt_tokens=1000, max_tokens=100)
        assert granted.status_code == 200, granted.text
        assert_books(api, setup.account)

    def test_promotional_before_paid_in_credits_order(self, api: Api) -> None:
        account = create_account(api)
        key = create_key(api, account)
        paid = post_grant(api, account, 1)
        late = post_grant(
            api, account, 1, category="promotional", expires_at=format_timestamp(NOW + 5 * HOUR)
        )
        soon = post_grant(
            api, account, 1, category="promotional", expires_at=format_timestamp(NOW + HOUR)
        )
        body = credits_of(api, key)
        assert [x["id"] for x in body["grants"]] == [soon["id"], late["id"], paid["id"]]
        assert body["grants"][0]["expires_at"] == format_timestamp(NOW + HOUR)
