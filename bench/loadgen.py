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
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            lowered = name.strip().lower()
            if lowered == b"content-length":
                length = int(value.strip())
            elif lowered == b"connection" and value.strip().lower() == b"close":
                closing = True
        data = await self.reader.readexactly(length) if length else b""
        if closing:
            await self.close()
        return Response(status, data)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


@dataclass
class LoadResult:
    operations: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, one per operation
    elapsed: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.operations / self.elapsed if self.elapsed else 0.0


# One client iteration: given its connection and its index, do one operation (which may be
# several requests, e.g. authorize then void) and return the status of the measured request.
Operation = Callable[[Connection, int, int], Awaitable[int]]


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
    measuring = False
    stop_at = 0.0

    async def client(index: int) -> None:
        connection = Connection(host, port, headers)
        iteration = 0
        try:
            while True:
                now = time.perf_counter()
                if measuring and now >= stop_at:
                    return
                started = now
                try:
                    status = await operation(connection, index, iteration)
                except (HttpError, OSError, asyncio.IncompleteReadError):
                    status = 0
                    await connection.close()
                iteration += 1
                if measuring:
                    result.latencies.append(time.perf_counter() - started)
                    result.operations += 1
                    result.statuses[status] = result.statuses.get(status, 0) + 1
                    if status == 0 or status >= 500:
                        result.errors += 1
        finally:
            await connection.close()

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(warmup)
    measuring = True
    started = time.perf_counter()
    stop_at = started + duration
    await asyncio.gather(*tasks)
    result.elapsed = time.perf_counter() - started
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
