"""The README's quickstart, run as written (bash, curl, python3), on the embedded database and on
PostgreSQL. The only substitutions: a free port for 8000, and for PostgreSQL a fresh database
of the test's own for ``metering`` and the virtualenv's absolute path. (The embedded server is
started as ``make serve`` starts it, in a directory of the test's own.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BACKENDS, fresh_pg_database
from tests.test_cli import _free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
README = (ROOT / "README.md").read_text()


def _blocks(heading: str) -> list[str]:
    start = README.index(f"\n## {heading}\n")
    end = README.find("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", README[start:end], re.DOTALL)


def _env(**extra: str) -> dict[str, str]:
    env = {"PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def _wait(port: int) -> str:
    return (
        f"for _ in $(seq 150); do curl -sf localhost:{port}/readyz >/dev/null && break; "
        "sleep 0.2; done\n"
    )


def _run(script: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _check_own_account(out: str) -> None:
    assert '"object":"credit_grant"' in out and '"category":"paid"' in out, out
    assert '"status":"active"' in out, out  # the hold
    assert '"recorded": 1' in out, out  # the usage event, pretty-printed
    assert '"total_microcents": 87460' in out, out
    assert "starting_at,ending_at,model,requests" in out, out  # the CSV report
    # The credits before and after the usage event: 87,460 microcents less, the hold released.
    balances = [int(b) for b in re.findall(r'"balance_microcents":(-?\d+)', out)]
    held = [int(h) for h in re.findall(r'"held_microcents":(-?\d+)', out)]
    assert balances[-2] - balances[-1] == 87460, balances
    assert held[-2] > 0 and held[-1] == 0, held


def test_the_embedded_quickstart(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("the quickstart needs curl")
    port = _free_port()
    demo, own = (block.replace("8000", str(port)) for block in _blocks("Quickstart"))
    server = subprocess.Popen(
        [str(BIN / "metering"), "serve", "--port", str(port)],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        out = _run(_wait(port) + demo + own, tmp_path, _env())
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    assert '"object": "usage_report"' in out and '"cost_status": "billed"' in out, out
    assert '"object":"credit_balance"' in out, out
    assert '"id": "GLM-5.3"' in out, out
    _check_own_account(out)


def test_the_postgresql_quickstart(tmp_path: Path) -> None:
    if "postgresql" not in BACKENDS:
        pytest.fail("needs PostgreSQL")
    port = _free_port()
    (setup,) = _blocks("Quickstart on PostgreSQL")
    _, own = _blocks("Quickstart")
    with fresh_pg_database() as url:
        setup = (
            setup.replace("createdb metering", "true")
            .replace("postgresql+psycopg://postgres@127.0.0.1:5432/metering", url)
            .replace("make .venv/.installed", "true")
            .replace(".venv/bin/", f"{BIN}/")
            .replace("8000", str(port))
        )
        assert f"--port {port}" not in setup
        setup = setup.replace(
            "metering serve --workers 2", f"metering serve --port {port} --workers 2"
        )
        script = "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n" + setup
        script += own.replace("8000", str(port))
        script += (
            f"curl -s localhost:{port}/admin/v1/audit-events "
            '-H "Authorization: Bearer $METERING_ADMIN_TOKEN"\n'
        )
        started = time.monotonic()
        out = _run(script, tmp_path, _env())
        assert time.monotonic() - started < 240
    assert re.search(r"applied \d+ migrations", out), out
    assert "loading the shipped catalog" in out, out
    _check_own_account(out)
    assert '"actor":"ops"' in out and '"action":"grant.create"' in out, out
    assert "scheduler started" in (tmp_path / "scheduler.log").read_text()
