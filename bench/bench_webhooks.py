"""Webhook delivery (issue 16's benchmark): throughput to a local receiver and the lag from the
write that crosses a threshold to the receipt of its message, against PostgreSQL.

(a) **throughput**: ``EVENTS`` messages are queued (``POST …/test`` on one endpoint) while no
scheduler runs; then one ``metering scheduler`` starts, and the rate is the messages over the
time from the first receipt to the last. (b) **lag**: with the scheduler running, ``CROSSINGS``
accounts (1 cent of credit, a threshold of 1 cent) each get one usage event of 1 cent at a
steady pace; each one's balance crosses its threshold in the settlement, and its
``credit.balance_low`` message's lag is its receipt time minus the time the event was sent
(both on this machine's monotonic clock), p50 and p99.

Every message is checked against what the harness itself knows, never against the service's
tables: each expected ``webhook-id`` arrives exactly once at its endpoint (answered 200, nothing
is retried), no other arrives, its body's ``id`` is the header's, its ``type`` is the one
expected (``webhook.test`` for the queued ones and the probe, ``credit.balance_low`` for a
crossing), each crossing's ``data`` names its account (each account once) with the balance the
price oracle says (its 1-cent grant less the oracle's charge of its event: 0 cents) and the
threshold, and its Standard Webhooks signature verifies (HMAC-SHA256 keyed by the endpoint's
``whsec_`` secret, computed here with ``hmac``, a timestamp within 5 minutes). Afterwards
every crossing account's balance (``GET /v1/credits``) is its grant less the oracle's charge,
and ``metering verify`` must pass. Anything else is a problem and the figures are not met. The
receiver is the harness's own (``http.server`` on loopback), answering 200.

Run: ``python -m bench webhooks``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.common import (
    GATEWAY_TOKEN,
    Admin,
    Books,
    CodeUnderTest,
    Result,
    bench_database,
    catalog_file,
    format_timestamp,
    median,
    percentile,
    rounds_label,
)
from tests import oracle

MODEL = "Bench-Hooks"
CENT_RATES = (1_000_000_000, 0, 0)  # 1000 prompt tokens: one cent
CROSSING_USAGE = {"prompt_tokens": 1000, "completion_tokens": 0, "total_tokens": 1000}
CROSSING_CHARGE = oracle.event_charge(
    {"api": "chat_completions", "usage": CROSSING_USAGE}, CENT_RATES
).total_microcents
ALLOW_PRIVATE = (("METERING_WEBHOOK_ALLOW_PRIVATE", "true"),)
TOLERANCE_SECONDS = 300  # a Standard Webhooks verifier's window for webhook-timestamp


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


def signature(secret: str, message_id: str, timestamp: str, body: bytes) -> str:
    """The Standard Webhooks signature, written here: ``v1,`` and the base64 of the HMAC-SHA256
    of ``{webhook-id}.{webhook-timestamp}.{body}``, keyed by the base64-decoded part of the
    ``whsec_`` secret."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_by(secret: str, headers: Any, body: bytes) -> bool:
    """Whether a message's ``webhook-signature`` (space-separated signatures) holds one by
    ``secret``, and its ``webhook-timestamp`` is within ``TOLERANCE_SECONDS`` of now."""
    timestamp = headers.get("webhook-timestamp", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    expected = signature(secret, headers.get("webhook-id", ""), timestamp, body)
    given = headers.get("webhook-signature", "").split()
    return any(hmac.compare_digest(candidate, expected) for candidate in given)


@dataclass
class Receipt:
    """A message as it arrived at one endpoint."""

    at: float  # time.monotonic()
    body: dict[str, Any]
    signed: bool  # by the endpoint's secret (``signed_by``)


class Receiver:
    """The harness's receiver: one path per endpoint (``url(name)``), whose secret it is told
    (``expect``) before anything is sent there."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.secrets: dict[str, str] = {}  # path -> the endpoint's signing secret
        self.receipts: dict[str, dict[str, list[Receipt]]] = {}  # path -> webhook-id -> each
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
                    secret = receiver.secrets.get(self.path, "")
                try:
                    parsed = json.loads(body, parse_float=Decimal)
                except ValueError:
                    parsed = {}
                receipt = Receipt(
                    at,
                    parsed if isinstance(parsed, dict) else {},
                    signed_by(secret, self.headers, body),
                )
                with receiver.lock:
                    by_id = receiver.receipts.setdefault(self.path, {})
                    by_id.setdefault(message_id, []).append(receipt)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def expect(self, name: str, secret: str) -> None:
        with self.lock:
            self.secrets[f"/{name}"] = secret

    def arrived(self, name: str) -> dict[str, list[Receipt]]:
        with self.lock:
            return {i: list(r) for i, r in self.receipts.get(f"/{name}", {}).items()}

    def wait(self, name: str, ids: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ids <= set(self.arrived(name)):
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def check_messages(
    name: str, arrived: dict[str, list[Receipt]], expected: dict[str, str]
) -> list[str]:
    """Each expected message (webhook-id -> type) arrived once, signed, with that type and id
    in its body; nothing else arrived."""
    found = []
    missing = set(expected) - set(arrived)
    if missing:
        found.append(f"{name}: {len(missing)} of {len(expected)} messages never arrived")
    unexpected = set(arrived) - set(expected)
    if unexpected:
        found.append(f"{name}: {len(unexpected)} messages not sent, e.g. {sorted(unexpected)[0]}")
    counts = Counter(len(receipts) for i, receipts in arrived.items() if i in expected)
    if set(counts) - {1}:
        found.append(f"{name}: messages by times received: {dict(sorted(counts.items()))}")
    receipts = [(i, r) for i, rs in arrived.items() if i in expected for r in rs]
    unsigned = sum(1 for _, r in receipts if not r.signed)
    if unsigned:
        found.append(f"{name}: {unsigned} messages without a valid signature of the endpoint")
    wrong = [
        (i, r.body.get("id"), r.body.get("type"))
        for i, r in receipts
        if (r.body.get("id"), r.body.get("type")) != (i, expected[i])
    ]
    if wrong:
        found.append(f"{name}: {len(wrong)} messages with another id or type, e.g. {wrong[0]}")
    return found


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
        receiver = Receiver()
        server = code.server(url, workdir, 1).start()
        try:
            with Admin(server.base_url) as admin:
                rate = _throughput(config, code, url, workdir, admin, receiver, problems)
                lags = _lags(config, code, url, workdir, server.base_url, admin, receiver, problems)
        finally:
            server.stop()
            receiver.close()
        problems += code.verify(url, workdir)
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


def make_endpoint(
    admin: Admin, receiver: Receiver, name: str, types: list[str], account: str | None = None
) -> str:
    """A webhook endpoint at the receiver's path ``name``, whose secret the receiver learns."""
    made = admin._post(
        "/admin/v1/webhook-endpoints",
        {"url": receiver.url(name), "event_types": types, "account_id": account},
    )
    receiver.expect(name, str(made["secret"]))
    return str(made["id"])


def _throughput(
    config: Config,
    code: CodeUnderTest,
    url: str,
    workdir: Path,
    admin: Admin,
    receiver: Receiver,
    problems: list[str],
) -> float:
    account = admin.account("bench-hooks")
    endpoint = make_endpoint(admin, receiver, "throughput", ["webhook.test"], account)
    ids = set()
    for _ in range(config.events):
        response = admin.client.post(f"/admin/v1/webhook-endpoints/{endpoint}/test")
        if response.status_code != 200:
            problems.append(f"POST …/test: {response.status_code} {response.text[:200]}")
            break
        ids.add(response.json()["id"])
    scheduler = _scheduler(code, url, workdir)
    try:
        if not receiver.wait("throughput", ids, timeout=300):
            problems.append("throughput: messages missing after 300 s")
        time.sleep(1)  # a second round of the delivery loop: it must send nothing again
    finally:
        _stop(scheduler)
    arrived = receiver.arrived("throughput")
    problems += check_messages("throughput", arrived, dict.fromkeys(ids, "webhook.test"))
    times = sorted(min(r.at for r in arrived[i]) for i in ids if i in arrived)
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
    receiver: Receiver,
    problems: list[str],
) -> list[float]:
    """Each crossing account: a key, 1 cent of credit and a threshold of 1 cent; an endpoint
    for every account's ``credit.balance_low`` (and the probe's ``webhook.test``)."""
    books = Books()
    key_ids = {}
    for index in range(config.crossings):
        account = admin.account(f"bench-cross-{index}")
        key = admin.key(account)
        admin.grant(account, 1)
        books.open(account, 1, [key])
        key_ids[account] = key[0]
        response = admin.client.patch(
            f"/admin/v1/accounts/{account}", json={"low_balance_threshold_cents": 1}
        )
        if response.status_code != 200:
            problems.append(f"PATCH account: {response.status_code} {response.text[:200]}")
    endpoint = make_endpoint(admin, receiver, "lag", ["credit.balance_low", "webhook.test"])
    scheduler = _scheduler(code, url, workdir)
    sent: dict[str, float] = {}
    charged: Counter[str] = Counter()
    occurred = format_timestamp(datetime.now(UTC) - timedelta(minutes=1))
    try:
        # The scheduler is up and looking every second once a test message has arrived.
        probe = admin.client.post(f"/admin/v1/webhook-endpoints/{endpoint}/test").json()["id"]
        if not receiver.wait("lag", {probe}, timeout=120):
            problems.append("lag: the scheduler delivered nothing in 120 s")
        with httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}, timeout=30
        ) as gateway:
            for account, key_id in key_ids.items():
                event = {
                    "request_id": f"r-{account}",
                    "api_key_id": key_id,
                    "model": MODEL,
                    "api": "chat_completions",
                    "usage": CROSSING_USAGE,
                    "occurred_at": occurred,
                    "outcome": "completed",
                }
                sent[account] = time.monotonic()
                response = gateway.post("/v1/usage/events", json={"events": [event]})
                if response.status_code != 200 or response.json().get("recorded") != 1:
                    problems.append(f"usage event: {response.status_code} {response.text[:200]}")
                else:
                    charged[key_id] += CROSSING_CHARGE
                time.sleep(config.pace)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(receiver.arrived("lag")) < len(sent) + 1:
            time.sleep(0.05)
        time.sleep(1)  # a second round of the delivery loop: it must send nothing again
    finally:
        _stop(scheduler)
    problems += books.problems(base_url, charged)
    arrived = receiver.arrived("lag")
    crossings = {i: r[0] for i, r in arrived.items() if i != probe}
    expected = {probe: "webhook.test"} | dict.fromkeys(crossings, "credit.balance_low")
    problems += check_messages("lag", arrived, expected)
    problems += _check_crossings(books, charged, key_ids, crossings)
    by_account = {r.body.get("data", {}).get("account_id"): r.at for r in crossings.values()}
    lags = []
    for account in key_ids:
        if account in by_account:
            lags.append((by_account[account] - sent[account]) * 1000)
    return lags or [0.0]


