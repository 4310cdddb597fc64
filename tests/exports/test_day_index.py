"""The cross-account day queries of exports and the scheduler can use the partial index on the
rollups' day rows (``ix_usage_rollups_day_key_model``) even as prepared statements, whose
generic plans see only parameters: the index's condition is written into the queries as
constants."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from metering.exports import repository
from tests.conftest import Api


def _plans(session: Session, run: Any) -> list[str]:
    """The plans PostgreSQL chose for the statements ``run`` sends (auto_explain, in session)."""
    session.execute(text("LOAD 'auto_explain'"))
    session.execute(text("SET auto_explain.log_min_duration = 0"))
    session.execute(text("SET client_min_messages = log"))
    session.execute(text("SET auto_explain.log_level = notice"))
    notices: list[str] = []
    driver = session.connection().connection.driver_connection
    driver.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    run()
    return notices


def test_the_due_days_and_a_days_accounts_read_the_day_index(plain_pg_api: Api) -> None:
    with plain_pg_api.database.unit_of_work() as session:
        # Force the plans a prepared statement would get, and rule out the table scan.
        session.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        session.execute(text("SET LOCAL enable_seqscan = off"))
        before = datetime(2026, 12, 1, tzinfo=UTC)
        plans = _plans(
            session,
            lambda: (
                repository.ended_day_marks(session, before),
                repository.account_days(session, date(2026, 11, 28)),
            ),
        )
    scans = [plan for plan in plans if "usage_rollups" in plan]
    assert len(scans) == 2, plans
    for plan in scans:
        assert "ix_usage_rollups_day_key_model" in plan, plan
