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

from tests.conftest import ADMIN_TOKEN, GATEWAY_TOKEN, SECRET_KEY


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """One ``uvicorn metering.asgi:create`` process (optionally with several workers)."""

    database_url: str
    workdir: Path
    port: int = field(default_factory=free_port)
    workers: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    # ``metering serve`` (as an operator starts it: its workers share one metrics directory)
    # instead of uvicorn itself.
    serve_command: bool = False
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        return self.launch().wait_ready(timeout)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.port}.log"

    def launch(self) -> ServerProcess:
        """Start the process without waiting for it to answer (``wait_ready``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
        env.update(
            {
                "METERING_DATABASE_URL": self.database_url,
                "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
                "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
                "METERING_SECRET_KEY": SECRET_KEY,
                "METERING_PUBLIC_BASE_URL": self.base_url,
                "METERING_DATA_DIR": str(self.workdir),
                "METERING_EXPORT_DIR": str(self.workdir / "exports"),
                "METERING_LOG_LEVEL": "WARNING",
                **self.extra_env,
            }
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        where = ["--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]
        if self.serve_command:
            argv = [sys.executable, "-m", "metering.cli", "serve", *where]
        else:
            argv = [
                *(sys.executable, "-m", "uvicorn", "--factory", "metering.asgi:create", *where),
                *("--no-access-log", "--log-level", "warning"),
            ]
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()  # the child has its own descriptor
        return self

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        """Until ``/readyz`` answers 200; a process that exits or never answers fails."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
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

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, mid-request, no shutdown handlers."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
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


def run_cli(database_url: str, workdir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """A ``metering`` command on ``database_url``, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        {
            "METERING_DATABASE_URL": database_url,
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_DATA_DIR": str(workdir),
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
