"""The held counter beside each balance (metering.ledger.placement): it always equals the sum of
the holds it counts, every active hold of a prepaid account is counted, releases stop counting
at the account's next check-and-hold, and ``metering verify`` names a counter that drifted.
Both backends, unless noted; expected figures are computed here from the rules."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import create_engine, select, text, update

from metering.ledger.authorizations import expire_holds
from metering.ledger.service import held_counter_mismatches
from metering.ledger.settlement import ChargeToSettle
from metering.models import Account, Authorization
from metering.usage.recording import settle_usage
from metering.usage.verify import verify
from tests.conftest import NOW, Api
from tests.factories import GLM_RATES, assert_error, authorize, credits_of, expect
from tests.ledger.helpers import Setup, expected_estimate, holds, prepaid
from tests.threads import Workers

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)
ESTIMATE_CENTS = Decimal(ESTIMATE) / 10**6
TTL = timedelta(hours=1)
BALANCE = 1_000_000  # one cent


def counter(api: Api, account_id: str) -> int:
    with api.database.unit_of_work() as session:
        return int(
            session.execute(
                select(Account.held_microcents).where(Account.id == account_id)
            ).scalar_one()
        )


def mismatches_of(api: Api, account_id: str) -> list[str]:
    """What ``metering verify`` would say about this account's holds (the shared test database
    holds other tests' accounts too)."""
    with api.database.unit_of_work() as session:
        return [m for m in held_counter_mismatches(session) if account_id in m]


def counted(api: Api, account_id: str) -> dict[str, tuple[str, bool]]:
    return {row.id: (row.status, row.counted) for row in holds(api, account_id)}


def place(api: Api, setup: Setup, **fields: Any) -> dict[str, Any]:
    response = authorize(api, setup.key, setup.model, **fields)
    assert response.status_code == 200, response.text
    return dict(response.json())


def settle(api: Api, setup: Setup, hold: dict[str, Any], charge: int) -> None:
    with api.database.unit_of_work() as session:
        settle_usage(
            session,
            [
                ChargeToSettle(
                    account_id=setup.account,
                    api_key_id=setup.key.id,
                    request_id=hold["request_id"],
                    usage_event_id=4242,
                    charge_microcents=charge,
                    authorization_id=hold["id"],
                    prepaid=True,
                )
            ],
            (),
            api.clock.now(),
        )
        session.commit()


