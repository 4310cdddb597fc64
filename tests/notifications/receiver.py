"""A real HTTP(S) receiver on loopback for webhook tests: it records what arrives and answers
by a plan (status, delay, headers), one step per request, then 200."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import standardwebhooks


@dataclass(frozen=True)
class Step:
    status: int = 200
    delay: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    port: int = 0
    scheme: str = "http"
    plan: list[Step] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.received)} of {count} messages arrived")

    def ids(self) -> list[str]:
        with self.lock:
            return [r.headers["webhook-id"] for r in self.received]


def verified(secret: str, message: Received) -> Any:
    """The message's JSON, verified by the Standard Webhooks library (not our code)."""
    return standardwebhooks.Webhook(secret).verify(message.body, message.headers)


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            with receiver.lock:
                receiver.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                             time.monotonic())
                )  # fmt: skip
                step = receiver.plan.pop(0) if receiver.plan else Step()
                receiver.in_flight += 1
                receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
            try:
                if step.delay < 0:  # hang until released
                    receiver.release.wait(60)
                elif step.delay:
                    time.sleep(step.delay)
                self.send_response(step.status)
                for name, value in step.headers:
                    self.send_header(name, value)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:
                pass
            finally:
                with receiver.lock:
                    receiver.in_flight -= 1

        def do_GET(self) -> None:
            with receiver.lock:
                receiver.received.append(
                    Received(self.path, dict(self.headers.items()), b"", time.monotonic())
                )
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # many senders at once connect without being refused
    daemon_threads = True


@contextmanager
def receiving(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    receiver = Receiver(scheme="https" if tls else "http")
    server = _Server(("127.0.0.1", 0), _handler(receiver))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()


def real_now() -> datetime:
    """Standard Webhooks verifiers check the timestamp against the wall clock (±5 minutes)."""
    return datetime.now(UTC).replace(microsecond=0)
