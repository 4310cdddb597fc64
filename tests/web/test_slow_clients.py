"""Slow clients are cut off: ``metering serve`` as a user runs it (a real process, uvicorn and
the service's protocol), raw sockets that send a request's headers or its body a byte at a time
(to hold connections open, as a slowloris does), answered 408 and disconnected once the header or
body deadline has passed, while other requests are answered as usual."""

from __future__ import annotations

import http.client
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.test_cli import Server, _get

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0
PACE = 0.5  # seconds between bytes: far slower than any client, far faster than the deadlines


def _trickle(port: int, head: bytes, body: bytes = b"") -> tuple[float, bytes]:
    """Send ``head`` at once when ``body`` is given (then ``body`` a byte at a time), else
    ``head`` a byte at a time; returns how long until the server closed, and what it said."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(PACE)
        started = time.monotonic()
        if body:
            sock.sendall(head)
        answer = b""
        for byte in body or head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            answer += chunk
            sock.settimeout(5)
            while chunk:  # the rest of the answer, until the server closes
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    # A byte sent just as the server closed is answered by a reset, which may
                    # end the reading after the answer has arrived; what arrived is the answer.
                    break
                answer += chunk
            break
        return time.monotonic() - started, answer


def _idle(port: int) -> tuple[float, bytes]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(30)
        started = time.monotonic()
        answer = sock.recv(65536)
        return time.monotonic() - started, answer


def test_slow_headers_and_slow_bodies_are_cut_off(tmp_path: Path) -> None:
    server = Server(
        tmp_path,
        "slow",
        METERING_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        METERING_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
    )
    try:
        token = re.search(r"admin token:\s+(\S+)", server.stdout.read_text())
        assert token, server.output()
        headers = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        body_head = (
            b"POST /admin/v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token.group(1).encode() + b"\r\n"
            b"Content-Length: 200\r\n\r\n"
        )
        with ThreadPoolExecutor(max_workers=30) as pool:
            slow_heads = [pool.submit(_trickle, server.port, headers) for _ in range(20)]
            slow_bodies = [
                pool.submit(_trickle, server.port, body_head, b"{" + b" " * 199) for _ in range(5)
            ]
            idle = [pool.submit(_idle, server.port) for _ in range(3)]
            time.sleep(1)
            # Meanwhile the server answers everyone else at once.
            asked = time.monotonic()
            assert _get(server.port, "/healthz")[0] == 200
            assert time.monotonic() - asked < 1.5
            for future in slow_heads + idle:
                elapsed, answer = future.result(timeout=30)
                assert HEADER_TIMEOUT - 0.2 <= elapsed < HEADER_TIMEOUT + 4, elapsed
                assert answer.startswith(b"HTTP/1.1 408 "), answer
            for future in slow_bodies:
                elapsed, answer = future.result(timeout=30)
                assert BODY_TIMEOUT - 0.2 <= elapsed < BODY_TIMEOUT + 4, elapsed
                assert answer.startswith(b"HTTP/1.1 408 "), answer
                assert b'"code":"request_timeout"' in answer, answer
        # A request sent at a normal pace on a kept-alive connection is not cut off.
        kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            sockets = []
            for _ in range(3):
                kept.request("GET", "/healthz")
                answer = kept.getresponse()
                assert (answer.status, answer.read()) == (200, b'{"status":"ok"}')
                sockets.append(kept.sock)
                time.sleep(HEADER_TIMEOUT * 0.75)
            assert sockets[0] is not None and sockets == [sockets[0]] * 3  # one connection
        finally:
            kept.close()
    finally:
        server.stop()
    assert "Traceback" not in server.output()
