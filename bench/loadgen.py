"""A lean HTTP/1.1 keep-alive load generator (asyncio streams): a benchmark's client must cost
far less CPU than the server it measures, on a machine where both share two cores."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
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

    @property
    def local_port(self) -> int | None:
        if self.writer is None:
            return None
        return int(self.writer.get_extra_info("sockname")[1])

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
    spread: str = ""  # the connections per server process, e.g. "4 + 4"

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


# -- Connections spread over the server's processes ---------------------------------------------
#
# A server of several uvicorn workers shares one listening socket, and a worker that wakes for a
# burst of connections accepts all of it: eight keep-alive clients opened at once were often all
# served by one of two workers (seen: 8 and 0, 7 and 1, in six runs of eight), which halved the
# rate measured, and a benchmark's figure and its ceiling each drew their own split. The
# clients' connections are opened one at a time, and one that lands on a process already
# serving its share is opened again, until each process serves at most its share.

SPREAD_ATTEMPTS = 50  # new connections per client, at most, before the spread is left as it is


def _ss(*arguments: str) -> str:
    """``ss``'s lines for ``arguments`` (none when it cannot tell)."""
    try:
        return subprocess.run(
            ["ss", "-tnpH", *arguments], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def _accepting(port: int) -> set[int]:
    """The processes that accept on the local ``port``: those holding its listening socket, but
    a supervisor whose workers hold it too."""
    listening = _ss("-l", "sport", f"= :{port}")
    holders = {int(part.split(",")[0]) for part in listening.split("pid=")[1:]}
    parents = {_parent(pid) for pid in holders}
    return {pid for pid in holders if pid not in parents}


def _serving(port: int) -> dict[int, int]:
    """The process serving each connection established to the local ``port``, by the client's
    port."""
    serving = {}
    for line in _ss("state", "established", "sport", f"= :{port}").splitlines():
        fields = line.split()
        if "pid=" in line and len(fields) >= 4:
            client_port = int(fields[3].rsplit(":", 1)[1])
            serving[client_port] = int(line.split("pid=")[1].split(",")[0])
    return serving


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


async def _spread(connections: list[Connection], port: int) -> str:
    """Open ``connections`` one at a time, each again (up to ``SPREAD_ATTEMPTS``) while the
    process it landed on serves its share already; how they ended up spread."""
    accepting = _accepting(port)
    share = math.ceil(len(connections) / len(accepting)) if accepting else len(connections)
    served: Counter[int | None] = Counter()
    for connection in connections:
        for attempt in range(SPREAD_ATTEMPTS):
            await connection._connect()
            await asyncio.sleep(0.005)  # accepted by then: the server's loop is idle
            owner = _serving(port).get(connection.local_port or 0)
            if owner is None or served[owner] < share or attempt == SPREAD_ATTEMPTS - 1:
                break  # the last attempt's connection is kept, wherever it landed
            await connection.close()
        served[owner] += 1
    return " + ".join(str(n) for n in sorted(served.values(), reverse=True))


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

    connections = [Connection(host, port, headers) for _ in range(clients)]
    result.spread = await _spread(connections, port)

    async def client(index: int) -> None:
        connection = connections[index]
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
