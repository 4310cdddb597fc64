"""Migration 0015 turns every existing account's balance into credit grants without changing
any balance: on a database made by the migrations before it, with data in it, on both
backends; and it goes down again."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from metering import migrate
from tests.conftest import BACKENDS, fresh_database

AT = datetime(2026, 11, 1, tzinfo=UTC)

# account -> its entries in order: (kind, amount); the expected (category, remaining) of each
# grant in creation order, and the deficit.
BOOKS: dict[str, tuple[list[tuple[str, int]], list[tuple[str, int]], int]] = {
    "acct_fifo": (
        [("grant", 100), ("charge", -30), ("grant", 50), ("charge", -90), ("adjustment", 20)],
        [("paid", 0), ("paid", 30), ("adjustment", 20)],
        0,
    ),
    "acct_deficit": (
        [("grant", 10), ("charge", -25), ("adjustment", -5)],
        [("paid", 0)],
        20,
    ),
    "acct_paid_off": (
        # the charge ran 15 beyond the first grant; the second grant paid that off first
        [("grant", 10), ("charge", -25), ("grant", 40)],
        [("paid", 0), ("paid", 25)],
        0,
    ),
    "acct_empty": ([], [], 0),
    "acct_charges_only": ([("charge", -7), ("charge", 0)], [], 7),
}


def _seed(connection: Any) -> None:
    for account_id, (entries, _, _) in BOOKS.items():
        balance = sum(amount for _, amount in entries)
        connection.execute(
            text(
                "INSERT INTO accounts (id, name, billing, balance_microcents, held_microcents, "
                "created_at) VALUES (:id, :id, 'prepaid', :balance, 0, :at)"
            ),
            {"id": account_id, "balance": balance, "at": AT},
        )
        for number, (kind, amount) in enumerate(entries):
            keyed = kind != "charge"
            connection.execute(
                text(
                    "INSERT INTO ledger_entries (account_id, kind, amount_microcents, "
                    "idempotency_key, request_fingerprint, note, created_at) "
                    "VALUES (:a, :kind, :amount, :key, :fp, :note, :at)"
                ),
                {
                    "a": account_id,
                    "kind": kind,
                    "amount": amount,
                    "key": f"k{number}" if keyed else None,
                    "fp": "0" * 64 if keyed else None,
                    "note": "n" if keyed else None,
                    "at": AT,
                },
            )


@pytest.mark.parametrize("backend", BACKENDS)
def test_existing_balances_become_grants(backend: str, tmp_path: Path) -> None:
    with fresh_database(backend, tmp_path) as url:
        migrate.upgrade(url, "0012")
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                _seed(connection)
            migrate.upgrade(url, "0015")
            with engine.connect() as connection:
                for account_id, (entries, grants, deficit) in BOOKS.items():
                    balance, stored_deficit = connection.execute(
                        text(
                            "SELECT balance_microcents, deficit_microcents FROM accounts "
                            "WHERE id = :a"
                        ),
                        {"a": account_id},
                    ).one()
                    assert balance == sum(amount for _, amount in entries), account_id
                    assert stored_deficit == deficit, account_id
                    rows = connection.execute(
                        text(
                            "SELECT g.category, g.remaining_microcents, g.priority, g.expires_at, "
                            "g.status, e.grant_id = g.id FROM credit_grants AS g JOIN "
                            "ledger_entries AS e ON e.id = g.entry_id WHERE g.account_id = :a "
                            "ORDER BY g.entry_id"
                        ),
                        {"a": account_id},
                    ).all()
                    assert [(r[0], r[1]) for r in rows] == grants, account_id
                    assert all(r[2] == 50 and r[3] is None and r[4] == "active" for r in rows)
                    assert all(r[5] for r in rows)
                    remainders = sum(r[1] for r in rows)
                    assert remainders - deficit == balance, account_id
                    # What was spent before is recorded as allocations (the roll-forward's
                    # first day shows it): each grant's consumed part, and the deficit.
                    spent = connection.execute(
                        text(
                            "SELECT kind, SUM(amount_microcents) FROM credit_allocations "
                            "WHERE account_id = :a GROUP BY kind"
                        ),
                        {"a": account_id},
                    ).all()
                    granted = sum(amount for _, amount in entries if amount > 0)
                    assert dict(spent) == {
                        k: v
                        for k, v in (("spend", granted - remainders), ("deficit", deficit))
                        if v
                    }, account_id
            # Migration 0035 sums the allocation rows into days, and its downgrade back.
            by_key = (
                "SELECT account_id, kind, COALESCE(grant_id, ''), SUM(amount_microcents) "
                "FROM {} GROUP BY account_id, kind, COALESCE(grant_id, '') "
                "ORDER BY account_id, kind, COALESCE(grant_id, '')"
            )
            with engine.connect() as connection:
                allocated = connection.execute(text(by_key.format("credit_allocations"))).all()
            assert allocated
            migrate.upgrade(url, "0035")
            with engine.connect() as connection:
                days = text(by_key.format("credit_allocation_days"))
                assert connection.execute(days).all() == allocated
            migrate.downgrade(url, "0034")
            with engine.connect() as connection:
                assert connection.execute(text(by_key.format("credit_allocations"))).all() == (
                    allocated
                )
            migrate.downgrade(url, "0012")
            with engine.connect() as connection:
                balances = dict(
                    connection.execute(text("SELECT id, balance_microcents FROM accounts")).all()
                )
            assert balances == {a: sum(x for _, x in e) for a, (e, _, _) in BOOKS.items()}
        finally:
            engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_balance_that_disagrees_with_its_ledger_stops_the_migration(
    backend: str, tmp_path: Path
) -> None:
    with fresh_database(backend, tmp_path) as url:
        migrate.upgrade(url, "0012")
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                _seed(connection)
                connection.execute(
                    text("UPDATE accounts SET balance_microcents = 1 WHERE id = 'acct_fifo'")
                )
            with pytest.raises(RuntimeError, match="acct_fifo"):
                migrate.upgrade(url, "0015")
        finally:
            engine.dispose()
