"""The PostgreSQL functions are derived code: each program's generated text is committed as
``metering/functions/<name>.sql`` and held equal to what the program generates now; ``metering
migrate`` installs every function whose text the database does not hold (a checksum kept in the
function's comment), on PostgreSQL and on every node of a Citus cluster, and a second run
installs nothing."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from metering import functions, migrate
from metering.citus import shard_forms
from metering.citus.one_account import CITUS_RELEASE, delegated_settings
from metering.cli import main
from metering.functions import PROGRAMS
from tests.conftest import SECRET_KEY, Api

WRITE = "python -m metering.functions --write"
# The function a test changes in a copy of the files: sent, on a cluster, to the account's node.
CHANGED = "metering_spend_credit_of_account"


def _body(ddl: str) -> str:
    match = re.search(r"\$\$(.*)\$\$", ddl, re.S)
    assert match is not None, ddl
    return match.group(1)


def rows(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


def database_functions(url: str) -> dict[str, tuple[str, list[str]]]:
    """Each function of the database but trigger functions (the audit log's append-only guard
    is schema): its body and its SET clauses."""
    return {
        name: (source, config or [])
        for name, source, config in rows(
            url,
            "SELECT proname, prosrc, proconfig FROM pg_proc JOIN pg_namespace AS n "
            "ON n.oid = pronamespace WHERE nspname = 'public' AND proname LIKE 'metering_%' "
            "AND prorettype <> 'pg_catalog.trigger'::regtype",
        )
    }


def assert_functions_are_the_programs(url: str) -> None:
    """The database holds every program's function as the program generates it now, and
    nothing else: what ``metering migrate`` leaves after the migrations."""
    held = database_functions(url)
    cluster = bool(rows(url, "SELECT 1 FROM pg_extension WHERE extname = 'citus'"))
    # On a distributed cluster, each delegated program's shard forms too, for its shards now.
    distributed = cluster and rows(
        url, "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('accounts')"
    )
    formed = _shard_forms(url) if distributed else {}
    assert sorted(held) == sorted([*(program.name for program in PROGRAMS), *formed])
    for name, function in formed.items():
        assert held[name] == (_body(function), shard_forms.config(function)), (
            f"{name} is not its program's shard form"
        )
    # The distribution gives the functions it delegates the settings of the cluster's Citus.
    delegated: dict[str, dict[str, str]] = {}
    if cluster:
        for name, release in rows(
            url,
            f"SELECT p.proname, {CITUS_RELEASE} FROM pg_proc p "
            "JOIN pg_dist_object d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
            "WHERE d.colocationid IS NOT NULL",
        ):
            delegated[name] = delegated_settings(release)
    for program in PROGRAMS:
        source, settings = held[program.name]
        assert source == _body(program.plpgsql), (
            f"{program.name} in the database differs from its program: run `{WRITE}`, "
            "then `metering migrate`"
        )
        expected = {**program.settings, **delegated.get(program.name, {})}
        assert settings == [f"{k}={v}" for k, v in expected.items()]
    assert migrate.is_current(url)


def _shard_forms(url: str) -> dict[str, str]:
    """The shard forms the cluster's shards want (metering.citus.shard_forms), by name."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return shard_forms.wanted(shard_forms.shard_groups(connection))
    finally:
        engine.dispose()


def test_the_files_are_what_the_programs_generate() -> None:
    stale = functions.stale()
    assert not stale, "\n".join(
        f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}: "
        f"{reason}: run `{WRITE}` and commit the files"
        for path, reason in stale.items()
    )
    assert set(migrate.committed_functions()) == {program.name for program in PROGRAMS}


def test_a_changed_program_is_reported_and_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check names the file whose program generates another text, and ``--write``
    writes it (here in a copy of the files)."""
    copy = tmp_path / "functions"
    shutil.copytree(migrate.FUNCTIONS_DIR, copy)
    monkeypatch.setattr(migrate, "FUNCTIONS_DIR", copy)
    monkeypatch.setattr(functions, "FUNCTIONS_DIR", copy)
    (copy / f"{CHANGED}.sql").write_text("-- an older text\n")
    (copy / "metering_gone.sql").write_text("-- no program generates it\n")
    assert functions.stale() == {
        copy / f"{CHANGED}.sql": "differs from what its program generates",
        copy / "metering_gone.sql": "no program generates this function any more",
    }
    assert functions.write() == [copy / "metering_gone.sql", copy / f"{CHANGED}.sql"]
    assert functions.stale() == {}
    assert not (copy / "metering_gone.sql").exists()


def test_every_program_is_a_function_of_the_migrated_database(pg_api: Api) -> None:
    assert_functions_are_the_programs(pg_api.url)


def _changed(body: str) -> str:
    """The function's text with a first step of its own: a call fails, naming the copy."""
    changed = body.replace("\nBEGIN\n", "\nBEGIN\n    RAISE EXCEPTION 'changed in a copy';\n", 1)
    assert changed != body
    return changed


def _bodies_on_every_node(url: str, name: str) -> set[str]:
    """The function's body on the coordinator and, on a cluster, on every worker."""
    if not rows(url, "SELECT FROM pg_extension WHERE extname = 'citus'"):
        return {source for (source,) in rows(url, _PROSRC, name=name)}
    query = _PROSRC.replace(":name", f"'{name}'")
    return {
        result
        for (result,) in rows(
            url, "SELECT result FROM run_command_on_all_nodes(:query)", query=query
        )
    }