def _check_crossings(
    books: Books, charged: Counter[str], key_ids: dict[str, str], crossings: dict[str, Receipt]
) -> list[str]:
    """One ``credit.balance_low`` per account, each with the balance the books say (its grant
    less the oracle's charge of its event) and the threshold of 1 cent."""
    found = []
    accounts = Counter(r.body.get("data", {}).get("account_id") for r in crossings.values())
    missing = [account for account in key_ids if account not in accounts]
    if missing or set(accounts) - set(key_ids) or set(accounts.values()) - {1}:
        found.append(
            f"lag: credit.balance_low for {len(accounts)} accounts ({len(missing)} missing, "
            f"{sum(n for n in accounts.values() if n > 1)} twice) of {len(key_ids)} crossing"
        )
    for receipt in crossings.values():
        data = receipt.body.get("data", {})
        account = data.get("account_id")
        if account not in books.granted:
            continue
        balance = books.granted[account] - charged[key_ids[account]]
        expected = (Decimal(balance) / oracle.MICROCENTS_PER_CENT, Decimal(1))
        shown = (data.get("balance_cents"), data.get("threshold_cents"))
        if shown != expected:
            found.append(f"lag: {account}'s crossing shows {shown}, the books {expected}")
            break
    return found


__all__ = ["Config", "median", "run"]
