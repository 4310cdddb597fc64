"""A burst of writes on the embedded server (issue 35, defect 1): 200 concurrent writes of each
kind that runs in the worker thread pool (an operator's grant, an account key's webhook
endpoint, the portal's webhook form) are each answered within a minute, 2xx or 503
``database_unavailable`` with ``Retry-After``; afterwards the server still records writes, its
embedded scheduler still delivers webhooks, and SIGTERM ends it.

It used to wedge for good at about 45 concurrent writes: the writer's turn (SQLite has one
writer) was waited for in the thread pool, by the request's session dependency, while the
request holding it needed a thread of that same exhausted pool to run its endpoint; every pool
thread waited for it, every later write hung, the scheduler's jobs queued behind the file lock
and SIGTERM waited for the hung requests. The turn is now waited for on the event loop
(metering/db.py), never in the pool.

Real parts: ``metering serve`` on its embedded database (the scheduler in the process), over
loopback HTTP; a real HTTP receiver for the webhook.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.conftest import ADMIN_TOKEN
from tests.servers import ServerProcess, free_port

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BURST = 200
# Every request of a burst is answered within this (the defect: never).
ANSWER_SECONDS = 60.0
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
HOOK_URL = "http://127.0.0.1:9/hook"  # never called: nothing they subscribe to happens


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, object]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, object]]]]:
    """A webhook receiver on loopback: its URL and the bodies it received."""
    received: list[dict[str, object]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """``metering serve`` on its embedded database, with the scheduler in its process."""
    process = ServerProcess(
        "",  # the embedded database: <data dir>/metering.sqlite3
        tmp_path,
        serve_command=True,
        extra_env={"METERING_DEMO": "false", "METERING_WEBHOOK_ALLOW_PRIVATE": "true"},
    )
    process.start(timeout=60)
    try:
        yield process
    finally:
        process.kill()


Send = Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]]


def _burst(base_url: str, send: Send, cookies: httpx.Cookies | None = None) -> list[object]:
    """``BURST`` concurrent requests (``send(client, i)``): each answer, or the error that took
    its place (a timeout: not answered within ``ANSWER_SECONDS``)."""

    async def run() -> list[object]:
        limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
        async with httpx.AsyncClient(
            base_url=base_url, timeout=ANSWER_SECONDS, limits=limits, cookies=cookies
        ) as client:
            return list(
                await asyncio.gather(
                    *(send(client, index) for index in range(BURST)), return_exceptions=True
                )
            )

    return asyncio.run(run())


def _check_answered(kind: str, answers: list[object], created: int) -> int:
    """Every answer 2xx (``created``), or 503 database_unavailable with Retry-After; how many
    were done."""
    problems = []
    done = 0
    for answer in answers:
        if not isinstance(answer, httpx.Response):
            problems.append(f"{type(answer).__name__}: {answer}")
        elif answer.status_code == created:
            done += 1
        elif answer.status_code != 503 or "retry-after" not in answer.headers:
            problems.append(f"{answer.status_code} {answer.text[:200]}")
    assert not problems, f"{kind}: {len(problems)} of {BURST} not answered: {problems[:3]}"
    assert done > 0, f"{kind}: none done"
    print(f"{kind}: {done} of {BURST} done, the others 503")
    return done


def test_a_burst_of_writes_is_answered_and_the_server_lives_on(
    server: ServerProcess, receiver: tuple[str, list[dict[str, object]]]
) -> None:
    base = server.base_url
    admin = httpx.Client(base_url=base, headers=ADMIN, timeout=30)
    account = admin.post("/admin/v1/accounts", json={"name": "burst", "billing": "prepaid"})
    assert account.status_code == 201, account.text
    account_id = account.json()["id"]
    key = admin.post(f"/admin/v1/accounts/{account_id}/api-keys", json={"name": "k"}).json()

    # An operator's grants.
    async def grant(client: httpx.AsyncClient, index: int) -> httpx.Response:
        return await client.post(
            f"/admin/v1/accounts/{account_id}/grants",
            json={"amount_cents": 1, "idempotency_key": f"burst-{index}"},
            headers=ADMIN,
        )

    granted = _check_answered("grants", _burst(base, grant), 201)
    credits = admin.get(f"/admin/v1/accounts/{account_id}/credits")
    assert credits.status_code == 200, credits.text
    assert credits.json()["balance_microcents"] == granted * 10**6  # each one done, once

    # An account key's webhook endpoints.
    async def endpoint(client: httpx.AsyncClient, index: int) -> httpx.Response:
        return await client.post(
            "/v1/webhook-endpoints",
            json={"url": HOOK_URL, "event_types": ["credit.balance_low"]},
            headers={"Authorization": f"Bearer {key['key']}"},
        )

    _check_answered("webhook endpoints", _burst(base, endpoint), 201)

    # The portal's webhook form, signed in with the operator's link.
    link = admin.post(f"/admin/v1/accounts/{account_id}/portal-sessions")
    assert link.status_code == 201, link.text
    portal = httpx.Client(base_url=base, timeout=30)
    path = str(link.json()["url"]).removeprefix(base)
    token = CSRF.search(portal.get(path).text)
    assert token is not None
    assert portal.post(path, data={"csrf_token": token.group(1)}).status_code == 303
    page = portal.get("/billing/notifications")
    token = CSRF.search(page.text)
    assert page.status_code == 200 and token is not None
    form = {"csrf_token": token.group(1), "url": HOOK_URL, "type:credit.balance_low": "on"}

    async def portal_form(client: httpx.AsyncClient, index: int) -> httpx.Response:
        return await client.post("/billing/notifications", data=form)

    _check_answered("portal forms", _burst(base, portal_form, portal.cookies), 200)

    # Still serving: a write and the scheduler's webhook delivery.
    url, received = receiver
    hook = admin.post(
        "/admin/v1/webhook-endpoints",
        json={"url": url, "event_types": ["credit.balance_low"], "account_id": account_id},
    )
    assert hook.status_code == 201, hook.text
    sent = admin.post(f"/admin/v1/webhook-endpoints/{hook.json()['id']}/test")
    assert sent.status_code == 200, sent.text
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [body["type"] for body in received] == ["webhook.test"]
    admin.close()
    portal.close()

    # SIGTERM ends it.
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not end on SIGTERM within 30 s")
