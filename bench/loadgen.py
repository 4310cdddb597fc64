"""A lean HTTP/1.1 keep-alive load generator (asyncio streams): a benchmark's client must cost
far less CPU than the server it measures, on a machine where both share two cores."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


class HttpError(Exception):
    pass


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One persistent connection; requests on it are sequential, as a real client's are."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.base_headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Response:
        if self.writer is None:
            await self._connect()
        assert self.reader is not None and self.writer is not None
        payload = (
            b""
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.base_headers}{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        status_line = await self.reader.readline()
        if not status_line:
            raise HttpError("connection closed")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        closing = False
        received: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            lowered = name.strip().lower()
            received[lowered.decode("latin-1")] = value.strip().decode("latin-1")
            if lowered == b"content-length":
                length = int(value.strip())
            elif lowered == b"connection" and value.strip().lower() == b"close":
                closing = True
        data = await self.reader.readexactly(length) if length else b""
        if closing:
            await self.close()
        return Response(status, data, received)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


class Unexpected(Exception):
    """An answer the operation did not expect: counted as an error, never as a success."""


def expect(response: Response, status: int, what: str, /, **fields: Any) -> Any:
    """The response's JSON body when it has ``status`` and each of ``fields`` at its value
    (top-level members of the body); otherwise ``Unexpected``."""
    if response.status != status:
        raise Unexpected(f"{what}: {response.status}, expected {status}: {response.body[:160]!r}")
    if not fields:
        return None
    try:
        body = response.json()
    except ValueError as exc:
        raise Unexpected(f"{what}: not JSON: {response.body[:160]!r}") from exc
    for name, value in fields.items():
        if not isinstance(body, dict) or body.get(name) != value:
            got = body.get(name) if isinstance(body, dict) else body
            raise Unexpected(f"{what}: {name} = {got!r}, expected {value!r}")
    return body


@dataclass
class LoadResult:
    """One load run. Counts and latencies cover only operations started in the measured window
    on a connection already open (no warm-up, no connection set-up); ``errors`` and
    ``attempted`` cover every operation, warm-up included."""

    operations: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, one per measured operation
    elapsed: float = 0.0
    attempted: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.operations / self.elapsed if self.elapsed else 0.0

    def problems(self, side: str) -> list[str]:
        if not self.errors:
            return []
        return [
            f"{side}: {self.errors} of {self.attempted} operations failed, e.g. "
            + " | ".join(self.error_samples)
        ]


# One client iteration: given its connection, its client index and iteration, do one operation
# (which may be several requests, e.g. authorize then void), raising ``Unexpected`` for any
# answer but the one it expects. It returns the latency to record for the operation (e.g. of its
# first request only), or None for the whole operation's.
Operation = Callable[[Connection, int, int], Awaitable[float | None]]


async def _run(
    host: str,
    port: int,
    clients: int,
    duration: float,
    operation: Operation,
    headers: dict[str, str] | None,
    warmup: float,
) -> LoadResult:
    result = LoadResult()
    window_start = float("inf")
    stop_at = float("inf")

    def failed(message: str) -> None:
        result.errors += 1
        if len(result.error_samples) < 2:
            result.error_samples.append(message)

    async def client(index: int) -> None:
        connection = Connection(host, port, headers)
        iteration = 0
        try:
            while True:
                started = time.perf_counter()
                if started >= stop_at:
                    return
                warm = connection.writer is not None
                latency: float | None = None
                ok = False
                try:
                    latency = await operation(connection, index, iteration)
                    ok = True
                except Unexpected as exc:
                    failed(str(exc))
                except (HttpError, OSError, asyncio.IncompleteReadError) as exc:
                    failed(f"connection: {exc!r}")
                    await connection.close()
                ended = time.perf_counter()
                iteration += 1
                result.attempted += 1
                if started >= window_start and warm:
                    result.operations += 1
                    if ok:
                        result.latencies.append(ended - started if latency is None else latency)
        finally:
            await connection.close()

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(warmup)
    window_start = time.perf_counter()
    stop_at = window_start + duration
    await asyncio.gather(*tasks)
    result.elapsed = time.perf_counter() - window_start
    return result


def run_load(
    base_url: str,
    clients: int,
    duration: float,
    operation: Operation,
    headers: dict[str, str] | None = None,
    warmup: float = 1.0,
) -> LoadResult:
    """Drive ``clients`` concurrent connections for ``duration`` seconds after a warm-up."""
    hostport = base_url.removeprefix("http://").rstrip("/")
    host, _, port = hostport.partition(":")
    return asyncio.run(_run(host, int(port), clients, duration, operation, headers, warmup))