class TestCounter:
    def test_every_release_stops_counting_at_the_next_check(self, api: Api) -> None:
        setup = prepaid(api, 1)
        made = [place(api, setup) for _ in range(4)]
        assert counter(api, setup.account) == 4 * ESTIMATE
        assert mismatches_of(api, setup.account) == []

        expect(api.gateway("DELETE", f"/v1/authorizations/{made[0]['id']}"), 200)
        settle(api, setup, made[1], 1234)
        # Releasing never waits for the account's lock: the counter still counts both holds,
        # while credits (the holds in force) and verify already agree with the releases.
        assert counter(api, setup.account) == 4 * ESTIMATE
        assert credits_of(api, setup.key)["held_microcents"] == 2 * ESTIMATE
        assert mismatches_of(api, setup.account) == []

        fresh = place(api, setup)
        assert counter(api, setup.account) == 3 * ESTIMATE
        assert counted(api, setup.account) == {
            made[0]["id"]: ("voided", False),
            made[1]["id"]: ("settled", False),
            made[2]["id"]: ("active", True),
            made[3]["id"]: ("active", True),
            fresh["id"]: ("active", True),
        }
        assert credits_of(api, setup.key)["held_microcents"] == 3 * ESTIMATE
        assert mismatches_of(api, setup.account) == []

    def test_a_hold_past_its_expiry_becomes_expired_at_the_next_check(self, api: Api) -> None:
        setup = prepaid(api, 1)
        old = place(api, setup)
        api.clock.advance(minutes=30)
        young = place(api, setup)
        api.clock.set(NOW + TTL)  # `old` expires at this instant; `young` has 30 minutes left
        assert credits_of(api, setup.key)["held_microcents"] == ESTIMATE
        newest = place(api, setup)
        assert counted(api, setup.account) == {
            old["id"]: ("expired", False),
            young["id"]: ("active", True),
            newest["id"]: ("active", True),
        }
        assert counter(api, setup.account) == 2 * ESTIMATE
        assert mismatches_of(api, setup.account) == []
        listed = api.admin(
            "GET",
            "/admin/v1/authorizations",
            params={"status": "expired", "account_id": setup.account},
        ).json()["data"]
        assert [hold["id"] for hold in listed] == [old["id"]]
        # A late usage event still settles it: it got its usage, so it is no longer lost.
        settle(api, setup, old, 10)
        assert counted(api, setup.account)[old["id"]] == ("settled", False)
        assert counter(api, setup.account) == 2 * ESTIMATE

    def test_the_tidy_up_and_the_check_agree(self, api: Api) -> None:
        setup = prepaid(api, 1)
        first, second = place(api, setup), place(api, setup)
        api.clock.set(NOW + TTL)
        with api.database.unit_of_work() as session:
            assert expire_holds(session, NOW + TTL) >= 2
            session.commit()
        # Tidied up: 'expired' but still counted until the account's next check.
        assert counted(api, setup.account) == {
            first["id"]: ("expired", True),
            second["id"]: ("expired", True),
        }
        assert mismatches_of(api, setup.account) == []
        assert credits_of(api, setup.key)["available_microcents"] == BALANCE
        third = place(api, setup)
        assert counter(api, setup.account) == ESTIMATE
        assert counted(api, setup.account)[third["id"]] == ("active", True)
        assert mismatches_of(api, setup.account) == []

    def test_a_refusal_still_stops_counting_what_was_released(self, api: Api) -> None:
        setup = prepaid(api, ESTIMATE_CENTS)
        hold = place(api, setup)
        assert_error(authorize(api, setup.key, setup.model), 402, "insufficient_credits")
        expect(api.gateway("DELETE", f"/v1/authorizations/{hold['id']}"), 200)
        # Too large for the whole balance: refused, yet the void is collected meanwhile.
        response = authorize(api, setup.key, setup.model, max_tokens=10_000)
        assert_error(response, 402, "insufficient_credits")
        assert counter(api, setup.account) == 0
        assert place(api, setup)["estimate_microcents"] == ESTIMATE
        assert counter(api, setup.account) == ESTIMATE

    def test_unbilled_accounts_hold_without_counting(self, api: Api) -> None:
        setup = prepaid(api, billing="unbilled")
        hold = place(api, setup)
        assert counted(api, setup.account) == {hold["id"]: ("active", False)}
        assert counter(api, setup.account) == 0
        assert credits_of(api, setup.key)["held_microcents"] == ESTIMATE
        assert mismatches_of(api, setup.account) == []


