"""The security tests get databases of their own (one per backend, for the package), not the
session's shared ones: they end by reconciling the whole database (``metering verify``), and
other suites' fixtures write ledger entries and rollups straight into the shared one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.conftest import APP_BACKENDS, NOW, Api, migrated_database, running_api


@pytest.fixture(scope="package")
def _security_apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Api]]:
    tmp = tmp_path_factory.mktemp("security")
    with ExitStack() as stack:
        apis = {}
        for backend in APP_BACKENDS:
            url = stack.enter_context(migrated_database(backend, tmp))
            apis[backend] = stack.enter_context(running_api(backend, url, tmp))
        yield apis


@pytest.fixture(params=APP_BACKENDS)
def api(request: pytest.FixtureRequest, _security_apis: dict[str, Api]) -> Iterator[Api]:
    """The real app on each backend in turn (this package's databases); the clock at ``NOW``."""
    shared = _security_apis[request.param]
    shared.clock.set(NOW)
    yield shared
    shared.clock.set(NOW)
