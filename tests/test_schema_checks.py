"""The ledger's sign rule and the allocation days' kinds as the schema enforces them, on every
backend: PostgreSQL holds them in compact forms of its own (migrations 0006 and 0007), SQLite as
the models write them; both must allow and refuse the same rows. The lists of values PostgreSQL
holds as domains (metering.models.base ``one_of``) allow exactly their values there, and the
checks of one column it holds as domains (``checked``) allow what their rule allows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.dialects.postgresql import DOMAIN
from sqlalchemy.exc import DataError, IntegrityError

from metering.kit.ranges import INT64_MAX
from metering.models import Base
from tests.conftest import APP_BACKENDS, SERVER_BACKENDS, migrated_database

AMOUNTS = (-INT64_MAX - 1, -5, -1, 0, 1, 7, INT64_MAX)


def _allowed(kind: str, amount: int) -> bool:
    """The rule, written out here: grants add, adjustments change, charges never add, expiries,
    voids and refunds take away; no other kind."""
    return {
        "grant": amount > 0,
        "adjustment": amount != 0,
        "charge": amount <= 0,
        "expiry": amount < 0,
        "void": amount < 0,
        "refund": amount < 0,
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
                        # the table's checks, or (PostgreSQL) the kind's domain
                        refusal = str(refused.orig)
                        assert "ck_ledger_entries_" in refusal or "ledger_entry_kind" in refusal
                    else:
                        assert _allowed(kind, amount), (kind, amount)
                        stored.append((kind, amount))
            with engine.connect() as connection:
                rows = connection.execute(
                    text("SELECT kind, amount_microcents FROM ledger_entries ORDER BY id")
                ).all()
            assert [tuple(row) for row in rows] == stored
            assert len(stored) == 3 + 6 + 4 + 3 + 3 + 3  # the allowed pairs of AMOUNTS
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
            allowed = (("spend", "cg_1"), ("payoff", "cg_1"), ("deficit", ""), ("refund", "cg_1"))
            for kind, grant in allowed:
                with engine.begin() as connection:
                    connection.execute(insert, {"kind": kind, "grant": grant})
            for kind, grant in (("Refund", "cg_1"), ("Spend", "cg_2"), ("", "cg_3")):
                with pytest.raises(IntegrityError) as refused, engine.begin() as connection:
                    connection.execute(insert, {"kind": kind, "grant": grant})
                # On PostgreSQL the column's domain refuses it (migration 0013).
                named = (
                    "ck_credit_allocation_days_kind" if backend == "sqlite" else "allocation_kind"
                )
                assert named in str(refused.value.orig), refused.value
            with engine.connect() as connection:
                kinds = connection.execute(
                    text("SELECT kind FROM credit_allocation_days ORDER BY kind")
                ).scalars()
                assert list(kinds) == ["deficit", "payoff", "refund", "spend"]
        finally:
            engine.dispose()


def _domain_columns(lists: bool) -> list[tuple[str, str, Any]]:
    """Each column whose type is a domain on PostgreSQL, of a list of values (``lists``) or of
    another check of the column: its table, its name and its type."""
    return [
        (table.name, column.name, column.type)
        for table in Base.metadata.tables.values()
        for column in table.columns
        if "postgresql" in getattr(column.type, "_variant_mapping", {})
        and isinstance(column.type._variant_mapping["postgresql"], DOMAIN)
        and hasattr(column.type._variant_mapping["postgresql"], "values") == lists
    ]


def _listed_columns() -> list[tuple[str, str, Any]]:
    return _domain_columns(lists=True)


def _domain_of(url: str, table: str, column: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return str(
                connection.execute(
                    text(
                        "SELECT format_type(atttypid, NULL) FROM pg_attribute "
                        "WHERE attrelid = CAST(:table AS regclass) AND attname = :column"
                    ),
                    {"table": table, "column": column},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_lists_of_values_are_domains_on_postgresql() -> None:
    """The gateway's lists of values (as the table checks they replace on SQLite)."""
    assert sorted((table, column) for table, column, _ in _listed_columns()) == [
        ("accounts", "billing"),
        ("authorizations", "status"),
        ("credit_allocation_days", "kind"),
        ("credit_grants", "category"),
        ("credit_grants", "status"),
        ("ledger_entries", "kind"),
        ("usage_events", "api"),
        ("usage_events", "outcome"),
        ("usage_rollups", "bucket_width"),
        ("usage_rollups", "grouping"),
    ]


