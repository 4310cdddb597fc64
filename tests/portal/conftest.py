"""One real server per backend and one browser for the portal's browser tests (a browser per
module, not per test: each test starts from a browser with no cookies)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from metering.exports.service import Exporter
from metering.kit.clock import FrozenClock
from metering.models import CreditRollforward
from tests.conftest import BACKENDS, NOW, Api, migrated_database
from tests.portal.browser import Browser, new_browser, serving


@pytest.fixture(scope="module", params=BACKENDS)
def portal(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp(f"portal-{request.param}")
    with migrated_database(request.param, tmp) as url, serving(request.param, url, tmp) as api:
        yield api


@pytest.fixture(scope="module")
def _driver() -> Iterator[object]:
    driver = new_browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(portal: Api, _driver: object) -> Iterator[Browser]:
    portal.clock.set(NOW)
    page = Browser(_driver, str(portal.client.base_url).rstrip("/"))  # type: ignore[arg-type]
    page.open("/billing/sign-in")  # cookies can be cleared only on the server's own origin
    page.driver.delete_all_cookies()
    page.console_errors()
    yield page
    portal.clock.set(NOW)


def export_dir(api: Api) -> Path:
    return api.settings.export_dir


def export_rollforward(api: Api, day: date) -> date:
    """Export ``day`` (usage files and the credit roll-forward, which starts that day) into the
    server's export directory, as the scheduler does once the day has ended."""
    with api.database.unit_of_work() as session:
        session.execute(update(CreditRollforward).values(start_date=day))
        session.commit()
    at = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1, hours=1)
    exporter = Exporter(api.database, export_dir(api), FrozenClock(at), runner="test")
    assert exporter.export_day(day).outcome == "exported"
    return day
