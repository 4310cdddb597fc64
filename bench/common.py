"""What every benchmark shares: results, statistics, the code under test and its processes.

The harness never imports ``metering``: it drives the code under test only through what an
operator and a gateway use — ``metering migrate``, ``metering catalog import`` and ``metering
verify`` run as commands, the HTTP API of real uvicorn processes, and plain SQL counts — so the
same harness measures any checkout of the service (``CodeUnderTest``; ``make bench-compare``
points it at an older commit), and a benchmark cannot share a bug with what it measures.
The amounts it expects come from the price oracle of the tests (``tests/oracle.py``), which
imports nothing of the service either.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg
from sqlalchemy.engine import make_url

from tests.oracle import MICROCENTS_PER_CENT

HARNESS_ROOT = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "bench-admin-token"
GATEWAY_TOKEN = "bench-gateway-token"
SECRET_KEY = "bench-secret-key-of-at-least-32-characters"
PG_MAINTENANCE_URL = os.environ.get(
    "METERING_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
# Rounds of each alternated comparison (ours, ceiling, ours, ceiling, ...): figures are medians.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


@dataclass(frozen=True)
class Result:
    name: str  # stable id across runs, for ``bench.compare``: e.g. "ledger.spread"
    figure: str  # what was measured, e.g. "authorizations/s, 16 clients, 100 accounts"
    target: str  # e.g. ">= 1000/s", or "-"
    measured: float
    unit: str  # e.g. "/s", "ms", "MB"
    target_met: bool | None  # the measured value against its target; None: no target
    statistic: str  # how ``measured`` was reduced: "median of 3 rounds", "max of 3 rounds", ...
    baseline: str = ""  # the in-run ceiling and our ratio to it, e.g. "41% of bare FastAPI"
    ceiling: float | None = None  # the in-run ceiling's figure, in ``unit`` (for ratios)
    higher_is_better: bool = True
    # Why the figure cannot be trusted: unexpected answers, counts that do not match what was
    # sent, ``metering verify`` mismatches. Any problem makes the figure "not met".
    problems: tuple[str, ...] = ()

    @property
    def met(self) -> bool | None:
        if self.problems:
            return False
        return self.target_met

    @property
    def ratio(self) -> float | None:
        """``measured`` as a share of its in-run ceiling."""
        return self.measured / self.ceiling if self.ceiling else None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "figure": self.figure,
            "target": self.target,
            "measured": self.measured,
            "unit": self.unit,
            "met": self.met,
            "target_met": self.target_met,
            "statistic": self.statistic,
            "baseline": self.baseline,
            "ceiling": self.ceiling,
            "higher_is_better": self.higher_is_better,
            "problems": list(self.problems),
        }


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0–100)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil
    return ordered[int(rank) - 1]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def rounds_label(count: int, how: str = "median") -> str:
    return f"{how} of {count} rounds" if count > 1 else "1 round"


def format_timestamp(at: datetime) -> str:
    """RFC 3339 in UTC with ``Z``, as the API takes it."""
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def bench_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one benchmark (dropped afterwards); its URL."""
    name = f"metering_bench_{secrets.token_hex(6)}"
    with psycopg.connect(libpq_url(PG_MAINTENANCE_URL), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_MAINTENANCE_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq_url(PG_MAINTENANCE_URL), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sql_scalar(url: str, query: str, *params: Any) -> Any:
    with psycopg.connect(libpq_url(url)) as connection:
        row = connection.execute(query, params).fetchone()
    return row[0] if row else None


@dataclass
class Server:
    """One uvicorn process (with ``workers`` workers) serving ``app`` from ``root``."""

    app: str  # "module:factory"
    root: Path  # the checkout whose code it runs (its working directory and PYTHONPATH)
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: int = 1
    ready_path: str = "/readyz"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"uvicorn-{self.port}.log"
        # As `metering serve` runs its workers: metrics in prometheus-client's multiprocess mode,
        # a fresh directory per start (a checkout from before it ignores the variable).
        metrics = self.workdir / f"metrics-{self.port}"
        shutil.rmtree(metrics, ignore_errors=True)
        metrics.mkdir()
        env = {**self.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
        with open(log_path, "ab") as log:
            # uvicorn puts its working directory first on sys.path: the root's code is served.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory", self.app,
                 "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers),
                 "--no-access-log", "--log-level", "warning"],
                cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.app} exited early: {_tail(log_path)}")
            try:
                if httpx.get(self.base_url + self.ready_path, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.app} was not ready in {timeout:.0f} s: {_tail(log_path)}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _clean_env() -> dict[str, str]:
    """The harness's environment without anything that would choose the code or configure it."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("METERING_") and k not in ("PYTHONPATH", "PYTHONSAFEPATH")
    }


@dataclass(frozen=True)
class CodeUnderTest:
    """A checkout of the service (default: this one), run only as its operators run it."""

    root: Path = HARNESS_ROOT
    server_env: tuple[tuple[str, str], ...] = ()  # METERING_* overrides for its servers

    def env(self, database_url: str, workdir: Path, *, server: bool = False) -> dict[str, str]:
        env = _clean_env()
        env.update(
            {
                "PYTHONPATH": str(self.root),
                "METERING_DATABASE_URL": database_url,
                "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
                "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
                # Read by checkouts that have the portal or webhooks (older ones ignore them).
                "METERING_SECRET_KEY": SECRET_KEY,
                "METERING_PUBLIC_BASE_URL": "http://127.0.0.1:8000",
                "METERING_DATA_DIR": str(workdir),
                "METERING_EXPORT_DIR": str(workdir / "exports"),
                "METERING_LOG_LEVEL": "WARNING",
            }
        )
        if server:
            env.update(dict(self.server_env))
        return env

    def command(
        self, database_url: str, workdir: Path, *args: str, timeout: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        """``metering ARGS`` of this checkout (its console script's entry point)."""
        workdir.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            [sys.executable, "-c",
             "import sys; from metering.cli import main; sys.exit(main(sys.argv[1:]))", *args],
            cwd=self.root, env=self.env(database_url, workdir), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def migrate(self, database_url: str, workdir: Path) -> None:
        done = self.command(database_url, workdir, "migrate")
        if done.returncode != 0:
            raise RuntimeError(f"metering migrate failed: {done.stdout}{done.stderr}")

    def import_catalog(self, database_url: str, workdir: Path, path: Path) -> None:
        done = self.command(database_url, workdir, "catalog", "import", str(path))
        if done.returncode != 0:
            raise RuntimeError(f"metering catalog import failed: {done.stdout}{done.stderr}")

    def verify(self, database_url: str, workdir: Path) -> list[str]:
        """``metering verify``: its mismatches (empty when the books reconcile)."""
        done = self.command(database_url, workdir, "verify")
        if done.returncode == 0:
            return []
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        return [f"metering verify exited {done.returncode}: " + "; ".join(lines[:5])]

    def server(self, database_url: str, workdir: Path, workers: int) -> Server:
        return Server(
            "metering.asgi:create",
            self.root,
            workdir,
            self.env(database_url, workdir, server=True),
            workers,
        )


def baseline_server(workdir: Path, workers: int) -> Server:
    """``bench.baseline_app`` (the harness's own do-nothing FastAPI app)."""
    env = {**_clean_env(), "PYTHONPATH": str(HARNESS_ROOT)}
    return Server("bench.baseline_app:create", HARNESS_ROOT, workdir, env, workers, "/healthz")


class Admin:
    """The admin API of a server under test, for a benchmark's setup (what an operator does)."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        )

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._checked(path, self.client.post(path, json=body))

    @staticmethod
    def _checked(path: str, response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 201:
            raise RuntimeError(f"setup: POST {path}: {response.status_code} {response.text[:300]}")
        return dict(response.json())

    def account(self, name: str) -> str:
        return str(self._post("/admin/v1/accounts", {"name": name, "billing": "prepaid"})["id"])

    def key(self, account_id: str, limit: tuple[int, str] | None = None) -> tuple[str, str]:
        """A new API key of the account (``limit``: its spend limit, (cents, window)): (its id,
        its secret)."""
        path = f"/admin/v1/accounts/{account_id}/api-keys"
        fields: dict[str, Any] = {"name": "bench"}
        if limit is not None:
            fields |= {"spend_limit_cents": limit[0], "spend_limit_window": limit[1]}
        response = self.client.post(path, json=fields)
        if (
            limit is not None
            and response.status_code == 400
            and "spend_limit_cents" in response.text
        ):
            # Code from before a limit's window (the pinned reference): a monthly limit, the one
            # kind it has.
            fields = {"name": "bench", "monthly_spend_limit_cents": limit[0]}
            response = self.client.post(path, json=fields)
        body = self._checked(path, response)
        return str(body["id"]), str(body["key"])

    def access_rules(
        self, account_id: str, models: Sequence[str], max_concurrent_requests: int
    ) -> bool:
        """The access limits on the account (a model list, a limit on requests in flight), so the
        checks are on the measured path; False on code that has no such routes (a commit from
        before them, in a before/after comparison), which then measures without them."""
        limited = self.client.patch(
            f"/admin/v1/accounts/{account_id}",
            json={"max_concurrent_requests": max_concurrent_requests},
        )
        if limited.status_code in (404, 405):
            return False
        listed = self.client.put(
            f"/admin/v1/accounts/{account_id}/model-access", json={"models": list(models)}
        )
        for response in (limited, listed):
            if response.status_code != 200:
                raise RuntimeError(f"setup: {response.status_code} {response.text[:300]}")
        return True

    def layered_key(
        self, account_id: str, limits: Mapping[str, tuple[int, str]]
    ) -> tuple[str, str] | None:
        """A key of a new project, owned by a new member, with a spend limit on each of the
        three (``limits``: scope → (cents, window), for ``project``, ``member`` and ``key``):
        (its id, its secret). None on code that has no projects (a commit from before them),
        which then measures without them."""
        project = self.client.post(
            f"/admin/v1/accounts/{account_id}/projects",
            json={
                "name": "bench",
                "spend_limit_cents": limits["project"][0],
                "spend_limit_window": limits["project"][1],
            },
        )
        if project.status_code in (404, 405):
            return None
        if project.status_code != 201:
            raise RuntimeError(f"setup: {project.status_code} {project.text[:300]}")
        member = self._post(
            f"/admin/v1/accounts/{account_id}/members",
            {
                "email": f"bench@{account_id.lower()}.example",
                "role": "developer",
                "spend_limit_cents": limits["member"][0],
                "spend_limit_window": limits["member"][1],
            },
        )
        body = self._post(
            f"/admin/v1/accounts/{account_id}/api-keys",
            {
                "name": "bench",
                "project_id": project.json()["id"],
                "member_id": member["id"],
                "spend_limit_cents": limits["key"][0],
                "spend_limit_window": limits["key"][1],
            },
        )
        return str(body["id"]), str(body["key"])

    def grant(self, account_id: str, cents: int) -> None:
        self._post(
            f"/admin/v1/accounts/{account_id}/grants",
            {"amount_cents": cents, "idempotency_key": f"seed-{account_id}"},
        )

    def three_grants(self, account_id: str, cents: int) -> None:
        """``cents`` of credit as three grants: a promotional one (a tenth, expiring in 30
        days, spent first) and two paid ones. A server from before credit grants had terms
        (400 on them) gets the promotional one as a plain grant."""
        path = f"/admin/v1/accounts/{account_id}/grants"
        promotional = cents // 10
        expires = format_timestamp(datetime.now(UTC) + timedelta(days=30))
        body = {"amount_cents": promotional, "idempotency_key": f"promo-{account_id}"}
        response = self.client.post(
            path, json={**body, "category": "promotional", "expires_at": expires}
        )
        if response.status_code == 400:
            self._post(path, body)
        elif response.status_code != 201:
            raise RuntimeError(f"setup: POST {path}: {response.status_code} {response.text[:300]}")
        half = (cents - promotional) // 2
        for index, amount in enumerate((half, cents - promotional - half)):
            self._post(
                path, {"amount_cents": amount, "idempotency_key": f"paid{index}-{account_id}"}
            )


def catalog_file(workdir: Path, models: Sequence[str], rates: tuple[int, int, int]) -> Path:
    """A catalog for ``metering catalog import``: the models, priced since 2000."""
    import json

    path = workdir / "bench-catalog.json"
    price = {
        "effective_at": "2000-01-01T00:00:00Z",
        "input_microcents_per_million": rates[0],
        "output_microcents_per_million": rates[1],
        "cache_read_microcents_per_million": rates[2],
    }
    models_json = [
        {"id": m, "display_name": m, "context_length": 131072, "prices": [price]} for m in models
    ]
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"models": models_json}))
    return path


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class Books:
    """The accounts a benchmark set up, as the harness itself counts them: what each was
    granted, and which keys are its. What the service holds must agree with them (``problems``)
    once the charges of the usage it answered as recorded are known (the price oracle's, by key):
    ``metering verify`` checks the service against itself, this checks it against the load."""

    granted: dict[str, int] = field(default_factory=dict)  # account -> microcents
    secrets: dict[str, str] = field(default_factory=dict)  # account -> a key's secret
    accounts: dict[str, str] = field(default_factory=dict)  # key id -> its account

    def open(self, account: str, granted_cents: int, keys: Sequence[tuple[str, str]]) -> None:
        """An account granted ``granted_cents`` in all, with its keys: (id, secret) each."""
        self.granted[account] = granted_cents * MICROCENTS_PER_CENT
        self.secrets[account] = keys[0][1]
        self.accounts.update((key_id, account) for key_id, _secret in keys)

    def problems(self, base_url: str, charged: Mapping[str, int]) -> list[str]:
        """Each account's ``GET /v1/credits`` against its books: a balance of its grants less
        the charges of its keys (``charged``: microcents by key id), and nothing held (every
        hold of the load was settled or voided)."""
        due: Counter[str] = Counter()
        for key_id, microcents in charged.items():
            if key_id not in self.accounts:
                return [f"charges counted for {key_id}, a key the benchmark never made"]
            due[self.accounts[key_id]] += microcents
        found = []
        with httpx.Client(base_url=base_url, timeout=60) as client:
            for account, secret in self.secrets.items():
                response = client.get("/v1/credits", headers={"Authorization": f"Bearer {secret}"})
                if response.status_code != 200:
                    found.append(f"credits of {account}: {response.status_code}")
                    continue
                body = response.json()
                expected = (self.granted[account] - due[account], 0)
                shown = (body.get("balance_microcents"), body.get("held_microcents"))
                if shown != expected:
                    found.append(
                        f"{account}: balance and held {shown} µ¢, but the grants less the "
                        f"oracle's charges are {expected[0]} and nothing is held"
                    )
        return found[:3] + ([f"... {len(found) - 3} more accounts"] if len(found) > 3 else [])
