"""The single-event path (PostgreSQL): a request of one new, billable event is recorded in two
statements on the event loop (``metering.usage.single``, ``metering_record_usage``); every other
single event goes the general way, and both book exactly what the batch path books — on a Citus
cluster too, where the path runs its account's one-account statements."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from metering.kit.timeutil import format_timestamp
from metering.models import CreditAllocationDay, CreditGrant, WebhookEvent
from metering.usage import endpoints
from tests import oracle
from tests.conftest import CITUS, NOW, Api, migrated_database, require_postgresql, running_api
from tests.factories import (
    GLM_RATES,
    authorize,
    chat_usage,
    create_account,
    create_key,
    credits_of,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.security.helpers import assert_books_reconcile


@pytest.fixture
def pg_api(plain_pg_url: str, tmp_path: Path) -> Iterator[Api]:
    """A PostgreSQL database of its own: ``metering verify`` checks the whole database, and the
    shared one holds what other tests planted on purpose. One server's: the single-event path
    is PostgreSQL's (on a cluster an event takes the per-account transaction: ``lean_api``)."""
    with running_api("postgresql", plain_pg_url, tmp_path) as api:
        api.clock.set(NOW)
        yield api


@pytest.fixture(params=["postgresql", *(["citus"] if CITUS else [])])
def lean_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """As ``pg_api``, and on the Citus cluster when the run has it."""
    if request.param == "postgresql":
        require_postgresql()
    with (
        migrated_database(request.param, tmp_path) as url,
        running_api(request.param, url, tmp_path) as api,
    ):
        api.clock.set(NOW)
        yield api


def _expected_total(prompt: int, completion: int, cached: int) -> int:
    """The charge in microcents at GLM-5.3's rates, by the price oracle."""
    return oracle.charge(oracle.Tokens(prompt, cached, completion), GLM_RATES).total_microcents


def _general_path_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any) -> Any:
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(endpoints, "_record_batch", refuse)


