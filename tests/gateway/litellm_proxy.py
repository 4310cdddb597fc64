"""A real LiteLLM proxy process (from .venv-gateway) in front of metering, configured with
clients/python/examples/litellm-config.yaml plus two test models, run offline.

Offline: LiteLLM's bundled cost map, Anthropic beta headers, policy templates and tokenizers
(tiktoken's files ship inside LiteLLM; the Hugging Face hub is switched off). And a tripwire: the
proxy's HTTP(S)_PROXY points at a local listener that records any connection, so an attempt to
reach the internet by an HTTP library honouring those variables fails the run (EgressTrap)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx
import yaml

from metering_client.spool import Spool
from tests.conftest import GATEWAY_TOKEN
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
LITELLM = Path(
    os.environ.get("METERING_TEST_LITELLM") or ROOT / ".venv-gateway" / "bin" / "litellm"
)
EXAMPLE_CONFIG = ROOT / "clients" / "python" / "examples" / "litellm-config.yaml"
OFFLINE = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# Test models besides the example's: one LiteLLM serves and metering's catalog lacks, and one
# whose stream breaks after it started (tests/gateway/broken_stream.py).
UNKNOWN_TO_METERING = "Mystery-1"
BROKEN_STREAM = "DeepSeek-V4-Pro"


class EgressTrap:
    """A TCP listener standing in for an outbound proxy: records every connection made to it."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.attempts: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(2)
                try:
                    first = connection.recv(200).split(b"\r\n", 1)[0]
                except OSError:
                    first = b""
                self.attempts.append(first.decode("latin-1"))

    def close(self) -> None:
        self._socket.close()


@dataclass
class LiteLLMProxy:
    workdir: Path
    metering_url: str
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    trap: EgressTrap = field(default_factory=EgressTrap)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spool_path(self) -> Path:
        return self.workdir / "gateway-spool.sqlite3"

    @property
    def log_path(self) -> Path:
        return self.workdir / "litellm.log"

    def write_config(self) -> Path:
        config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
        config["model_list"] += [
            {
                "model_name": UNKNOWN_TO_METERING,
                "litellm_params": {
                    "model": f"openai/{UNKNOWN_TO_METERING}",
                    "api_key": "mock",
                    "mock_response": "Hello from a model metering does not know.",
                },
            },
            {"model_name": BROKEN_STREAM, "litellm_params": {"model": "brokenstream/any"}},
        ]
        config["litellm_settings"]["custom_provider_map"] = [
            {"provider": "brokenstream", "custom_handler": "broken_stream.handler"}
        ]
        shutil.copy(Path(__file__).with_name("broken_stream.py"), self.workdir)
        path = self.workdir / "litellm-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self, timeout: float = 240.0) -> LiteLLMProxy:
        assert LITELLM.exists(), f"{LITELLM} is missing: `make .venv-gateway/.installed` makes it"
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        trap = f"http://127.0.0.1:{self.trap.port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("METERING_", "LITELLM_", "OPENAI_", "ANTHROPIC_"))
            and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        }
        env.update(OFFLINE)
        env.update(
            {
                "METERING_URL": self.metering_url,
                "METERING_GATEWAY_TOKEN": GATEWAY_TOKEN,
                "METERING_SPOOL_PATH": str(self.spool_path),
                # Known keys are served through an outage (test_metering_outage), and the
                # outage's authorizations give up after a second.
                "METERING_ON_UNAVAILABLE": "allow",
                "METERING_AUTHORIZE_TIMEOUT": "1",
                "LITELLM_MASTER_KEY": f"sk-{secrets.token_hex(24)}",
                **{name: trap for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
                **{name.lower(): trap for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
            }
        )
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                str(LITELLM),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=self.workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"LiteLLM exited early; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"LiteLLM did not answer in {timeout} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.trap.close()

    def pending(self) -> int:
        """Usage events and voids the proxy's client has not had acknowledged yet."""
        if not self.spool_path.exists():
            return 0
        spool = Spool(self.spool_path)
        try:
            return spool.pending()
        finally:
            spool.close()

    def wait_drained(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.pending() == 0, f"the proxy's spool still holds {self.pending()} entries"


@contextmanager
def running_proxy(workdir: Path, metering_url: str) -> Iterator[LiteLLMProxy]:
    proxy = LiteLLMProxy(workdir, metering_url).start()
    try:
        yield proxy
    finally:
        proxy.stop()
    assert proxy.trap.attempts == [], f"the proxy tried to reach out: {proxy.trap.attempts}"
