"""The schema is made only by the migrations (one baseline, then one migration per change) and
the generated functions by ``metering migrate``: together they make what the models and the
programs define, and they go down and up again cleanly, on SQLite, PostgreSQL and Citus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CheckConstraint, create_engine, inspect, text

from metering import citus, migrate
from metering.functions import PROGRAMS
from metering.models import Base
from tests.conftest import APP_BACKENDS, BACKENDS, fresh_database
from tests.test_functions import assert_functions_are_the_programs, database_functions, rows


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


def checks(url: str) -> dict[tuple[str, str], str]:
    """Every CHECK constraint of the database, by table and name: its condition (autogenerate
    does not compare them)."""
    engine = create_engine(url)
    try:
        found = inspect(engine)
        return {
            (table, check["name"]): check["sqltext"]
            for table in found.get_table_names()
            for check in found.get_check_constraints(table)
        }
    finally:
        engine.dispose()


def model_checks(dialect: str) -> dict[tuple[str, str], str]:
    """The models' CHECK constraints on ``dialect`` (SQLite's integer checks are its own)."""
    found = {}
    for table in Base.metadata.tables.values():
        for constraint in table.constraints:
            if not isinstance(constraint, CheckConstraint):
                continue
            # The dialect a check is for (``ddl_if``: metering.kit.ranges), None for every one.
            only = None if constraint._ddl_if is None else constraint._ddl_if.dialect
            if only in (None, dialect):
                found[(table.name, str(constraint.name))] = str(constraint.sqltext)
    return found


def assert_schema_is_the_models(url: str, backend: str) -> None:
    """The tables, columns, types, keys, indexes and server defaults of the models
    (autogenerate's comparison), their checks, and on a server the programs' functions."""
    assert differences(url) == []
    dialect = "sqlite" if backend == "sqlite" else "postgresql"
    if dialect == "sqlite":
        assert checks(url) == model_checks(dialect), "each check as the model writes it"
    else:
        # PostgreSQL stores a check as it parsed it (and keeps some in a compact form of the
        # same values: the baseline): the names here, what each allows in the modules' tests.
        assert set(checks(url)) == set(model_checks(dialect))
        assert_functions_are_the_programs(url)


def assert_distributed_by_the_rule(url: str, distribution: citus.Distribution) -> None:
    """Every table where the rule puts it, the one-account functions sent to the account's
    node, and the schema the models' but for what the distribution changed for Citus: unique
    keys widened by the account, foreign keys widened between account tables or dropped."""
    rule = {placed.table: placed for placed in map(citus.placement, citus.facts_of(Base.metadata))}
    assert {placed.table: placed for placed in citus.placements(url)} == rule
    assert sorted(distribution.functions) == sorted(
        signature
        for (signature,) in rows(
            url,
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_dist_object d "
            "ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
            "WHERE d.distribution_argument_index = 0 AND d.colocationid = (SELECT colocationid "
            "FROM pg_dist_partition WHERE logicalrelid = 'accounts'::regclass)",
        )
    )
    assert {signature.split("(")[0] for signature in distribution.functions} == {
        name for name in database_functions(url) if name.endswith("_of_account")
    }
    explained = {name.split(".")[1] for name in distribution.widened}
    explained |= {name.split(".")[1] for name in distribution.dropped_foreign_keys}
    for difference in differences(url):
        kind, item = difference[0], difference[1]
        if kind in ("add_fk", "remove_fk") and rule[item.table.name].kind == "distributed":
            continue  # between two account tables: widened by the account
        assert item.name in explained, difference


@pytest.mark.parametrize("backend", APP_BACKENDS)
def test_upgrade_matches_models_then_down_and_up_again(backend: str, tmp_path: Path) -> None:
    head = set(ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_heads())
    assert len(head) == 1, "one linear history"
    model_tables = set(Base.metadata.tables)
    assert {"accounts", "api_keys", "catalog_models", "price_versions", "account_rates"} <= (
        model_tables
    )

    with fresh_database(backend, tmp_path) as url:
        assert tables_and_revision(url) == (set(), set())

        # The migrations, then the functions: what ``migrate.upgrade`` does before it
        # distributes the schema on a cluster.
        command.upgrade(migrate.alembic_config(url), "head")
        installed = migrate.install_functions(url, migrate.committed_functions())
        assert tables_and_revision(url) == (model_tables | {"alembic_version"}, head)
        assert_schema_is_the_models(url, backend)
        assert len(installed.installed) == (0 if backend == "sqlite" else len(PROGRAMS))
        if backend == "citus":
            assert_distributed_by_the_rule(url, citus.distribute(url))

        migrate.downgrade(url, "base")
        assert tables_and_revision(url) == ({"alembic_version"}, set())
        if backend != "sqlite":
            assert database_functions(url) == {}, "the generated functions go with the schema"

        done = migrate.upgrade(url)
        assert tables_and_revision(url) == (model_tables | {"alembic_version"}, head)
        revisions = list(ScriptDirectory.from_config(migrate.alembic_config(url)).walk_revisions())
        assert len(done.applied) == len(revisions), "every migration, in order"
        assert done.applied[0].startswith("0001 The baseline")
        if backend == "citus":
            assert citus.distribute(url) == citus.Distribution(), "distributed already"
            assert_functions_are_the_programs(url)
        else:
            assert_schema_is_the_models(url, backend)

        again = migrate.upgrade(url)  # already at head: a no-op
        assert (again.applied, again.installed, again.dropped) == ([], [], [])
        assert tables_and_revision(url)[1] == head


def indexes(url: str) -> dict[str, str]:
    """Every index of the database by name: the statement that makes it, as the database
    keeps it (with a partial index's condition, which autogenerate does not compare)."""
    query = (
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        if url.startswith("sqlite")
        else "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
        "AND tablename <> 'alembic_version'"
    )
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {name: sql for name, sql in connection.execute(text(query))}
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_indexes_are_the_models(backend: str, tmp_path: Path) -> None:
    """The migrations make each index as the models define it, condition included: the same
    statements as a database made from the models alone."""
    with (
        fresh_database(backend, tmp_path) as migrated,
        fresh_database(backend, tmp_path) as from_models,
    ):
        migrate.upgrade(migrated)
        engine = create_engine(from_models)
        try:
            Base.metadata.create_all(engine)
        finally:
            engine.dispose()
        made = indexes(migrated)
        assert made == indexes(from_models)
        partial = "ix_authorizations_status_expires_at"
        assert ("WHERE" in made[partial]) == (backend == "postgresql"), "open holds only"


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


@pytest.mark.parametrize("backend", APP_BACKENDS)
def test_existing_keys_move_into_their_accounts_default_project(
    backend: str, tmp_path: Path
) -> None:
    """A database made before projects (schema 0001, distributed on a cluster as it was then)
    gets a ``Default`` project per account with every key in it, and its spend-limit notices
    become their keys' (scope ``key``); nothing else changes."""
    stamp = "2026-11-02 10:00:00+00:00"
    with fresh_database(backend, tmp_path) as url:
        command.upgrade(migrate.alembic_config(url), "0001")
        citus.distribute(url)
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                for account in ("acct_aaaaaaaaaaaaaaaaaaaa", "acct_bbbbbbbbbbbbbbbbbbbb"):
                    connection.execute(
                        text(
                            "INSERT INTO accounts (id, name, billing, balance_microcents, "
                            "created_at) VALUES (:id, 'old', 'prepaid', 12345, :at)"
                        ),
                        {"id": account, "at": stamp},
                    )
                for key, account in (
                    ("key_1", "acct_aaaaaaaaaaaaaaaaaaaa"),
                    ("key_2", "acct_aaaaaaaaaaaaaaaaaaaa"),
                    ("key_3", "acct_bbbbbbbbbbbbbbbbbbbb"),
                ):
                    connection.execute(
                        text(
                            "INSERT INTO api_keys (id, account_id, name, prefix, secret_hash, "
                            "monthly_spend_limit_microcents, created_at) "
                            "VALUES (:id, :account, 'k', 'mk_', :hash, 700, :at)"
                        ),
                        {"id": key, "account": account, "hash": key * 8, "at": stamp},
                    )
                # A key's threshold reached: it stays reached, as the key's (it fires no more).
                connection.execute(
                    text(
                        "INSERT INTO spend_limit_notices (account_id, api_key_id, "
                        "spend_limit_window, window_starts_at, percent, limit_microcents, "
                        "spent_microcents, created_at) VALUES ('acct_aaaaaaaaaaaaaaaaaaaa', "
                        "'key_1', 'month', :start, 80, 700, 600, :at)"
                    ),
                    {"start": "2026-11-01 00:00:00+00:00", "at": stamp},
                )
        finally:
            engine.dispose()
        before = rows(url, "SELECT id, balance_microcents FROM accounts ORDER BY id")

        migrate.upgrade(url)

        assert rows(url, "SELECT id, balance_microcents FROM accounts ORDER BY id") == before
        projects = rows(
            url, "SELECT id, account_id, name, spend_limit_microcents FROM projects ORDER BY id"
        )
        assert projects == [
            ("proj_aaaaaaaaaaaaaaaaaaaa", "acct_aaaaaaaaaaaaaaaaaaaa", "Default", None),
            ("proj_bbbbbbbbbbbbbbbbbbbb", "acct_bbbbbbbbbbbbbbbbbbbb", "Default", None),
        ]
        assert rows(
            url,
            "SELECT id, project_id, member_id, monthly_spend_limit_microcents FROM api_keys "
            "ORDER BY id",
        ) == [
            ("key_1", "proj_aaaaaaaaaaaaaaaaaaaa", None, 700),
            ("key_2", "proj_aaaaaaaaaaaaaaaaaaaa", None, 700),
            ("key_3", "proj_bbbbbbbbbbbbbbbbbbbb", None, 700),
        ]
        assert rows(
            url,
            "SELECT limit_scope, scope_id, api_key_id, percent, spent_microcents "
            "FROM spend_limit_notices",
        ) == [("key", "key_1", "key_1", 80, 600)]
        if backend == "citus":
            placed = {p.table: p for p in citus.placements(url)}
            assert placed["projects"].kind == placed["members"].kind == "distributed"


@pytest.mark.parametrize("backend", APP_BACKENDS)
def test_accounts_with_project_or_member_limits_are_marked(backend: str, tmp_path: Path) -> None:
    """Upgrading from 0004: an account whose project or member has a spend limit is marked
    (``scope_limits``: the ingest then reads those limits), the others are not."""
    stamp = "2026-11-02 10:00:00+00:00"
    with fresh_database(backend, tmp_path) as url:
        command.upgrade(migrate.alembic_config(url), "0004")
        citus.distribute(url)
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                for n, limited in (("a", "project"), ("b", "member"), ("c", None)):
                    account = "acct_" + n * 20
                    connection.execute(
                        text(
                            "INSERT INTO accounts (id, name, billing, balance_microcents, "
                            "created_at) VALUES (:id, 'old', 'prepaid', 0, :at)"
                        ),
                        {"id": account, "at": stamp},
                    )
                    project_limit = 5 if limited == "project" else None
                    connection.execute(
                        text(
                            "INSERT INTO projects (id, account_id, name, spend_limit_microcents, "
                            "spend_limit_window, restricts_models, created_at) VALUES "
                            "(:id, :account, 'p', :limit, 'month', false, :at)"
                        ),
                        {
                            "id": "proj_" + n * 20,
                            "account": account,
                            "limit": project_limit,
                            "at": stamp,
                        },
                    )
                    connection.execute(
                        text(
                            "INSERT INTO members (id, account_id, email, email_key, name, role, "
                            "spend_limit_microcents, spend_limit_window, created_at) VALUES "
                            "(:id, :account, 'x@y.z', 'x@y.z', '', 'viewer', :limit, 'day', :at)"
                        ),
                        {
                            "id": "mem_" + n * 20,
                            "account": account,
                            "limit": 7 if limited == "member" else None,
                            "at": stamp,
                        },
                    )
        finally:
            engine.dispose()

        migrate.upgrade(url)

        assert rows(url, "SELECT id, scope_limits FROM accounts ORDER BY id") == [
            ("acct_" + "a" * 20, True),
            ("acct_" + "b" * 20, True),
            ("acct_" + "c" * 20, False),
        ]
