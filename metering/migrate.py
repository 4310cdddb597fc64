"""Running the Alembic migrations from code (``metering migrate``, tests, first start)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


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


def upgrade(url: str, revision: str = "head") -> list[str]:
    """Apply the migrations up to ``revision``; each one applied, oldest first, as
    ``"0011 The audit log: …"`` (its revision and the first line of its docstring). On a Citus
    coordinator the schema is then distributed (metering.citus; a no-op when it already is)."""
    from metering import citus

    config = alembic_config(url)
    script = ScriptDirectory.from_config(config)
    before = current_revisions(url)
    lower = next(iter(before)) if before else "base"
    pending = list(script.iterate_revisions(revision, lower))
    command.upgrade(config, revision)
    citus.distribute(url)
    return [
        f"{step.revision} {(step.doc or '').strip().splitlines()[0] if step.doc else ''}".rstrip()
        for step in reversed(pending)
    ]


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    return ", ".join(heads)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
