"""The settlement of ``settle_usage``, which the ingest transaction calls: usage that happened
is always billed in full, whatever the hold; the hold it names (or its request id's) is closed. Both
backends; the holds are placed and observed through the real API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from metering.ledger.settlement import ChargeToSettle
from metering.models import LedgerEntry
from metering.usage.recording import settle_usage
from tests.conftest import NOW, Api
from tests.factories import GLM_RATES, assert_error, authorize, credits_of, exact_json, expect
from tests.ledger.helpers import Setup, books, expected_estimate, holds, prepaid

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)
BALANCE = 1_000_000  # one cent
_event_ids = iter(range(10_000, 10**9))


def charge(
    setup: Setup,
    amount: int,
    *,
    hold: dict[str, Any] | None = None,
    request_id: str | None = None,
    name_hold: bool = True,
    prepaid: bool = True,
) -> ChargeToSettle:
    return ChargeToSettle(
        account_id=setup.account,
        api_key_id=setup.key.id,
        request_id=request_id or (hold["request_id"] if hold else "no-hold"),
        usage_event_id=next(_event_ids),
        charge_microcents=amount,
        authorization_id=hold["id"] if hold and name_hold else None,
        prepaid=prepaid,
    )


def settle(api: Api, *charges: ChargeToSettle) -> None:
    with api.database.unit_of_work() as session:
        if api.backend == "citus":  # account by account, as the ingest there (one-account form)
            for account in sorted({c.account_id for c in charges}):
                mine = [c for c in charges if c.account_id == account]
                settle_usage(session, mine, (), api.clock.now(), account_id=account)
        else:
            settle_usage(session, list(charges), (), api.clock.now())
        session.commit()


def status_of(api: Api, setup: Setup, hold: dict[str, Any]) -> tuple[str, int | None]:
    [row] = [row for row in holds(api, setup.account) if row.id == hold["id"]]
    return row.status, row.usage_event_id


def hold_for(api: Api, setup: Setup, **fields: Any) -> dict[str, Any]:
    response = authorize(api, setup.key, setup.model, **fields)
    assert response.status_code == 200, response.text
    return dict(response.json())


class TestSettle:
    def test_within_the_hold(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = hold_for(api, setup)
        item = charge(setup, ESTIMATE - 1000, hold=hold)
        api.clock.advance(seconds=30)
        settle(api, item)
        assert status_of(api, setup, hold) == ("settled", item.usage_event_id)
        [row] = holds(api, setup.account)
        assert row.closed_at == NOW + timedelta(seconds=30)
        body = credits_of(api, setup.key)
        assert (body["balance_microcents"], body["held_microcents"]) == (
            BALANCE - ESTIMATE + 1000,
            0,
        )
        assert books(api, setup.account) == (BALANCE - ESTIMATE + 1000,) * 2

    def test_above_the_hold_is_charged_in_full_and_may_go_negative(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = hold_for(api, setup)
        settle(api, charge(setup, 3 * BALANCE, hold=hold))
        body = credits_of(api, setup.key)
        assert body["balance_microcents"] == -2 * BALANCE
        assert body["available_microcents"] == -2 * BALANCE
        # A negative balance blocks new authorizations, with the balance as it is.
        response = authorize(api, setup.key, setup.model)
        assert_error(response, 402, "insufficient_credits")
        assert exact_json(response)["error"]["credits_available_cents"] == -2
        assert books(api, setup.account) == (-2 * BALANCE, -2 * BALANCE)

    def test_an_expired_hold_is_settled_and_no_longer_counts_as_lost(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = hold_for(api, setup)
        api.clock.set(NOW + timedelta(hours=2))
        settle(api, charge(setup, 500, hold=hold))
        assert status_of(api, setup, hold)[0] == "settled"
        assert books(api, setup.account)[0] == BALANCE - 500

    def test_a_voided_hold_stays_voided_and_the_usage_is_still_billed(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = hold_for(api, setup)
        expect(api.gateway("DELETE", f"/v1/authorizations/{hold['id']}"), 200)
        settle(api, charge(setup, 700, hold=hold))
        assert status_of(api, setup, hold) == ("voided", None)
        assert books(api, setup.account) == (BALANCE - 700, BALANCE - 700)

    def test_a_hold_already_settled_keeps_its_first_event(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = hold_for(api, setup)
        first = charge(setup, 100, hold=hold)
        settle(api, first)
        settle(api, charge(setup, 200, hold=hold, request_id="another-request"))
        assert status_of(api, setup, hold) == ("settled", first.usage_event_id)
        assert books(api, setup.account) == (BALANCE - 300, BALANCE - 300)

    def test_no_hold_at_all(self, api: Api) -> None:
        setup = prepaid(api, 1)
        settle(api, charge(setup, 250))
        assert books(api, setup.account) == (BALANCE - 250, BALANCE - 250)

    def test_without_an_authorization_id_the_request_ids_hold_is_settled(self, api: Api) -> None:
        setup = prepaid(api, 1)
        hold = hold_for(api, setup, request_id="match-me")
        other = hold_for(api, setup, request_id="leave-me")
        settle(api, charge(setup, 10, hold=hold, name_hold=False))
        assert status_of(api, setup, hold)[0] == "settled"
        assert status_of(api, setup, other) == ("active", None)

    def test_a_hold_of_another_account_is_never_touched(self, api: Api) -> None:
        mine, theirs = prepaid(api, 1), prepaid(api, 1)
        their_hold = hold_for(api, theirs, request_id="same-id")
        hold_for(api, mine, request_id="same-id")
        wrong = ChargeToSettle(
            account_id=mine.account,
            api_key_id=mine.key.id,
            request_id="same-id",
            usage_event_id=next(_event_ids),
            charge_microcents=5,
            authorization_id=their_hold["id"],
            prepaid=True,
        )
        settle(api, wrong)
        assert status_of(api, theirs, their_hold) == ("active", None)
        assert books(api, theirs.account)[0] == BALANCE
        assert books(api, mine.account)[0] == BALANCE - 5

    def test_unbilled_usage_settles_the_hold_without_a_debit(self, api: Api) -> None:
        setup = prepaid(api, billing="unbilled")
        hold = hold_for(api, setup)
        settle(api, charge(setup, 0, hold=hold, prepaid=False))
        assert status_of(api, setup, hold)[0] == "settled"
        assert books(api, setup.account) == (0, 0)
        with api.database.unit_of_work() as session:
            assert (
                session.execute(
                    select(LedgerEntry.id).where(LedgerEntry.account_id == setup.account)
                ).all()
                == []
            )

    def test_a_batch_across_accounts_with_a_zero_charge(self, api: Api) -> None:
        first, second = prepaid(api, 1), prepaid(api, 1)
        holds_first = [hold_for(api, first) for _ in range(3)]
        hold_second = hold_for(api, second)
        settle(
            api,
            charge(second, 40, hold=hold_second),
            *(
                charge(first, amount, hold=h)
                for amount, h in zip((1, 2, 0), holds_first, strict=True)
            ),
        )
        assert books(api, first.account) == (BALANCE - 3, BALANCE - 3)
        assert books(api, second.account) == (BALANCE - 40, BALANCE - 40)
        assert credits_of(api, first.key)["held_microcents"] == 0
        response = api.admin("GET", f"/admin/v1/accounts/{first.account}/ledger")
        entries = response.json()["data"]
        assert [(e["kind"], e["amount_microcents"]) for e in entries][:3] == [
            ("charge", 0),
            ("charge", -2),
            ("charge", -1),
        ]
        assert all(e["api_key_id"] == first.key.id and e["usage_event_id"] for e in entries[:3])

    def test_in_one_batch_the_first_event_for_a_hold_is_recorded_on_it(self, api: Api) -> None:
        setup = prepaid(api, 1)
        named = hold_for(api, setup, request_id="named")
        by_request = hold_for(api, setup, request_id="by-request")
        voided = hold_for(api, setup, request_id="voided")
        expect(api.gateway("DELETE", f"/v1/authorizations/{voided['id']}"), 200)
        first = charge(setup, 1, hold=by_request, name_hold=False)
        items = [
            first,
            charge(setup, 2, hold=by_request),  # names it too: settled already by `first`
            charge(setup, 3, hold=named, request_id="other-request"),
            charge(setup, 4, hold=named, request_id="again"),
            charge(setup, 5, hold=voided, name_hold=False),
        ]
        settle(api, *items)
        assert status_of(api, setup, by_request) == ("settled", first.usage_event_id)
        assert status_of(api, setup, named) == ("settled", items[2].usage_event_id)
        assert status_of(api, setup, voided) == ("voided", None)
        assert books(api, setup.account) == (BALANCE - 15, BALANCE - 15)

    def test_nothing_to_settle(self, api: Api) -> None:
        """No charges: no ledger entry anywhere, and the account's hold stays active."""
        setup = prepaid(api, 1)
        hold = hold_for(api, setup)
        with api.database.unit_of_work() as session:
            entries = session.execute(select(func.count()).select_from(LedgerEntry)).scalar_one()
        settle(api)
        with api.database.unit_of_work() as session:
            after = session.execute(select(func.count()).select_from(LedgerEntry)).scalar_one()
        assert after == entries
        assert status_of(api, setup, hold) == ("active", None)
        assert books(api, setup.account) == (BALANCE, BALANCE)
        assert credits_of(api, setup.key)["held_microcents"] == ESTIMATE
