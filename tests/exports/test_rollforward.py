"""The daily credit roll-forward (credits.csv, credits.parquet) on both backends: the rows of a
scenario computed by hand, the identities for every row and account against an independent
computation from the ledger, byte-identical re-runs, the manifest, a day without usage, and a
late expiry that re-exports its day."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from sqlalchemy import func, select, update

from metering.kit.clock import FrozenClock
from metering.kit.timeutil import format_timestamp
from metering.ledger.settlement import ChargeToSettle
from metering.models import CreditRollforward, LedgerEntry
from metering.scheduler import Scheduler
from metering.usage.recording import settle_usage
from tests.conftest import Api
from tests.exports.helpers import exporter, manifest, read_csv, sha256
from tests.factories import create_account, create_key, unique

M = 1_000_000
D1, D2, D3 = date(2026, 11, 27), date(2026, 11, 28), date(2026, 11, 29)
_ids = itertools.count(7_000_000)


def at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def start_rollforward(api: Api, day: date) -> None:
    with api.database.unit_of_work() as session:
        session.execute(update(CreditRollforward).values(start_date=day))
        session.commit()


def post(api: Api, path: str, amount: Decimal, **body: Any) -> dict[str, Any]:
    import json

    fields = json.dumps({"idempotency_key": unique("i"), **body})
    response = api.client.post(
        path,
        content=f'{{"amount_cents": {format(amount, "f")}, {fields[1:]}',
        headers={**api.admin_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def grant(api: Api, account: str, microcents: int, **body: Any) -> dict[str, Any]:
    return post(api, f"/admin/v1/accounts/{account}/grants", Decimal(microcents) / M, **body)


def adjust(api: Api, account: str, microcents: int) -> dict[str, Any]:
    path = f"/admin/v1/accounts/{account}/adjustments"
    return post(api, path, Decimal(microcents) / M, reason="fix")


def charge(api: Api, account: str, key: str, microcents: int) -> None:
    item = ChargeToSettle(account, key, unique("r"), next(_ids), microcents, None, True)
    with api.database.unit_of_work() as session:
        settle_usage(session, [item], (), api.clock.now())
        session.commit()


def balance_at(api: Api, account: str, end: datetime) -> int:
    """The independent figure: the account's ledger entries that count before ``end``."""
    with api.database.reading() as session:
        entries = session.execute(
            select(
                LedgerEntry.amount_microcents, LedgerEntry.created_at, LedgerEntry.effective_at
            ).where(LedgerEntry.account_id == account)
        ).all()
    return sum(amount for amount, created, effective in entries if (effective or created) < end)


def rows(directory: Path) -> list[list[str]]:
    table = read_csv(directory / "credits.csv")
    assert table[0] == [
        "date",
        "account_id",
        "category",
        "opening_microcents",
        "granted_microcents",
        "spent_microcents",
        "expired_microcents",
        "voided_microcents",
        "refunded_microcents",
        "closing_microcents",
    ]
    parquet = pq.read_table(directory / "credits.parquet").to_pydict()
    assert [[str(parquet[name][i]) for name in table[0]] for i in range(len(table) - 1)] == table[
        1:
    ]
    return table[1:]


def check_identities(api: Api, day_rows: dict[date, list[list[str]]], accounts: list[str]) -> None:
    for day, table in day_rows.items():
        for row in table:
            opening, granted, spent, expired, voided, refunded, closing = map(int, row[3:])
            assert closing == opening + granted - spent - expired - voided - refunded, row
            if row[2] == "deficit":
                assert opening <= 0 and closing <= 0, row
        end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
        for account in accounts:
            closing = sum(int(row[9]) for row in table if row[1] == account)
            assert closing == balance_at(api, account, end), (day, account)
        previous = day_rows.get(day - timedelta(days=1))
        if previous is not None:
            closings = {(r[1], r[2]): int(r[9]) for r in previous}
            for row in table:
                assert int(row[3]) == closings.get((row[1], row[2]), 0), row


