"""Real API server processes (uvicorn) for multi-process, concurrency and crash tests and for
the benchmarks: the service exactly as deployed, over loopback HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx

from tests.clocked import ENV as CLOCK_ENV
from tests.clocked import FileClock
from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, SECRET_KEY


def free_port() -> int:
    """A port nothing listens on now (for a URL that must be refused). Not for a server: another
    process may take it before the server binds it (ServerProcess binds its own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening_socket(port: int = 0) -> socket.socket:
    """A socket bound to ``port`` (0: one the OS picks) and listening, to hand to a server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


@dataclass
class ServerProcess:
    """One ``uvicorn metering.asgi:create`` process (optionally with several workers).

    Its port: the process is handed a socket this side bound and keeps bound until the server
    answers (``--fd``), so no other process can take the port between the two; 0 (the default)
    lets the OS choose it. ``metering serve`` (``serve_command``) binds the port itself, one
    found free just before. ``clock``: the servers' "now" is that test clock
    (tests/clocked.py) instead of the system's."""

    database_url: str
    workdir: Path
    port: int = 0
    workers: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    # ``metering serve`` (as an operator starts it: its workers share one metrics directory)
    # instead of uvicorn itself.
    serve_command: bool = False
    clock: FileClock | None = None
    process: subprocess.Popen[bytes] | None = None
    _socket: socket.socket | None = None

    @property
    def base_url(self) -> str:
        assert self.port, "the port is known once the server is launched"
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        return self.launch().wait_ready(timeout)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.port}.log"

    def launch(self) -> ServerProcess:
        """Start the process without waiting for it to answer (``wait_ready``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        if self.serve_command:
            # metering serve binds its port itself and needs its public URL first: the one
            # server left picking a free port before it starts.
            self.port = self.port or free_port()
            where = ["--host", "127.0.0.1", "--port", str(self.port)]
        else:
            self._socket = listening_socket(self.port)
            self.port = int(self._socket.getsockname()[1])
            where = ["--fd", str(self._socket.fileno())]
        env.update(
            {
                "METERING_DATABASE_URL": self.database_url,
                "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
                "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
                "METERING_SECRET_KEY": SECRET_KEY,
                "METERING_DATA_DIR": str(self.workdir),
                "METERING_EXPORT_DIR": str(self.workdir / "exports"),
                "METERING_LOG_LEVEL": "WARNING",
                **self.extra_env,
            }
        )
        env.setdefault("METERING_PUBLIC_BASE_URL", self.base_url)
        factory = "metering.asgi:create"
        if self.clock is not None:
            env[CLOCK_ENV] = str(self.clock.path)
            factory = "tests.clocked:create"
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        where += ["--workers", str(self.workers)]
        if self.serve_command:
            assert self.clock is None, "metering serve runs the system clock"
            argv = [sys.executable, "-m", "metering.cli", "serve", *where]
        else:
            argv = [
                *(sys.executable, "-m", "uvicorn", "--factory", factory, *where),
                *("--no-access-log", "--log-level", "warning"),
            ]
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=[self._socket.fileno()] if self._socket else [],
        )
        log.close()  # the child has its own descriptor
        return self

    def _release_socket(self) -> None:
        """Close this side's copy of the socket: the server holds the port from now on (and,
        once it ends, nothing does: a request is refused, not left waiting)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        """Until ``/readyz`` answers 200; a process that exits or never answers fails."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited early; see {self.log_path}")
                try:
                    if httpx.get(f"{self.base_url}/readyz", timeout=1.0).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            self.stop()
            raise RuntimeError(f"server did not become ready in {timeout}s; see {self.log_path}")
        finally:
            self._release_socket()

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, mid-request, no shutdown handlers."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        self._release_socket()
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def running_servers(
    database_url: str, workdir: Path, count: int = 2, **kwargs: object
) -> Iterator[list[ServerProcess]]:
    """``count`` separate server processes against one database, started side by side (each
    takes a few seconds to import the app)."""
    with ExitStack() as stack:
        servers = []
        for index in range(count):
            server = ServerProcess(database_url, workdir / f"server{index}", **kwargs)  # type: ignore[arg-type]
            stack.callback(server.stop)
            servers.append(server.launch())
        for server in servers:
            server.wait_ready()
        yield servers


def run_cli(
    database_url: str, workdir: Path, *argv: str, settings: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A ``metering`` command on ``database_url``, as an operator runs it (``settings``: more
    of its environment, e.g. the Stripe settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": database_url,
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_DATA_DIR": str(workdir),
            **(settings or {}),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "metering.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
