"""A new user's first hour, as the README tells it: `metering migrate` says what it applied and
loads the shipped catalog into an empty catalog (so the quickstart's hold finds its model on
PostgreSQL too), and the embedded server runs the scheduler's jobs itself, once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2 as httpx
import pytest

from metering import demo, migrate
from metering.catalog.importer import SHIPPED_CATALOG
from metering.cli import main
from metering.functions import PROGRAMS
from metering.kit.timeutil import floor_day
from tests.conftest import BACKENDS, SECRET_KEY, fresh_database, running_api
from tests.test_cli import METERING, SHIPPED, _clean_env, _free_port


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(autouse=True)
def _no_metering_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("METERING_") and not name.startswith("METERING_TEST_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrate_says_what_it_applied_and_loads_the_catalog_once(
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with fresh_database(backend, tmp_path) as url:
        monkeypatch.setenv("METERING_DATABASE_URL", url)
        assert main(["migrate"]) == 0
        out = capsys.readouterr().out
        applied = re.findall(r"^  (\d{4}) ", out, re.MULTILINE)
        # In order from the baseline, one migration per change of the schema after it.
        assert applied == sorted(applied) and applied[0] == "0001"
        assert f"applied {len(applied)} migrations" in out
        assert "0001 The baseline" in out
        if backend != "sqlite":  # SQLite runs the programs itself
            functions = len(PROGRAMS)
            assert f"installed {functions} of the {functions} generated functions" in out
        assert "the model catalog was empty: loading the shipped catalog" in out
        assert f"models created: {len(SHIPPED['models'])} " in out

        assert main(["migrate"]) == 0
        again = capsys.readouterr().out
        head = migrate.head_revision()
        assert f"nothing to apply: the schema is at the newest migration ({head})" in again
        assert "installed" not in again.replace("none installed", "")
        assert "catalog" not in again

        with running_api(backend, url, tmp_path) as api:
            listed = api.client.get("/v1/models").json()["data"]
            assert "GLM-5.3" in {card["id"] for card in listed}
            events = api.admin("GET", "/admin/v1/audit-events", params={"actor": "cli"}).json()
            actions = {event["action"] for event in events["data"]}
            assert actions == {"model.create", "price.create"}
            assert len(events["data"]) == len(SHIPPED["models"]) + sum(
                len(m["prices"]) for m in SHIPPED["models"]
            )


def test_migrate_leaves_a_catalog_that_has_models_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with fresh_database("sqlite", tmp_path) as url:
        monkeypatch.setenv("METERING_DATABASE_URL", url)
        model = SHIPPED["models"][0]
        path = tmp_path / "one.json"
        path.write_text(json.dumps({"models": [model]}))
        migrate.upgrade(url)
        assert main(["catalog", "import", str(path)]) == 0
        capsys.readouterr()
        assert main(["migrate"]) == 0
        assert "catalog" not in capsys.readouterr().out
    assert SHIPPED_CATALOG.exists()


def _whole_demo_days(earliest: datetime, latest: datetime) -> set[str]:
    """The days wholly inside the demo's window whatever instant in [earliest, latest] the
    server seeded it at: each has usage and has ended (the window ends a minute before then)."""
    first = floor_day(latest - timedelta(days=demo.DAYS, minutes=1))
    last = floor_day(earliest - timedelta(minutes=1))
    days = (first + timedelta(days=n) for n in range(1, demo.DAYS + 1))
    return {day.date().isoformat() for day in days if day + timedelta(days=1) <= last}


def test_the_embedded_server_runs_the_scheduler_once_with_two_workers(tmp_path: Path) -> None:
    """The demo's ended days are exported by the server itself (no `metering scheduler`), by
    one scheduler in the command's process, not one per worker."""
    port = _free_port()
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    env = {**_clean_env(), "METERING_EXPORT_AFTER_MINUTES": "0"}
    started = datetime.now(UTC)
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [str(METERING), "serve", "--port", str(port), "--workers", "2"],
            cwd=tmp_path,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        exports = tmp_path / "data" / "exports"
        deadline = time.monotonic() + 90
        expected = _whole_demo_days(started, datetime.now(UTC) + timedelta(seconds=90))
        assert len(expected) >= demo.DAYS - 2
        while time.monotonic() < deadline and process.poll() is None:
            if exports.is_dir() and expected <= {p.name for p in exports.iterdir()}:
                break
            time.sleep(0.2)
        days = {p.name for p in exports.iterdir()} if exports.is_dir() else set()
        assert expected <= days, (sorted(expected - days), err.read_text()[-3000:])
        time.sleep(2)  # both workers up by now: neither starts a scheduler of its own
    finally:
        stop(process)
    logged = err.read_text()
    assert logged.count("scheduler started") == 1, logged[-3000:]
    assert "exported 1 accounts" in logged


def test_a_server_database_keeps_the_scheduler_out_of_the_server(
    tmp_path: Path,
) -> None:
    if "postgresql" not in BACKENDS:
        pytest.fail("needs PostgreSQL")
    with fresh_database("postgresql", tmp_path) as url:
        migrate.upgrade(url)
        port = _free_port()
        process = subprocess.Popen(
            [str(METERING), "serve", "--port", str(port)],
            cwd=tmp_path,
            env=_clean_env(
                METERING_DATABASE_URL=url,
                METERING_ADMIN_TOKENS="a1",
                METERING_GATEWAY_TOKENS="g1",
                METERING_SECRET_KEY=SECRET_KEY,
                METERING_PUBLIC_BASE_URL=f"http://127.0.0.1:{port}",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            # Up (however loaded the machine), then a moment in which a scheduler would start.
            assert _answers(f"http://127.0.0.1:{port}/healthz", process, within=90)
            time.sleep(2)
        finally:
            stop(process)
        assert process.stdout is not None
        logged = process.stdout.read().decode()
        assert "metering listening" in logged and "scheduler started" not in logged


def _answers(url: str, process: subprocess.Popen[bytes], within: float) -> bool:
    """Whether ``url`` answers 200 before ``within`` seconds pass or the process ends."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return False