_PROSRC = "SELECT prosrc FROM pg_proc WHERE proname = :name"


def test_migrate_installs_a_changed_function_on_every_node_then_nothing(pg_url: str) -> None:
    committed = migrate.committed_functions()
    changed = {**committed, CHANGED: _changed(committed[CHANGED])}

    done = migrate.upgrade(pg_url, functions=changed)
    assert (done.applied, done.installed, done.dropped) == ([], [CHANGED], [])
    assert _bodies_on_every_node(pg_url, CHANGED) == {_body(changed[CHANGED])}
    assert not migrate.is_current(pg_url), "the database no longer holds the committed files"
    # A call runs the new text (on a cluster, on the node that holds the account).
    engine = create_engine(pg_url)
    try:
        with pytest.raises(Exception, match="changed in a copy"), engine.connect() as connection:
            connection.execute(text(f"SELECT {CHANGED}('acct_x', now(), '[]')"))
    finally:
        engine.dispose()

    again = migrate.upgrade(pg_url, functions=changed)
    assert (again.applied, again.installed, again.dropped) == ([], [], [])

    back = migrate.upgrade(pg_url)
    assert back.installed == [CHANGED]
    assert _bodies_on_every_node(pg_url, CHANGED) == {_body(committed[CHANGED])}
    assert_functions_are_the_programs(pg_url)


EXTRA = """CREATE OR REPLACE FUNCTION metering_extra(p_x INTEGER)
RETURNS {returns}
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN p_x;
END;
$$
"""


def test_a_function_no_file_names_is_dropped_and_a_new_result_type_replaces_it(
    pg_url: str,
) -> None:
    """A function whose result type changed cannot be replaced in place: it is dropped and
    made anew. One the files no longer name is dropped by the next ``migrate``."""
    committed = migrate.committed_functions()
    done = migrate.upgrade(
        pg_url, functions={**committed, "metering_extra": EXTRA.format(returns="INTEGER")}
    )
    assert done.installed == ["metering_extra"]
    done = migrate.upgrade(
        pg_url, functions={**committed, "metering_extra": EXTRA.format(returns="BIGINT")}
    )
    assert done.installed == ["metering_extra"]
    assert rows(pg_url, "SELECT pg_get_function_result('metering_extra'::regproc)") == [("bigint",)]
    done = migrate.upgrade(pg_url)
    assert (done.installed, done.dropped) == ([], ["metering_extra(integer)"])
    assert_functions_are_the_programs(pg_url)


def test_metering_migrate_says_what_it_installed_and_serve_wants_it_current(
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``metering migrate`` on an existing database whose functions' files changed (here, a
    copy of them): it installs the changed function and says so; a second run installs
    nothing. The server refuses a database whose functions are not the files'."""
    for name in [n for n in os.environ if n.startswith("METERING_")]:
        if not name.startswith("METERING_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("METERING_DATABASE_URL", pg_url)
    copy = tmp_path / "functions"
    shutil.copytree(migrate.FUNCTIONS_DIR, copy)
    (copy / f"{CHANGED}.sql").write_text(_changed((copy / f"{CHANGED}.sql").read_text()))
    real = migrate.FUNCTIONS_DIR
    monkeypatch.setattr(migrate, "FUNCTIONS_DIR", copy)

    assert main(["migrate"]) == 0
    out = capsys.readouterr().out
    assert f"installed 1 of the {len(PROGRAMS)} generated functions:\n  {CHANGED}\n" in out
    assert "nothing to apply" in out
    assert main(["migrate"]) == 0
    out = capsys.readouterr().out
    assert f"the {len(PROGRAMS)} generated functions are current: none installed" in out
    assert "installed" not in out.replace("none installed", "")

    monkeypatch.setattr(migrate, "FUNCTIONS_DIR", real)
    monkeypatch.setenv("METERING_ADMIN_TOKENS", "a")
    monkeypatch.setenv("METERING_GATEWAY_TOKENS", "g")
    monkeypatch.setenv("METERING_SECRET_KEY", SECRET_KEY)
    assert main(["serve"]) == 1
    assert "not current: run `metering migrate`" in capsys.readouterr().err
    assert main(["migrate"]) == 0
    assert f"installed 1 of the {len(PROGRAMS)} generated functions" in capsys.readouterr().out
    assert migrate.is_current(pg_url)


def test_the_delegated_calls_plan_per_call_only_where_citus_piles_up_plans() -> None:
    """A stock release whose local plans pile up gets ``force_custom_plan``; a build of it that
    carries the fix names itself otherwise (scripts/citus-patches: ``13.2.2+metering.1``), as
    does a release without the growth, and keeps the plan cache's default."""
    assert delegated_settings("13.2.2") == {"plan_cache_mode": "force_custom_plan"}
    assert delegated_settings("14.0.1") == {"plan_cache_mode": "force_custom_plan"}
    assert delegated_settings("13.2.2+metering.1") == {}
    assert delegated_settings("13.2.0") == {}
