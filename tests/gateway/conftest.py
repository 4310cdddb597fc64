"""One metering server process per backend for the gateway tests' session (each takes seconds
to start), SQLite and PostgreSQL; test_litellm_proxy.py has its own, behind its proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import BACKENDS
from tests.gateway.support import Metering, running_metering


@pytest.fixture(scope="session", params=[b for b in ("sqlite", "postgresql") if b in BACKENDS])
def metering(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Metering]:
    with running_metering(request.param, tmp_path_factory.mktemp(request.param)) as service:
        yield service
