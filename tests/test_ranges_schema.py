"""Ranges (docs/api.md#ranges) in the schema: every integer column of every table refuses, never
coerces, a value that is not a signed 64-bit integer, on both backends (SQLite by the checks of
the baseline migration, PostgreSQL by its column types), and the ingest recognises that refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError

from metering.kit.ranges import INT64_MAX, integer_check, integer_columns, is_out_of_range
from metering.models import Base
from tests.conftest import BACKENDS, migrated_database


def test_every_integer_column_of_sqlite_has_its_check(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                inspector = inspect(connection)
                for table in Base.metadata.sorted_tables:
                    checks = {
                        c["name"]: c["sqltext"] for c in inspector.get_check_constraints(table.name)
                    }
                    for name in integer_columns(table):
                        expected = integer_check(name, bool(table.c[name].nullable))
                        assert checks.get(f"ck_{table.name}_{name}_integer") == expected, (
                            table.name,
                            name,
                        )
        finally:
            engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_overflow_is_refused_and_recognised(backend: str, tmp_path: Path) -> None:
    with migrated_database(backend, tmp_path) as url:
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO accounts (id, name, billing, balance_microcents, "
                        "held_microcents, created_at) VALUES ('acct_x', 'x', 'prepaid', :b, 0, "
                        "'2026-01-01 00:00:00')"
                    ),
                    {"b": INT64_MAX - 5},
                )
            for change in (
                "balance_microcents = balance_microcents + 10",  # SQLite would make it a REAL
                "held_microcents = held_microcents - 9223372036854775807 - 10",
            ):
                with pytest.raises(DBAPIError) as refused, engine.begin() as connection:
                    connection.execute(text(f"UPDATE accounts SET {change}"))
                assert is_out_of_range(refused.value), refused.value
            if backend == "sqlite":
                # (A numeric text becomes its integer by the column's affinity: no float.)
                for value in ("1.5", "'abc'", "x'00'", "1e300"):
                    with pytest.raises(DBAPIError) as refused, engine.begin() as connection:
                        connection.execute(text(f"UPDATE accounts SET held_microcents = {value}"))
                    assert "CHECK constraint failed" in str(refused.value)
            with engine.connect() as connection:
                assert connection.execute(
                    text("SELECT balance_microcents, held_microcents FROM accounts")
                ).one() == (INT64_MAX - 5, 0)
                if backend == "sqlite":
                    assert (
                        connection.execute(
                            text("SELECT typeof(balance_microcents) FROM accounts")
                        ).scalar_one()
                        == "integer"
                    )
        finally:
            engine.dispose()


def test_other_refusals_are_not_taken_for_the_range() -> None:
    import sqlite3

    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (a INTEGER CONSTRAINT a_positive CHECK (a > 0))")
    with pytest.raises(sqlite3.IntegrityError) as refused:
        connection.execute("INSERT INTO t VALUES (-1)")
    assert not is_out_of_range(refused.value)
    assert not is_out_of_range(RuntimeError("integer overflow"))