def test_a_new_billable_event_is_recorded_and_settled_in_two_statements(
    pg_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = priced_model(pg_api, NOW - timedelta(days=1))
    account = create_account(pg_api)
    key = create_key(pg_api, account)
    grant(pg_api, account, 100)
    hold = authorize(pg_api, key, model).json()
    _general_path_forbidden(monkeypatch)

    event = usage_event(
        key, model, NOW, chat_usage(4508, 20, cached=4352), request_id=hold["request_id"]
    )
    body = ingest(pg_api, event)

    total = _expected_total(4508, 20, 4352)
    assert total == 87_460  # the reference docs' chat example at GLM-5.3's rates
    assert body["recorded"] == 1 and body["data"][0]["charge"]["total_microcents"] == total
    credits = credits_of(pg_api, key)
    assert credits["balance_microcents"] == 100_000_000 - total
    assert credits["held_microcents"] == 0  # the hold, found by its request_id, is settled
    assert_books_reconcile(pg_api)


def test_every_other_single_event_goes_the_general_way_and_is_recorded_once(
    lean_api: Api,
) -> None:
    model = priced_model(lean_api, NOW - timedelta(days=1))
    key = create_key(lean_api, create_account(lean_api))
    event = usage_event(key, model, NOW)
    assert ingest(lean_api, event)["recorded"] == 1
    # Taken: the function writes nothing and the general path classifies it.
    again = ingest(lean_api, event)
    assert again["duplicates"] == 1
    assert again["data"][0]["charge"] == ingest(lean_api, event)["data"][0]["charge"]
    changed = {**event, "usage": chat_usage(1000, 101)}
    assert ingest(lean_api, changed)["data"][0]["error"]["code"] == "idempotency_conflict"
    # Not billable now: never reaches the function.
    unknown = usage_event(key, "no-such-model", NOW)
    assert ingest(lean_api, unknown)["data"][0]["error"]["code"] == "model_not_found"
    assert ingest(lean_api, {"request_id": "x"})["quarantined"] == 1
    assert ingest(lean_api, {"no": "request id"})["rejected"] == 1
    report = lean_api.as_key(key.secret, "GET", f"/v1/usage?starting_at={NOW.date()}").json()
    assert report["totals"]["requests"] == 1
    assert_books_reconcile(lean_api)


def test_one_by_one_books_exactly_what_one_batch_books(lean_api: Api) -> None:
    model = priced_model(lean_api, NOW - timedelta(days=5))
    unbilled = create_key(lean_api, create_account(lean_api, "unbilled"))
    singles, batch = [create_key(lean_api, create_account(lean_api)) for _ in range(2)]

    def events(key: Any) -> list[dict[str, Any]]:
        return [
            usage_event(
                key,
                model,
                NOW - timedelta(hours=n * 7, minutes=n),
                chat_usage(1000 + 37 * n, 10 + n, cached=13 * n, reasoning=n % 3),
                request_id=f"req-{n}",
            )
            for n in range(12)
        ]

    for event in events(singles) + events(unbilled):
        assert ingest(lean_api, event)["recorded"] == 1
    assert ingest(lean_api, *events(batch))["recorded"] == 12

    def seen(key: Any) -> tuple[Any, ...]:
        start = (NOW - timedelta(days=4)).date()
        reports = [
            lean_api.as_key(key.secret, "GET", f"/v1/usage?starting_at={start}{query}").json()
            for query in ("", "&bucket_width=1h")
        ]
        return tuple((report["totals"], report["data"]) for report in reports)

    assert seen(singles) == seen(batch)
    assert credits_of(lean_api, singles) == credits_of(lean_api, batch)
    # No credit: billed anyway, each event at the oracle's charge.
    due = oracle.total(events(singles), GLM_RATES)
    assert credits_of(lean_api, singles)["balance_microcents"] == -due < 0
    unbilled_totals = seen(unbilled)[0][0]
    assert unbilled_totals["requests"] == 12 and unbilled_totals["cost_microcents"] is None
    assert_books_reconcile(lean_api)


# One cent per event: 1000 prompt tokens at 1000 cents per million, output free.
CENT_RATES = (1_000_000_000, 0, 0)


def _spent_by_category(api: Api, account: str) -> dict[tuple[str | None, str], int]:
    """Σ of the account's allocation days by (category of the grant, kind)."""
    with api.database.reading() as session:
        rows = session.execute(
            select(
                CreditGrant.category,
                CreditAllocationDay.kind,
                func.sum(CreditAllocationDay.amount_microcents),
            )
            .select_from(CreditAllocationDay)
            .outerjoin(CreditGrant, CreditGrant.id == CreditAllocationDay.grant_id)
            .where(CreditAllocationDay.account_id == account)
            .group_by(CreditGrant.category, CreditAllocationDay.kind)
        ).all()
    return {(category, kind): int(total) for category, kind, total in rows}


def _event_types(api: Api, account: str) -> list[str]:
    with api.database.reading() as session:
        return list(
            session.execute(
                select(WebhookEvent.type)
                .where(WebhookEvent.account_id == account)
                .order_by(WebhookEvent.id)
            ).scalars()
        )


def test_one_by_one_spends_the_grants_and_crosses_as_one_batch_does(
    pg_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each single event's debit (its own program run: the allocation, the deficit and the
    threshold events only when it crosses) ends where one batch of the same events ends."""
    model = priced_model(pg_api, NOW - timedelta(days=1), CENT_RATES)
    keys = []
    for _ in range(2):
        account = create_account(pg_api)
        promotional = pg_api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/grants",
            json={
                "amount_cents": 2,
                "idempotency_key": unique("g"),
                "category": "promotional",
                "expires_at": format_timestamp(NOW + timedelta(days=1)),
            },
        )
        assert promotional.status_code == 201, promotional.text
        grant(pg_api, account, 3)  # paid: spent after the promotional one
        threshold = pg_api.admin(
            "PATCH", f"/admin/v1/accounts/{account}", json={"low_balance_threshold_cents": 4}
        )
        assert threshold.status_code == 200, threshold.text
        keys.append(create_key(pg_api, account))
    singles, batch = keys

    def events(key: Any) -> list[dict[str, Any]]:
        return [usage_event(key, model, NOW, chat_usage(1000, 0)) for _ in range(7)]

    _general_path_forbidden(monkeypatch)
    for event in events(singles):  # 5 cents of credit → −2: promotional, paid, then deficit
        assert ingest(pg_api, event)["recorded"] == 1
    monkeypatch.undo()
    assert ingest(pg_api, *events(batch))["recorded"] == 7

    credits = credits_of(pg_api, singles)
    assert credits["balance_microcents"] == -2_000_000
    assert credits["deficit_microcents"] == 2_000_000 and credits["grants"] == []
    assert credits == credits_of(pg_api, batch)
    expected = {
        ("promotional", "spend"): 2_000_000,
        ("paid", "spend"): 3_000_000,
        (None, "deficit"): 2_000_000,
    }
    assert _spent_by_category(pg_api, singles.account_id) == expected
    assert _spent_by_category(pg_api, batch.account_id) == expected
    # The low balance (5 → 3, at the second event) and the depletion (→ 0, at the fifth), once
    # each, as the batch's one move (5 → −2) crosses both.
    crossed = ["credit.balance_low", "credit.balance_depleted"]
    assert _event_types(pg_api, singles.account_id) == crossed
    assert _event_types(pg_api, batch.account_id) == crossed
    assert_books_reconcile(pg_api)
