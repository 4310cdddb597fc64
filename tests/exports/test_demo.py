"""The embedded quick start's demo: a real ``metering serve`` started in an empty directory
seeds the demo through the ingest service and prints three curl commands, which are run here,
as printed, against that server; the setting turns it off; the data is deterministic."""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
from sqlalchemy import func, select

from metering.cli import _prepare_embedded
from metering.db import Database
from metering.demo import REASONING_MODELS, synthetic_events
from metering.models import Account, UsageEvent
from metering.settings import Settings
from tests import oracle
from tests.servers import free_port


def _start_serve(workdir: Path, port: int) -> tuple[subprocess.Popen[str], list[str], Path]:
    """``metering serve`` in ``workdir`` with no METERING_ configuration at all (the quick
    start); the stdout lines it printed up to "listening"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env["METERING_LOG_LEVEL"] = "INFO"
    script = Path(sys.executable).parent / "metering"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "metering.cli"]
    stderr = workdir / "server.log"
    process = subprocess.Popen(
        [*command, "serve", "--port", str(port)],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr.open("w"),
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    printed: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        printed.append(line)
        if line.startswith("metering listening on"):
            break
    base = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return process, printed, stderr
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    _stop(process)
    raise AssertionError(f"server did not start: {printed} {stderr.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def _run_printed(command: str) -> Any:
    """Run a printed curl command as printed (through a shell, with the real curl), or, where
    there is no curl, the same request parsed from its words."""
    if shutil.which("curl"):
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return httpx.Response(200, content=done.stdout.encode()).json()
    words = shlex.split(command)
    assert words[:2] == ["curl", "-s"]
    url = words[2]
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    response = httpx.get(url, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_first_serve_prints_a_demo_whose_curl_commands_return_its_data(tmp_path: Path) -> None:
    port = free_port()
    process, printed, log = _start_serve(tmp_path, port)
    try:
        out = "\n".join(printed)
        assert "admin token:" in out and "gateway token:" in out
        summary = re.search(
            r"([\d,]+) requests \((\d+) failed streams\), ([\d,]+) input tokens \(([\d,]+) cache "
            r"reads\), ([\d,]+) output tokens \(([\d,]+) reasoning\), cost \$([\d.]+)",
            out,
        )
        assert summary, out
        requests, failed, input_tokens, cache_reads, output_tokens, reasoning = (
            _number(g) for g in summary.groups()[:6]
        )
        cost_usd = summary.group(7)
        assert requests > 1000 and 0 < failed < requests / 50
        assert 0 < cache_reads < input_tokens and 0 < reasoning < output_tokens
        secret = re.search(r"^\s+(mk_\S+)$", out, re.MULTILINE)
        assert secret, out
        commands = [line.strip() for line in printed if line.strip().startswith("curl ")]
        assert len(commands) == 3, out
        assert all(f"127.0.0.1:{port}" in c and secret[1] in c for c in commands)
        report, credits, models = (_run_printed(c) for c in commands)

        assert report["object"] == "usage_report" and report["cost_status"] == "billed"
        totals = report["totals"]
        assert (totals["requests"], totals["input_tokens"], totals["output_tokens"]) == (
            requests,
            input_tokens,
            output_tokens,
        )
        assert totals["cache_read_tokens"] == cache_reads
        assert totals["cost_microcents"] == int(Decimal(cost_usd).scaleb(8)) > 0
        busy_days = [b for b in report["data"] if b["requests"] > 0]
        assert len(busy_days) >= 7  # a week of days with usage (plus today so far)
        used_models = {r["model"] for b in report["data"] for r in b["results"]}
        assert len(used_models) >= 3

        assert credits["object"] == "credit_balance"
        assert credits["balance_microcents"] == 5_000_000_000 - totals["cost_microcents"]

        listed = {card["id"] for card in models["data"]}
        assert used_models <= listed
    finally:
        _stop(process)
    # Every event at the oracle's charge: its tokens at the shipped catalog's list price in force
    # when it occurred (tests/oracle.py reads the catalog file itself).
    database = Database.from_url(f"sqlite:///{tmp_path / 'data' / 'metering.sqlite3'}")
    try:
        with database.reading() as session:
            stored = session.execute(
                select(
                    UsageEvent.model_id,
                    UsageEvent.occurred_at,
                    UsageEvent.prompt_tokens,
                    UsageEvent.cached_tokens,
                    UsageEvent.output_tokens,
                    UsageEvent.reasoning_tokens,
                )
            ).all()
    finally:
        database.dispose()
    prices = {model: oracle.catalog_prices(model) for model in {row[0] for row in stored}}
    due = 0
    for model, at, *tokens in stored:
        rates = oracle.rates_at(prices[model], at)
        assert rates is not None, (model, at)
        due += oracle.charge(oracle.Tokens(*tokens), rates).total_microcents
    assert len(stored) == requests
    assert totals["cost_microcents"] == due
    assert credits["balance_microcents"] == 5_000_000_000 - due
    # The secret went to the terminal only, never to the log.
    assert secret[1] not in log.read_text()
    assert (tmp_path / "data" / "demo.env").read_text() == f"METERING_DEMO_KEY={secret[1]}\n"


def test_the_setting_turns_the_demo_off(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url="", demo=False)
    _prepare_embedded(settings)
    database = Database.from_url(settings.effective_database_url)
    try:
        with database.unit_of_work() as session:
            assert session.execute(select(func.count()).select_from(Account)).scalar() == 0
    finally:
        database.dispose()
    assert not (tmp_path / "data" / "demo.env").exists()


def test_the_synthetic_usage_is_deterministic_and_shaped_like_a_week_of_traffic() -> None:
    end = datetime(2026, 11, 29, 18, 30, tzinfo=UTC)
    start = end - timedelta(days=7)
    models = [("DeepSeek-V4-Pro", 163840), ("GLM-5.3", 1048576), ("Qwen3.8-27B", 262144)]
    keys = ["key_a", "key_b", "key_c"]
    events = list(synthetic_events(keys, models, start, end))
    assert events == list(synthetic_events(keys, models, start, end))
    assert len({e["request_id"] for e in events}) == len(events)
    stamps = [datetime.fromisoformat(e["occurred_at"].replace("Z", "+00:00")) for e in events]
    assert all(start <= at < end for at in stamps)
    by_hour = Counter(at.hour for at in stamps)
    assert sum(by_hour[h] for h in range(13, 18)) > 3 * sum(by_hour[h] for h in range(1, 6))
    assert set(Counter(e["api_key_id"] for e in events)) == set(keys)
    assert set(Counter(e["api"] for e in events)) == {"chat_completions", "responses", "messages"}
    failed = sum(e["outcome"] == "failed" for e in events)
    assert 0 < failed < len(events) / 50
    for event in events:
        usage = event["usage"]
        reasoning = usage.get("completion_tokens_details", usage.get("output_tokens_details"))
        if reasoning and reasoning["reasoning_tokens"]:
            assert event["model"] in REASONING_MODELS
    assert any(
        e["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) > 0 for e in events
    )
