"""Webhooks as deployed: every event type, made through the real app, is delivered by a real
``metering scheduler`` process (a subprocess on the same database) to a receiver on loopback —
each event once, signed with the endpoint's secret (checked by the Standard Webhooks library),
the body the outbox holds. The scheduler writes its own types too (a hold expired unused, a
grant about to expire, a day's export). The other webhook tests run the delivery loop in process
(``Deliverer.run_once()``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from metering.models import WebhookEvent
from tests.conftest import (
    ADMIN_TOKEN,
    GATEWAY_TOKEN,
    SECRET_KEY,
    SERVER_BACKENDS,
    Api,
    running_api,
    server_database,
)
from tests.factories import (
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.notifications.receiver import Receiver, real_now, receiving, verified

EVERY_TYPE = [
    "webhook.test",
    "credit.balance_low",
    "credit.balance_depleted",
    "credit.grant_expired",
    "credit.grant_expiring",
    "spend_limit.threshold_reached",
    "usage.quarantined",
    "authorization.expired_unused",
    "export.completed",
]
# One cent per event of 1000 prompt tokens; output free.
CENT_RATES = (1_000_000_000, 0, 0)


@pytest.fixture(params=SERVER_BACKENDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """The app on a database of its own (an operator-wide endpoint sees only this test's
    events), its clock at the wall clock's now: the scheduler process runs the system's."""
    with (
        server_database(request.param, tmp_path) as url,
        running_api(request.param, url, tmp_path, webhook_allow_private=True) as api,
    ):
        api.clock.set(real_now())
        yield api


def scheduler_process(url: str, workdir: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": url,
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_EXPORT_DIR": str(workdir / "exports"),
            "METERING_EXPORT_AFTER_MINUTES": "0",
            "METERING_WEBHOOK_ALLOW_PRIVATE": "true",
            "METERING_LOG_LEVEL": "INFO",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "metering.cli", "scheduler", "--interval", "0.5"],
        env=env,
        stdout=(workdir / "scheduler.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def outbox(api: Api) -> dict[str, str]:
    """Every event written: public id -> type."""
    with api.database.reading() as session:
        rows = session.execute(select(WebhookEvent.public_id, WebhookEvent.type)).all()
    return {public_id: type_ for public_id, type_ in rows}


def admin(api: Api, method: str, path: str, status: int, **kwargs: Any) -> Any:
    response = api.admin(method, path, **kwargs)
    assert response.status_code == status, response.text
    return response.json()


def make_every_event(api: Api, receiver: Receiver) -> str:
    """Each type's cause, through the app; the endpoint's secret."""
    now = api.clock.now()
    endpoint = admin(
        api,
        "POST",
        "/admin/v1/webhook-endpoints",
        201,
        json={"url": receiver.url(), "event_types": EVERY_TYPE, "account_id": None},
    )
    admin(api, "POST", f"/admin/v1/webhook-endpoints/{endpoint['id']}/test", 200)
    model = priced_model(api, now - timedelta(days=3), CENT_RATES)

    # A: a 5-cent threshold over 10 cents, a key limited to 6 cents a month, a hold left to
    # expire, a day's usage yesterday (exported), an event of no known model, then 6 cents
    # spent (low balance, the key's 80% and 100%) and 5 more (depleted).
    account = create_account(api)
    key = create_key(api, account)
    grant(api, account, 10)
    admin(
        api,
        "PATCH",
        f"/admin/v1/accounts/{account}",
        200,
        json={"low_balance_threshold_cents": 5},
    )
    admin(api, "PATCH", f"/admin/v1/api-keys/{key.id}", 200, json={"spend_limit_cents": 6})
    hold = api.gateway(
        "POST",
        "/v1/authorizations",
        json={
            "api_key": key.secret,
            "model": model,
            "api": "chat_completions",
            "prompt_tokens": 1000,
            "max_tokens": 10,
            "request_id": unique("req"),
            "hold_ttl_seconds": 1,
        },
    )
    assert hold.status_code == 200, hold.text
    yesterday = usage_event(key, model, now - timedelta(days=1), chat_usage(0, 1))
    unknown = usage_event(key, "No-Such-Model", now)
    assert [r["status"] for r in ingest(api, yesterday, unknown)["data"]] == [
        "recorded",
        "quarantined",
    ]
    cent = chat_usage(1000, 0)
    for count in (6, 5):
        events = [usage_event(key, model, now, cent) for _ in range(count)]
        assert ingest(api, *events)["recorded"] == count

    # B: a grant with its remainder expiring in three days (the scheduler's notice).
    other = create_account(api)
    admin(
        api,
        "POST",
        f"/admin/v1/accounts/{other}/grants",
        201,
        json={
            "amount_cents": 50,
            "idempotency_key": unique("g"),
            "expires_at": (now + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )

    # C: a promotional cent that expired an hour ago, its expiry written by the next debit.
    third = create_account(api)
    third_key = create_key(api, third)
    api.clock.set(now - timedelta(hours=2))
    admin(
        api,
        "POST",
        f"/admin/v1/accounts/{third}/grants",
        201,
        json={
            "amount_cents": 1,
            "idempotency_key": unique("g"),
            "category": "promotional",
            "expires_at": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )
    api.clock.set(now)
    assert ingest(api, usage_event(third_key, model, now, cent))["recorded"] == 1
    return str(endpoint["secret"])


def test_a_scheduler_process_delivers_every_event_type(app: Api, tmp_path: Path) -> None:
    with receiving() as receiver:
        secret = make_every_event(app, receiver)
        process = scheduler_process(app.url, tmp_path)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                written = outbox(app)
                arrived = set(receiver.ids())
                if set(written.values()) >= set(EVERY_TYPE) and arrived >= set(written):
                    break
                assert process.poll() is None, (tmp_path / "scheduler.log").read_text()
                time.sleep(0.25)
            time.sleep(1.5)  # another delivery pass: nothing is sent twice
        finally:
            process.terminate()
            process.wait(30)
    log = (tmp_path / "scheduler.log").read_text(errors="replace")[-3000:]
    written = outbox(app)
    assert set(written.values()) == set(EVERY_TYPE), (sorted(set(written.values())), log)
    messages = [verified(secret, message) for message in receiver.received]
    assert Counter(m["id"] for m in messages) == Counter(set(written)), log
    assert {m["id"]: m["type"] for m in messages} == written
    for message in receiver.received:
        assert message.path == "/hook"
        assert message.headers["webhook-id"] == verified(secret, message)["id"]
    by_type = Counter(m["type"] for m in messages)
    assert by_type["spend_limit.threshold_reached"] == 2, by_type  # 80% and 100%
    percents = sorted(
        m["data"]["percent"] for m in messages if m["type"] == "spend_limit.threshold_reached"
    )
    assert percents == [80, 100]