def test_the_roll_forward_of_two_days(fresh_api: Api, tmp_path: Path) -> None:
    api = fresh_api
    start_rollforward(api, D1)
    api.clock.set(at(D1, 10))
    a, b = sorted([create_account(api), create_account(api)])
    key_a, key_b = create_key(api, a).id, create_key(api, b).id
    paid = grant(api, a, 10 * M)
    promo = grant(api, a, 8 * M, category="promotional", expires_at=format_timestamp(at(D2, 6)))
    grant(api, b, 1 * M)
    api.clock.set(at(D1, 11))
    charge(api, a, key_a, 7 * M)  # the promotional grant first
    api.clock.set(at(D1, 12))
    charge(api, b, key_b, 3 * M)  # 1 from the grant, 2 of deficit
    api.clock.set(at(D2, 7))
    charge(api, a, key_a, 1 * M)  # writes the promotional grant's expiry (1 left), dated 06:00
    api.clock.set(at(D2, 8))
    grant(api, b, 5 * M)  # pays off the deficit of 2 first
    api.clock.set(at(D2, 9))
    voided = api.admin("POST", f"/admin/v1/grants/{paid['id']}/void", json={"reason": "x"})
    assert voided.status_code == 200 and voided.json()["status"] == "voided", voided.text
    api.clock.set(at(D2, 10))
    adjust(api, a, 2 * M)
    adjust(api, a, -M // 2)
    assert promo["priority"] == 10

    export_dir = tmp_path / "exports"
    jobs = Scheduler(
        api.database,
        api.settings.model_copy(update={"export_dir": export_dir, "export_after_minutes": 15}),
        FrozenClock(at(D2, 0) + timedelta(days=1, minutes=30)),
        runner="test",
    )
    report = jobs.tick()
    assert report.ok, report
    assert [(r.day, r.outcome) for r in report.exports] == [(D1, "exported"), (D2, "exported")]
    got = {day: rows(export_dir / day.isoformat()) for day in (D1, D2)}
    m = str(M)
    assert got[D1] == [
        [str(D1), a, "paid", "0", str(10 * M), "0", "0", "0", "0", str(10 * M)],
        [str(D1), a, "promotional", "0", str(8 * M), str(7 * M), "0", "0", "0", m],
        [str(D1), b, "deficit", "0", "0", str(2 * M), "0", "0", "0", str(-2 * M)],
        [str(D1), b, "paid", "0", m, m, "0", "0", "0", "0"],
    ]
    assert got[D2] == [
        [str(D2), a, "adjustment", "0", str(2 * M), str(M // 2), "0", "0", "0", str(3 * M // 2)],
        [str(D2), a, "paid", str(10 * M), "0", m, "0", str(9 * M), "0", "0"],
        [str(D2), a, "promotional", m, "0", "0", m, "0", "0", "0"],
        [str(D2), b, "deficit", str(-2 * M), str(2 * M), "0", "0", "0", "0", "0"],
        [str(D2), b, "paid", "0", str(5 * M), str(2 * M), "0", "0", "0", str(3 * M)],
    ]
    check_identities(api, got, [a, b])

    # In the manifest with checksums; a re-run writes the same bytes.
    for day in (D1, D2):
        directory = export_dir / day.isoformat()
        listed = {entry["file"]: entry for entry in manifest(directory)["files"]}
        for name in ("credits.csv", "credits.parquet"):
            assert listed[name]["sha256"] == sha256(directory / name)
            assert listed[name]["rows"] == len(got[day])
        before = {n: (directory / n).read_bytes() for n in ("credits.csv", "credits.parquet")}
        again, _ = exporter(api, export_dir, at(D2, 0) + timedelta(days=1, hours=1))
        assert again.export_day(day).outcome == "exported"
        assert {n: (directory / n).read_bytes() for n in before} == before
        # Also with --account: the roll-forward is rewritten whole.
        assert again.export_day(day, account_id=a).outcome == "exported"
        assert {n: (directory / n).read_bytes() for n in before} == before
    assert jobs.tick().exports == []  # nothing due any more


def test_a_day_without_usage_and_a_late_expiry(fresh_api: Api, tmp_path: Path) -> None:
    api = fresh_api
    start_rollforward(api, D1)
    api.clock.set(at(D1, 10))
    account = create_account(api)
    grant(api, account, 4 * M, category="promotional", expires_at=format_timestamp(at(D2, 6)))
    export_dir = tmp_path / "exports"
    # By hand, before anything wrote the expiry: D2 and D3 are exported without it...
    by_hand, _ = exporter(api, export_dir, at(D3, 0) + timedelta(days=1, hours=1))
    for day in (D1, D2, D3):
        assert by_hand.export_day(day).outcome == "exported"
    for day in (D2, D3):
        assert rows(export_dir / str(day)) == [
            [str(day), account, "promotional", str(4 * M), "0", "0", "0", "0", "0", str(4 * M)]
        ]
    # ... then a balance write two days later writes the expiry dated in D2: D2 is due again,
    # and so is D3, whose opening it moves.
    api.clock.set(at(D3, 0) + timedelta(days=1, hours=2))
    grant(api, account, 1 * M)
    with api.database.reading() as session:
        assert (
            session.execute(select(func.count()).where(LedgerEntry.kind == "expiry")).scalar_one()
            == 1
        )
    due = by_hand.due_days(at(D3, 0) + timedelta(days=1, hours=3), timedelta(minutes=15))
    assert due == [D2, D3]
    for day in due:
        assert by_hand.export_day(day).outcome == "exported"
    got = {day: rows(export_dir / str(day)) for day in (D1, D2, D3)}
    assert got[D2] == [
        [str(D2), account, "promotional", str(4 * M), "0", "0", str(4 * M), "0", "0", "0"]
    ]
    assert got[D3] == []  # nothing left, nothing moved
    check_identities(api, got, [account])
