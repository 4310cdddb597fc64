"""The PostgreSQL functions in a migrated database are exactly what the programs' current
definitions produce (metering.functions): a function and the Python it was generated from
cannot drift apart. When a definition changes, a new migration freezes its new text."""

from __future__ import annotations

import re

from sqlalchemy import create_engine, text

from metering.functions import PROGRAMS
from tests.conftest import Api


def _body(ddl: str) -> str:
    match = re.search(r"\$\$(.*)\$\$", ddl, re.S)
    assert match is not None, ddl
    return match.group(1)


def test_every_program_is_a_function_of_the_migrated_database(pg_api: Api) -> None:
    engine = create_engine(pg_api.url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT proname, prosrc, proconfig FROM pg_proc JOIN pg_namespace AS n "
                    "ON n.oid = pronamespace WHERE nspname = 'public' "
                    "AND proname LIKE 'metering_%' "
                    # Trigger functions (the audit log's append-only guard) are no programs.
                    "AND prorettype <> 'pg_catalog.trigger'::regtype"
                )
            ).all()
    finally:
        engine.dispose()
    stored = {name: source for name, source, _ in rows}
    settings = {name: config or [] for name, _, config in rows}
    assert sorted(stored) == sorted(program.name for program in PROGRAMS)
    for program in PROGRAMS:
        assert stored[program.name] == _body(program.plpgsql), (
            f"{program.name} in the database differs from its definition: freeze the new text "
            "(python -m metering.functions) in a new migration"
        )
        # Its SET clauses (not part of the body).
        assert settings[program.name] == [f"{k}={v}" for k, v in program.settings.items()]
