"""The ledger's sign rule and the allocation days' kinds as the schema enforces them, on every
backend: PostgreSQL holds them in compact forms of its own (migration 0006), SQLite as the models
write them; both must allow and refuse the same rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from metering.kit.ranges import INT64_MAX
from tests.conftest import APP_BACKENDS, migrated_database

AMOUNTS = (-INT64_MAX - 1, -5, -1, 0, 1, 7, INT64_MAX)


def _allowed(kind: str, amount: int) -> bool:
    """The rule, written out here: grants add, adjustments change, charges never add, expiries
    and voids take away; no other kind."""
    return {
        "grant": amount > 0,
        "adjustment": amount != 0,
        "charge": amount <= 0,
        "expiry": amount < 0,
        "void": amount < 0,
    }.get(kind, False)


@pytest.mark.parametrize("backend", APP_BACKENDS)
def test_each_kind_and_sign_of_a_ledger_entry(backend: str, tmp_path: Path) -> None:
    with migrated_database(backend, tmp_path) as url:
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO accounts (id, name, billing, balance_microcents, "
                        "held_microcents, created_at) VALUES ('acct_checks', 'x', 'prepaid', 0, 0, "
                        "'2026-01-01 00:00:00')"
                    )
                )
            stored = []
            for kind in ("grant", "adjustment", "charge", "expiry", "void", "refund", "Grant"):
                for amount in AMOUNTS:
                    insert = text(
                        "INSERT INTO ledger_entries (account_id, kind, amount_microcents, "
                        "created_at) VALUES ('acct_checks', :kind, :amount, '2026-01-01 00:00:00')"
                    )
                    try:
                        with engine.begin() as connection:
                            connection.execute(insert, {"kind": kind, "amount": amount})
                    except IntegrityError as refused:
                        assert not _allowed(kind, amount), (kind, amount, refused)
                        assert "ck_ledger_entries_" in str(refused.orig), refused
                    else:
                        assert _allowed(kind, amount), (kind, amount)
                        stored.append((kind, amount))
            with engine.connect() as connection:
                rows = connection.execute(
                    text("SELECT kind, amount_microcents FROM ledger_entries ORDER BY id")
                ).all()
            assert [tuple(row) for row in rows] == stored
            assert len(stored) == 3 + 6 + 4 + 3 + 3  # the allowed pairs of AMOUNTS
        finally:
            engine.dispose()


@pytest.mark.parametrize("backend", APP_BACKENDS)
def test_the_kinds_of_an_allocation_day(backend: str, tmp_path: Path) -> None:
    with migrated_database(backend, tmp_path) as url:
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO accounts (id, name, billing, balance_microcents, "
                        "held_microcents, created_at) VALUES ('acct_checks', 'x', 'prepaid', 0, 0, "
                        "'2026-01-01 00:00:00')"
                    )
                )
            insert = text(
                "INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, "
                "amount_microcents) VALUES ('acct_checks', '2026-01-01', :kind, :grant, 5)"
            )
            for kind, grant in (("spend", "cg_1"), ("payoff", "cg_1"), ("deficit", "")):
                with engine.begin() as connection:
                    connection.execute(insert, {"kind": kind, "grant": grant})
            for kind, grant in (("refund", "cg_1"), ("Spend", "cg_2"), ("", "cg_3")):
                with pytest.raises(IntegrityError) as refused, engine.begin() as connection:
                    connection.execute(insert, {"kind": kind, "grant": grant})
                assert "ck_credit_allocation_days_kind" in str(refused.value.orig), refused.value
            with engine.connect() as connection:
                kinds = connection.execute(
                    text("SELECT kind FROM credit_allocation_days ORDER BY kind")
                ).scalars()
                assert list(kinds) == ["deficit", "payoff", "spend"]
        finally:
            engine.dispose()
