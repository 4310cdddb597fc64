"""Fixtures of the webhook tests: an app that may reach loopback receivers, per backend, and a
delivery loop on its database and clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from metering.notifications.addresses import Resolver
from metering.notifications.delivery import Deliverer
from tests.conftest import APP_BACKENDS, Api, migrated_database, running_api
from tests.notifications.receiver import real_now

TIMEOUT = 0.5  # METERING_WEBHOOK_TIMEOUT_SECONDS in these tests


@dataclass
class Hooks:
    api: Api

    def deliverer(self, resolver: Resolver | None = None, **settings: Any) -> Deliverer:
        config = self.api.settings.model_copy(update=settings) if settings else self.api.settings
        # No jitter: a retry is due exactly on the schedule (jitter is tested on its own).
        return Deliverer(
            self.api.database, config, self.api.clock, resolver=resolver, rng=lambda: 0.5
        )

    def endpoint(self, url: str, types: list[str], account_id: str | None = None) -> dict[str, Any]:
        response = self.api.admin(
            "POST",
            "/admin/v1/webhook-endpoints",
            json={"url": url, "event_types": types, "account_id": account_id},
        )
        assert response.status_code == 201, response.text
        return dict(response.json())

    def deliveries(self, endpoint_id: str) -> list[dict[str, Any]]:
        response = self.api.admin("GET", f"/admin/v1/webhook-endpoints/{endpoint_id}/deliveries")
        assert response.status_code == 200, response.text
        return list(response.json()["data"])


@pytest.fixture(scope="module", params=APP_BACKENDS)
def _hooks_app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    tmp: Path = tmp_path_factory.mktemp("hooks")
    with (
        migrated_database(request.param, tmp) as url,
        running_api(
            request.param,
            url,
            tmp,
            webhook_allow_private=True,
            webhook_timeout_seconds=TIMEOUT,
        ) as api,
    ):
        yield api


@pytest.fixture
def hooks(_hooks_app: Api) -> Iterator[Hooks]:
    """The app on each backend, its clock at the wall clock's now (verifiers check it)."""
    _hooks_app.clock.set(real_now())
    yield Hooks(_hooks_app)
