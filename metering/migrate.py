"""``metering migrate`` from code (the command, tests, first start): the schema by the Alembic
migrations, then the PostgreSQL functions of the programs, then, on a Citus coordinator, the
schema's distribution.

The functions are derived code, not schema: each is generated from its program
(metering.functions) and committed as ``metering/functions/<name>.sql``. No migration holds
them; :func:`install_functions` installs every one whose text differs from what the database
holds, the way Flyway's repeatable migrations do. Each function the installer writes carries
``COMMENT ON FUNCTION … IS 'metering.functions sha256 <hex>'``, the SHA-256 of its file: the
checksum lives and dies with the function (dropped with it, carried by ``pg_dump``, no table
of its own to migrate or to place on a cluster), and a function whose comment names another
checksum, or has none, is replaced. A function the installer wrote that no file names any
more (a program renamed, or its parameters changed: a new signature is a new function) is
dropped, so no versioned migration has to. On SQLite there are no functions: the service
interprets the programs itself.

On a Citus coordinator, ``CREATE OR REPLACE FUNCTION`` and ``DROP FUNCTION`` of a function
Citus distributes are propagated by Citus to every node; a function created anew is
distributed afterwards (metering.citus)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, text

from metering.db import coordinator_url

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The generated functions, one ``<name>.sql`` each (``python -m metering.functions --write``).
FUNCTIONS_DIR = Path(__file__).parent / "functions"

# What the installer writes into each function's comment, followed by the checksum.
CHECKSUM_MARK = "metering.functions sha256 "
# A function's file starts with its header: its name and parameters, its signature.
_HEADER = re.compile(r"CREATE OR REPLACE FUNCTION (?P<signature>(?P<name>\w+)\(.*\))\s*$")
# PostgreSQL's invalid_function_definition: CREATE OR REPLACE cannot change a function's result
# type or its parameters' names; the function is dropped and made anew.
_CANNOT_REPLACE = "42P13"


@dataclass
class Migrated:
    """What one :func:`upgrade` did."""

    applied: list[str] = field(default_factory=list)  # "0001 The baseline: …", oldest first
    installed: list[str] = field(default_factory=list)  # functions written, by name
    dropped: list[str] = field(default_factory=list)  # functions no file names, by signature
    functions: int = 0  # the generated functions the database holds now (none on SQLite)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def current_revisions(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return set(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()


def upgrade(
    url: str, revision: str = "head", functions: Mapping[str, str] | None = None
) -> Migrated:
    """Apply the migrations up to ``revision`` (each one applied, oldest first, as ``"0001 The
    baseline: …"``: its revision and the first line of its docstring), install the functions
    (``functions``: each name and its text; the committed files when None), then, on a Citus
    coordinator, distribute the schema (metering.citus; a no-op when it already is)."""
    from metering import citus

    url = coordinator_url(url)
    config = alembic_config(url)
    script = ScriptDirectory.from_config(config)
    before = current_revisions(url)
    lower = next(iter(before)) if before else "base"
    pending = list(script.iterate_revisions(revision, lower))
    command.upgrade(config, revision)
    done = install_functions(url, committed_functions() if functions is None else functions)
    citus.distribute(url)
    done.applied = [
        f"{step.revision} {(step.doc or '').strip().splitlines()[0] if step.doc else ''}".rstrip()
        for step in reversed(pending)
    ]
    return done


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    return ", ".join(heads)


def downgrade(url: str, revision: str = "base") -> None:
    """Undo the migrations down to ``revision``; down to ``base``, the functions go too (on a
    cluster, the shard forms made from them: metering.citus.shard_forms)."""
    from metering.citus import shard_forms

    url = coordinator_url(url)
    command.downgrade(alembic_config(url), revision)
    if revision == "base":
        install_functions(url, {})
        shard_forms.remake(url)


def is_current(url: str) -> bool:
    """Whether the database is at the newest migration and holds exactly the committed
    functions (what ``metering migrate`` would leave it): the service starts on no other."""
    url = coordinator_url(url)
    heads = set(ScriptDirectory.from_config(alembic_config(url)).get_heads())
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            if set(MigrationContext.configure(connection).get_current_heads()) != heads:
                return False
            if connection.dialect.name != "postgresql":
                return True
            wanted = {(name, checksum(body)) for name, body in committed_functions().items()}
            return {(name, held) for _, name, held in _held(connection)} == wanted
    finally:
        engine.dispose()


def committed_functions() -> dict[str, str]:
    """Each committed function's name (its file's) and its ``CREATE OR REPLACE FUNCTION``."""
    files = sorted(FUNCTIONS_DIR.glob("*.sql"))
    return {path.stem: path.read_text(encoding="utf-8") for path in files}


def checksum(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def install_functions(url: str, functions: Mapping[str, str]) -> Migrated:
    """Make the database's functions ``functions`` (each name and its text), in one
    transaction: write each one whose checksum the database does not hold, drop each one
    the installer wrote before that ``functions`` does not name. Nothing on SQLite."""
    if not url.startswith("postgresql"):
        return Migrated()
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            return _install(connection, functions)
    finally:
        engine.dispose()


def _install(connection: Connection, functions: Mapping[str, str]) -> Migrated:
    done = Migrated(functions=len(functions))
    wanted = {(name, checksum(body)) for name, body in functions.items()}
    held = {(name, held) for _, name, held in _held(connection)}
    for name, body in functions.items():
        header = _HEADER.match(body.split("\n", 1)[0])
        if header is None or header["name"] != name:
            raise ValueError(
                f"the function {name} must start with `CREATE OR REPLACE FUNCTION {name}(…)`"
            )
        if (name, checksum(body)) in held:
            continue
        _create(connection, header["signature"], body)
        connection.execute(
            text(f"COMMENT ON FUNCTION {header['signature']} IS '{CHECKSUM_MARK}{checksum(body)}'")
        )
        done.installed.append(name)
    for signature, name, held_checksum in _held(connection):
        if (name, held_checksum) not in wanted:
            connection.execute(text(f"DROP FUNCTION {signature}"))
            done.dropped.append(signature)
    return done


def _create(connection: Connection, signature: str, body: str) -> None:
    """``body`` (its ``CREATE OR REPLACE FUNCTION``); a function of the same signature that it
    cannot replace (another result type, other parameter names) dropped first."""
    savepoint = connection.begin_nested()
    try:
        connection.exec_driver_sql(body)
    except Exception as exc:
        savepoint.rollback()
        if getattr(getattr(exc, "orig", None), "sqlstate", None) != _CANNOT_REPLACE:
            raise
        connection.execute(text(f"DROP FUNCTION {signature}"))
        connection.exec_driver_sql(body)
    else:
        savepoint.commit()


def _held(connection: Connection) -> list[tuple[str, str, str]]:
    """Every function the installer wrote: its signature, name and checksum."""
    return [
        (signature, name, comment.removeprefix(CHECKSUM_MARK))
        for signature, name, comment in connection.execute(
            text(
                "SELECT p.oid::regprocedure::text, p.proname::text, "
                "obj_description(p.oid, 'pg_proc') FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' "
                "AND starts_with(obj_description(p.oid, 'pg_proc'), :mark) ORDER BY 1"
            ),
            {"mark": CHECKSUM_MARK},
        )
    ]
