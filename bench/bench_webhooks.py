"""Webhook delivery (issue 16's benchmark): throughput to a local receiver and the lag from the
write that crosses a threshold to the receipt of its message, against PostgreSQL.

(a) **throughput**: ``EVENTS`` messages are queued (``POST …/test`` on one endpoint) while no
scheduler runs; then one ``metering scheduler`` starts, and the rate is the messages over the
time from the first receipt to the last. (b) **lag**: with the scheduler running, ``CROSSINGS``
accounts (1 cent of credit, a threshold of 1 cent) each get one usage event of 1 cent at a
steady pace; each one's balance crosses its threshold in the settlement, and its
``credit.balance_low`` message's lag is its receipt time minus the time the event was sent
(both on this machine's monotonic clock), p50 and p99.

Every message is checked: each expected ``webhook-id`` arrives (at least once), no other
arrives, and each body names its event type; anything else is a problem and the figures are
not met. The receiver is the harness's own (``http.server`` on loopback), answering 200.

Run: ``python -m bench webhooks``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench import common
from bench.common import (
    GATEWAY_TOKEN,
    Admin,
    CodeUnderTest,
    Result,
    bench_database,
    catalog_file,
    format_timestamp,
    median,
    percentile,
    rounds_label,
)

MODEL = "Bench-Hooks"
CENT_RATES = (1_000_000_000, 0, 0)  # 1000 prompt tokens: one cent
ALLOW_PRIVATE = (("METERING_WEBHOOK_ALLOW_PRIVATE", "true"),)


@dataclass
class Config:
    events: int = int(os.environ.get("BENCH_WEBHOOK_EVENTS", "1000"))
    crossings: int = int(os.environ.get("BENCH_WEBHOOK_CROSSINGS", "200"))
    pace: float = 0.02  # seconds between two crossing writes
    rounds: int = 1
    code: CodeUnderTest = field(default_factory=CodeUnderTest)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the senders' connections are never refused
    daemon_threads = True


class _Receiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: dict[str, float] = {}
        self.types: dict[str, str] = {}
        self.count = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver does

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                at = time.monotonic()
                message_id = self.headers.get("webhook-id", "")
                with receiver.lock:
                    receiver.count += 1
                    receiver.arrivals.setdefault(message_id, at)
                    receiver.types[message_id] = json.loads(body).get("type", "")
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, ids: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if ids <= set(self.arrivals):
                    return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _scheduler(code: CodeUnderTest, url: str, workdir: Path) -> subprocess.Popen[bytes]:
    env = {**code.env(url, workdir), **dict(ALLOW_PRIVATE)}
    log = (workdir / "scheduler.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from metering.cli import main; sys.exit(main(sys.argv[1:]))",
         "scheduler", "--interval", "3600"],
        cwd=code.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def run(config: Config) -> list[Result]:
    problems: list[str] = []
    code = CodeUnderTest(config.code.root, (*config.code.server_env, *ALLOW_PRIVATE))
    with tempfile.TemporaryDirectory(prefix="bench-hooks-") as tmp, bench_database() as url:
        workdir = Path(tmp)
        code.migrate(url, workdir)
        code.import_catalog(url, workdir, catalog_file(workdir, [MODEL], CENT_RATES))
        receiver = _Receiver()
        server = code.server(url, workdir, 1).start()
        try:
            with Admin(server.base_url) as admin:
                rate = _throughput(config, code, url, workdir, admin, receiver, problems)
                lags = _lags(config, code, url, workdir, server.base_url, admin, receiver, problems)
        finally:
            server.stop()
            receiver.close()
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    print(f"   (a) {rate:.0f} messages/s; (b) lag p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    for problem in problems:
        print(f"   PROBLEM {problem}")
    label = rounds_label(config.rounds)
    found = tuple(problems)
    return [
        Result(
            "webhooks.throughput",
            f"webhook messages/s to a local receiver, one scheduler, {config.events} queued",
            "-", rate, "/s", None, label, problems=found,
        ),
        Result(
            "webhooks.lag_p50",
            f"lag from the crossing write to receipt, p50 ({config.crossings} crossings)",
            "-", p50, "ms", None, label, higher_is_better=False, problems=found,
        ),
        Result(
            "webhooks.lag_p99",
            "  the same, p99 (the loop looks for due messages every second)",
            "-", p99, "ms", None, label, higher_is_better=False, problems=found,
        ),
    ]  # fmt: skip


def _throughput(
    config: Config,
    code: CodeUnderTest,
    url: str,
    workdir: Path,
    admin: Admin,
    receiver: _Receiver,
    problems: list[str],
) -> float:
    account = admin.account("bench-hooks")
    endpoint = admin._post(
        "/admin/v1/webhook-endpoints",
        {"url": receiver.url, "event_types": ["webhook.test"], "account_id": account},
    )["id"]
    ids = set()
    for _ in range(config.events):
        response = admin.client.post(f"/admin/v1/webhook-endpoints/{endpoint}/test")
        if response.status_code != 200:
            problems.append(f"POST …/test: {response.status_code} {response.text[:200]}")
            break
        ids.add(response.json()["id"])
    scheduler = _scheduler(code, url, workdir)
    try:
        if not receiver.wait(ids, timeout=300):
            problems.append(f"throughput: {len(ids - set(receiver.arrivals))} messages missing")
    finally:
        _stop(scheduler)
    times = sorted(receiver.arrivals[i] for i in ids if i in receiver.arrivals)
    if len(times) < 2:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


def _lags(
    config: Config,
    code: CodeUnderTest,
    url: str,
    workdir: Path,
    base_url: str,
    admin: Admin,
    receiver: _Receiver,
    problems: list[str],
) -> list[float]:
    accounts = []
    for index in range(config.crossings):
        account = admin.account(f"bench-cross-{index}")
        _, secret = admin.key(account)
        admin.grant(account, 1)
        response = admin.client.patch(
            f"/admin/v1/accounts/{account}", json={"low_balance_threshold_cents": 1}
        )
        if response.status_code != 200:
            problems.append(f"PATCH account: {response.status_code} {response.text[:200]}")
        key_id = admin.client.get(f"/admin/v1/accounts/{account}/api-keys").json()["data"][0]["id"]
        accounts.append((account, key_id, secret))
    endpoint = admin._post(
        "/admin/v1/webhook-endpoints",
        {"url": receiver.url, "event_types": ["credit.balance_low", "webhook.test"]},
    )["id"]
    scheduler = _scheduler(code, url, workdir)
    sent: dict[str, float] = {}
    occurred = format_timestamp(datetime.now(UTC) - timedelta(minutes=1))
    try:
        # The scheduler is up and looking every second once a test message has arrived.
        probe = admin.client.post(f"/admin/v1/webhook-endpoints/{endpoint}/test").json()["id"]
        if not receiver.wait({probe}, timeout=120):
            problems.append("lag: the scheduler delivered nothing in 120 s")
        before = set(receiver.arrivals)
        with httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}, timeout=30
        ) as gateway:
            for account, key_id, _ in accounts:
                event = {
                    "request_id": f"r-{account}",
                    "api_key_id": key_id,
                    "model": MODEL,
                    "api": "chat_completions",
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 0, "total_tokens": 1000},
                    "occurred_at": occurred,
                    "outcome": "completed",
                }
                sent[account] = time.monotonic()
                response = gateway.post("/v1/usage/events", json={"events": [event]})
                if response.status_code != 200 or response.json().get("recorded") != 1:
                    problems.append(f"usage event: {response.status_code} {response.text[:200]}")
                time.sleep(config.pace)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with receiver.lock:
                new = set(receiver.arrivals) - before
            if len(new) >= len(accounts):
                break
            time.sleep(0.05)
    finally:
        _stop(scheduler)
    lags = []
    by_account = _arrivals_by_account(url, receiver, before)
    for account, _, _ in accounts:
        if account not in by_account:
            problems.append(f"lag: no credit.balance_low for {account}")
            continue
        lags.append((by_account[account] - sent[account]) * 1000)
    return lags or [0.0]


def _arrivals_by_account(url: str, receiver: _Receiver, before: set[str]) -> dict[str, float]:
    """Each crossing's message by account (the event's account, from the outbox)."""
    import psycopg

    with receiver.lock:
        arrivals = {i: t for i, t in receiver.arrivals.items() if i not in before}
    with psycopg.connect(common.libpq_url(url)) as connection:
        rows = connection.execute(
            "SELECT public_id, account_id FROM webhook_events WHERE type = 'credit.balance_low'"
        ).fetchall()
    return {account: arrivals[pid] for pid, account in rows if pid in arrivals}


__all__ = ["Config", "median", "run"]
