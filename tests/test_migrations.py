"""Alembic migrations are the only way the schema is made: they agree with the models, and they go
down and up again cleanly, on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from metering import migrate
from metering.models import Base
from tests.conftest import BACKENDS, fresh_database


def differences(url: str) -> list[Any]:
    """What autogenerate would write to bring the database to the models (nothing, we hope)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"compare_type": True, "compare_server_default": True},
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def tables_and_revision(url: str) -> tuple[set[str], set[str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            tables = set(inspect(connection).get_table_names()) - {"sqlite_sequence"}
            heads = set(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()
    return tables, heads


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_matches_models_then_down_and_up_again(backend: str, tmp_path: Path) -> None:
    head = set(ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_heads())
    assert len(head) == 1, "one linear history"
    model_tables = set(Base.metadata.tables)
    assert {"accounts", "api_keys", "catalog_models", "price_versions", "account_rates"} <= (
        model_tables
    )

    with fresh_database(backend, tmp_path) as url:
        assert tables_and_revision(url) == (set(), set())

        migrate.upgrade(url)
        assert tables_and_revision(url) == (model_tables | {"alembic_version"}, head)
        assert differences(url) == []

        migrate.downgrade(url, "base")
        assert tables_and_revision(url) == ({"alembic_version"}, set())

        migrate.upgrade(url)
        assert tables_and_revision(url) == (model_tables | {"alembic_version"}, head)
        assert differences(url) == []

        migrate.upgrade(url)  # already at head: a no-op
        assert tables_and_revision(url)[1] == head


@pytest.mark.parametrize("backend", BACKENDS)
def test_drift_is_detected(backend: str, tmp_path: Path) -> None:
    """The comparison above can fail: a column the migrations never made is reported."""
    from sqlalchemy import BigInteger, Column, MetaData, Table

    with fresh_database(backend, tmp_path) as url:
        migrate.upgrade(url)
        drifted = MetaData(naming_convention=Base.metadata.naming_convention)
        for table in Base.metadata.tables.values():
            table.to_metadata(drifted)
        Table("accounts", drifted, Column("surprise_microcents", BigInteger), extend_existing=True)
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                found = compare_metadata(MigrationContext.configure(connection), drifted)
        finally:
            engine.dispose()
        assert [(d[0], d[3].name) for d in found if d[0] == "add_column"] == [
            ("add_column", "surprise_microcents")
        ]