class TestVerify:
    def test_a_count_that_drifted_is_named(self, api: Api) -> None:
        setup = prepaid(api, 1)
        place(api, setup)
        with api.database.unit_of_work() as session:
            session.execute(update(Account).where(Account.id == setup.account).values(held_count=2))
            session.commit()
        try:
            assert mismatches_of(api, setup.account) == [
                f"account {setup.account}: held count 2, counted holds 1"
            ]
        finally:
            with api.database.unit_of_work() as session:
                session.execute(
                    update(Account).where(Account.id == setup.account).values(held_count=1)
                )
                session.commit()
        assert mismatches_of(api, setup.account) == []

    def test_a_counter_that_drifted_is_named(self, api: Api) -> None:
        setup = prepaid(api, 1)
        place(api, setup)
        with api.database.unit_of_work() as session:
            session.execute(
                update(Account)
                .where(Account.id == setup.account)
                .values(held_microcents=Account.held_microcents + 1)
            )
            session.commit()
        try:
            assert mismatches_of(api, setup.account) == [
                f"account {setup.account}: held counter {ESTIMATE + 1} microcents, "
                f"counted holds {ESTIMATE}"
            ]
            with api.database.unit_of_work() as session:
                report = verify(session)
            assert any(setup.account in m and "held counter" in m for m in report.mismatches or [])
        finally:
            with api.database.unit_of_work() as session:
                session.execute(
                    update(Account)
                    .where(Account.id == setup.account)
                    .values(held_microcents=Account.held_microcents - 1)
                )
                session.commit()
        assert mismatches_of(api, setup.account) == []

    def test_an_active_hold_left_uncounted_is_named(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = place(api, setup)
        with api.database.unit_of_work() as session:
            session.execute(
                update(Authorization).where(Authorization.id == hold["id"]).values(counted=False)
            )
            session.execute(
                update(Account)
                .where(Account.id == setup.account)
                .values(held_microcents=0, held_count=0)
            )
            session.commit()
        assert mismatches_of(api, setup.account) == [
            f"account {setup.account}: active hold {hold['id']} is not counted in its held counter"
        ]
        expect(api.gateway("DELETE", f"/v1/authorizations/{hold['id']}"), 200)
        assert mismatches_of(api, setup.account) == []


def _call_in_thread(call: Any, timeout: float = 10.0) -> Any:
    """Run ``call`` in a thread; fail (instead of hanging the suite) if it blocks."""
    outcome: list[Any] = []
    worker = Workers()
    worker.start(lambda: outcome.append(call()), daemon=True)
    try:
        worker.join(timeout)  # raises what the call raised
    except AssertionError as error:
        if "still running" in str(error):
            raise AssertionError("blocked: it waited for a lock it should have skipped") from error
        raise
    return outcome[0]


class TestLocks:
    """Settlement locks holds, then accounts; the check-and-hold locks its account, then the
    holds it stops counting. It skips holds locked elsewhere, so the two never deadlock."""

    def test_a_hold_being_settled_is_skipped_not_waited_for(self, pg_api: Api) -> None:
        api = pg_api
        setup = prepaid(api, ESTIMATE_CENTS)
        hold = place(api, setup)
        api.clock.set(NOW + TTL)  # the hold has expired: it no longer counts
        engine = create_engine(api.url)
        try:
            with engine.connect() as settlement:
                # A settlement in progress: the hold locked first, the account not yet.
                # (By its account too, as a cluster's statements lock only within a shard.)
                settlement.execute(
                    text(
                        "SELECT id FROM authorizations WHERE account_id = :account AND id = :id "
                        "FOR NO KEY UPDATE"
                    ),
                    {"account": setup.account, "id": hold["id"]},
                )
                response = _call_in_thread(lambda: authorize(api, setup.key, setup.model))
                # Skipped, so still counted for this one check: refused, never more credit
                # than there is.
                assert_error(response, 402, "insufficient_credits")
                # ... and the account is free for the settlement to take: no deadlock.
                settlement.execute(
                    text(
                        "UPDATE accounts SET balance_microcents = balance_microcents WHERE id = :id"
                    ),
                    {"id": setup.account},
                )
                settlement.rollback()
            assert place(api, setup)["estimate_microcents"] == ESTIMATE
            assert counted(api, setup.account)[hold["id"]] == ("expired", False)
            assert mismatches_of(api, setup.account) == []
        finally:
            engine.dispose()

    def test_the_tidy_up_skips_holds_locked_elsewhere(self, pg_api: Api) -> None:
        api = pg_api
        setup = prepaid(api, 1)
        locked, free = place(api, setup), place(api, setup)
        engine = create_engine(api.url)
        try:
            with engine.connect() as other:
                other.execute(
                    text(
                        "SELECT id FROM authorizations WHERE account_id = :account AND id = :id "
                        "FOR NO KEY UPDATE"
                    ),
                    {"account": setup.account, "id": locked["id"]},
                )

                def tidy() -> int:
                    with api.database.unit_of_work() as session:
                        result = expire_holds(session, NOW + TTL)
                        session.commit()
                        return result

                assert _call_in_thread(tidy) >= 1
                other.rollback()
            statuses = {k: v[0] for k, v in counted(api, setup.account).items()}
            assert statuses == {locked["id"]: "active", free["id"]: "expired"}
        finally:
            engine.dispose()