@pytest.mark.parametrize("backend", SERVER_BACKENDS)
def test_each_domain_allows_its_values_only(backend: str, tmp_path: Path) -> None:
    """Each listed column's domain takes each of its values and refuses any other (one of them
    in another case, a blank, an empty text), as its table's check does on SQLite."""
    with migrated_database(backend, tmp_path) as url:
        engine = create_engine(url)
        try:
            for table, column, type_ in _listed_columns():
                domain = type_._variant_mapping["postgresql"]
                check = str(domain.check)
                values = re.findall(r"'([^']*)'", check)
                assert values and check == "VALUE IN (" + ", ".join(f"'{v}'" for v in values) + ")"
                with engine.connect() as connection:
                    for value in values:
                        cast = text(f"SELECT CAST(:value AS {domain.name})")
                        assert connection.execute(cast, {"value": value}).scalar_one() == value
                length = domain.data_type.length
                wrong_values = [values[0].upper(), f" {values[0]}", "", "other"]
                if len(values[0]) < length:
                    # A VARCHAR drops the blanks beyond its length (the SQL standard's rule): a
                    # value of the full length with one appended is that value.
                    wrong_values.append(f"{values[0]} ")
                for wrong in wrong_values:
                    # Beyond the length, the VARCHAR refuses it first.
                    fits = len(wrong) <= length
                    error, named = (
                        (IntegrityError, domain.name) if fits else (DataError, "too long")
                    )
                    with pytest.raises(error, match=named), engine.connect() as c:
                        c.execute(text(f"SELECT CAST(:value AS {domain.name})"), {"value": wrong})
                assert _domain_of(url, table, column) == domain.name, (table, column)
        finally:
            engine.dispose()


# The checks of one column the gateway's statements meet (migration 0014), written out here:
# what each allows (NULL aside, which a column's NOT NULL refuses or allows).
_CHECKED = {
    ("accounts", "max_concurrent_requests"): lambda value: value >= 1,
    ("authorizations", "estimate_microcents"): lambda value: value >= 0,
    ("credit_allocation_days", "amount_microcents"): lambda value: value > 0,
    ("credit_grants", "amount_microcents"): lambda value: value > 0,
    ("credit_grants", "priority"): lambda value: 0 <= value <= 100,
}


def test_checks_of_one_column_are_domains_on_postgresql() -> None:
    assert sorted((table, column) for table, column, _ in _domain_columns(lists=False)) == sorted(
        _CHECKED
    )


@pytest.mark.parametrize("backend", SERVER_BACKENDS)
def test_each_checked_domain_allows_what_its_check_allows(backend: str, tmp_path: Path) -> None:
    """Each such column's domain takes what the rule above allows and refuses the rest, the
    column is of the domain, and no table check of the column is left."""
    with migrated_database(backend, tmp_path) as url:
        engine = create_engine(url)
        try:
            for table, column, type_ in _domain_columns(lists=False):
                domain = type_._variant_mapping["postgresql"]
                allowed = _CHECKED[(table, column)]
                for value in (-(2**31), -1, 0, 1, 7, 100, 101, 2**31 - 1):
                    cast = text(f"SELECT CAST(:value AS {domain.name})")
                    if allowed(value):
                        with engine.connect() as connection:
                            assert connection.execute(cast, {"value": value}).scalar_one() == value
                    else:
                        with (
                            pytest.raises(IntegrityError, match=domain.name),
                            engine.connect() as c,
                        ):
                            c.execute(cast, {"value": value})
                with engine.connect() as connection:
                    null = text(f"SELECT CAST(NULL AS {domain.name})")
                    assert connection.execute(null).scalar_one() is None
                    alone = connection.execute(
                        text(
                            "SELECT count(*) FROM pg_constraint c JOIN pg_attribute a "
                            "ON a.attrelid = c.conrelid AND c.conkey = ARRAY[a.attnum] "
                            "WHERE c.contype = 'c' AND c.conrelid = CAST(:table AS regclass) "
                            "AND a.attname = :column"
                        ),
                        {"table": table, "column": column},
                    ).scalar_one()
                assert alone == 0, f"a table check of {table}.{column} alone is left"
                assert _domain_of(url, table, column) == domain.name, (table, column)
        finally:
            engine.dispose()
