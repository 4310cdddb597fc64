"""One real server per backend and one browser for the portal's browser tests (a browser per
module, not per test: each test starts from a browser with no cookies)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
