"""``spend_limit.threshold_reached`` under a race, as deployed: two uvicorn processes on one
PostgreSQL. Two batches sent at once to the two processes, each alone below 80% of the key's
limit and together at it, fire exactly one event; single events sent at once past 100% fire
exactly one more."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import select

from metering.models import WebhookEvent
from metering.notifications.messages import render_data
from tests.conftest import SERVER_BACKENDS
from tests.factories import Key, chat_usage, usage_event
from tests.ledger.test_concurrency import GATEWAY, Cluster, _start
from tests.servers import ServerProcess
from tests.threads import workers

pytestmark = pytest.mark.usefixtures("needs_postgresql")

CHARGE = 22_000  # 1000 prompt tokens at GLM-5.3's 22 cents per million, in microcents
ACCOUNTS = 4


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _start(tmp_path_factory.mktemp("race-spend"), request.param)


def _send(server: ServerProcess, events: list[dict[str, Any]]) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/usage/events",
        json={"events": events},
        headers=GATEWAY,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    results = response.json()["data"]
    assert [r["status"] for r in results] == ["recorded"] * len(events), results
    assert all(r["charge"]["total_microcents"] == CHARGE for r in results), results


def _at_once(sends: list[tuple[ServerProcess, list[dict[str, Any]]]]) -> None:
    with workers() as pool:
        for send in sends:
            pool.start(_send, *send)


def _reached(cluster: Cluster, account: str) -> list[dict[str, Any]]:
    with cluster.database.reading() as session:
        rows = session.execute(
            select(WebhookEvent)
            .where(
                WebhookEvent.account_id == account,
                WebhookEvent.type == "spend_limit.threshold_reached",
            )
            .order_by(WebhookEvent.id)
        ).scalars()
        return [render_data(row.account_id, row.data) for row in rows]


def test_batches_and_single_events_that_together_cross_fire_each_threshold_once(
    cluster: Cluster,
) -> None:
    keys = []
    for _ in range(ACCOUNTS):
        account, key_id, secret = cluster.seed(10**12, limit_microcents=10 * CHARGE)
        keys.append(Key(key_id, secret, account))
    now = cluster.clock.now()

    def events(key: Key, count: int) -> list[dict[str, Any]]:
        return [usage_event(key, cluster.model, now, chat_usage(1000, 0)) for _ in range(count)]

    a, b = cluster.servers
    # Each batch alone: 40% of the limit; the two together: 80%.
    _at_once([(server, events(key, 4)) for key in keys for server in (a, b)])
    for key in keys:
        reached = _reached(cluster, key.account_id)
        assert [(e["percent"], e["spent_microcents"]) for e in reached] == [(80, 8 * CHARGE)]
    # Six single events at once, three to each process: 80% → 140%, past 100% once.
    _at_once([(server, events(key, 1)) for key in keys for server in (a, b) * 3])
    for key in keys:
        reached = _reached(cluster, key.account_id)
        assert [e["percent"] for e in reached] == [80, 100]
        assert 10 * CHARGE <= reached[1]["spent_microcents"] <= 14 * CHARGE
