"""Webhooks on PostgreSQL: several delivery loops at once never send the same attempt twice at once,
and a delivery process SIGKILLed mid-send loses nothing (every event delivered at least once
after a restart)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from metering.db import Database
from metering.notifications.delivery import Deliverer
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, SECRET_KEY, Api, running_api
from tests.factories import create_account
from tests.notifications.receiver import Receiver, Step, real_now, receiving
from tests.threads import Workers

pytestmark = pytest.mark.usefixtures("needs_postgresql")


@pytest.fixture
def pg_hooks(pg_url: str, tmp_path: Path) -> Iterator[Api]:
    with running_api(
        "postgresql", pg_url, tmp_path, webhook_allow_private=True, webhook_timeout_seconds=2.0
    ) as api:
        api.clock.set(real_now())
        yield api


def _events(api: Api, receiver: Receiver, count: int) -> tuple[str, list[str]]:
    made = api.admin(
        "POST",
        "/admin/v1/webhook-endpoints",
        json={
            "url": receiver.url(),
            "event_types": ["webhook.test"],
            "account_id": create_account(api),
        },
    )
    assert made.status_code == 201, made.text
    endpoint = made.json()["id"]
    ids = []
    for _ in range(count):
        response = api.admin("POST", f"/admin/v1/webhook-endpoints/{endpoint}/test")
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
    return endpoint, ids


def test_two_replicas_never_send_an_attempt_twice(pg_hooks: Api) -> None:
    api = pg_hooks
    with receiving() as receiver:
        receiver.plan = [Step(200, delay=0.01)] * 120
        endpoint, ids = _events(api, receiver, 120)
        replicas = [Database.from_url(api.url, pool_size=2) for _ in range(2)]
        deliverers = [Deliverer(db, api.settings, api.clock, rng=lambda: 0.5) for db in replicas]
        attempted = [0, 0]
        done = threading.Event()

        def loop(index: int) -> None:
            for _ in range(200):
                if done.is_set():
                    return
                attempted[index] += deliverers[index].run_once().attempted

        pool = Workers()
        try:
            for index in range(2):
                pool.start(loop, index)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and _undelivered(api, endpoint) and pool.alive():
                time.sleep(0.5)
                # An attempt that timed out on this busy machine is retried 5 s later.
                api.clock.advance(seconds=6)
        finally:
            done.set()
            try:
                pool.join(60)  # a replica's failure fails the test here
            finally:
                for deliverer in deliverers:
                    deliverer.close()
                for db in replicas:
                    db.dispose()
        assert _undelivered(api, endpoint) == 0
        attempts = {
            d["event_id"]: d["attempts"]
            for d in api.admin(
                "GET", f"/admin/v1/webhook-endpoints/{endpoint}/deliveries", params={"limit": 1000}
            ).json()["data"]
        }
        receiver.wait_for(len(ids))
        counts = Counter(receiver.ids())
    # No message arrived more often than it was attempted: no attempt was sent by both
    # replicas. (An attempt may arrive less often: a connection refused on this busy machine.)
    assert set(counts) == set(ids) == set(attempts)
    twice = {i: (counts[i], attempts[i]) for i in ids if counts[i] > attempts[i]}
    assert not twice
    assert sum(attempted) == sum(attempts.values()) and min(attempted) > 0


def _undelivered(api: Api, endpoint: str) -> int:
    body = api.admin(
        "GET", f"/admin/v1/webhook-endpoints/{endpoint}/deliveries", params={"limit": 1000}
    ).json()
    return sum(d["status"] != "delivered" for d in body["data"])


def _scheduler(api: Api, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": api.url,
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_WEBHOOK_ALLOW_PRIVATE": "true",
            "METERING_WEBHOOK_TIMEOUT_SECONDS": "2",
            "METERING_EXPORT_DIR": str(log.parent / "exports"),
            "METERING_LOG_LEVEL": "INFO",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "metering.cli", "scheduler", "--interval", "60"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_a_delivery_process_killed_mid_send_loses_nothing(pg_hooks: Api, tmp_path: Path) -> None:
    api = pg_hooks
    log = tmp_path / "scheduler.log"
    with receiving() as receiver:
        receiver.plan = [Step(200, delay=-1)]  # the first request hangs until released
        endpoint, ids = _events(api, receiver, 5)
        first = _scheduler(api, log)
        try:
            receiver.wait_for(1, timeout=30)
            os.killpg(first.pid, signal.SIGKILL)  # mid-send: the receiver has not answered
            first.wait(10)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        receiver.release.set()
        hung = receiver.ids()[0]  # the first to arrive got the hanging answer
        second = _scheduler(api, log)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and _undelivered(api, endpoint):
                time.sleep(0.2)
        finally:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(20)
        assert set(ids) <= set(receiver.ids()), log.read_text()[-3000:]
    response = api.admin("GET", f"/admin/v1/webhook-endpoints/{endpoint}/deliveries")
    deliveries = response.json()["data"]
    assert sorted(d["event_id"] for d in deliveries) == sorted(ids)
    assert {d["status"] for d in deliveries} == {"delivered"}
    # The one in flight when the process died was sent again (at least once).
    (retried,) = [d for d in deliveries if d["event_id"] == hung]
    assert retried["attempts"] == 2
