"""``make bench`` (``python -m bench``) gathers every benchmark module's results into one table:
figure, target, measured, met, and the in-run baseline. The benchmarks themselves take minutes
and need a quiet machine, so this checks the assembly with a stand-in module, and that every
real module (the ingest one with its peak-RSS figure) is found and has the ``run()`` it needs."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

import bench
from bench import __main__ as runner
from bench.common import Result


def test_every_benchmark_module_is_run_by_make_bench() -> None:
    names = sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    assert {"bench_ingest", "bench_ledger"} <= set(names)
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        assert callable(getattr(module, "run", None)), name
    # The ingest benchmark reports the peak RSS of an API process against its 300 MB target.
    source = inspect.getsource(importlib.import_module("bench.bench_ingest"))
    assert "peak RSS" in source and '"<= 300 MB"' in source


def test_one_table_with_every_figure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = ModuleType("bench.bench_standin")
    results = [
        Result("events/s", ">= 20000/s", 3986.4, "/s", False, "3% of bare COPY"),
        Result("p99 latency", "<= 10 ms", 8.0, "ms", True, "bare FastAPI p99 6 ms"),
        Result("peak RSS", "<= 300 MB", 140.2, "MB", True),
        Result("informational", "-", 12.0, "/s", None),
    ]
    fake.run = lambda: results  # type: ignore[attr-defined]
    (tmp_path / "bench_standin.py").write_text("")
    monkeypatch.setattr(bench, "__path__", [*bench.__path__, str(tmp_path)])
    monkeypatch.setitem(sys.modules, "bench.bench_standin", fake)
    # The results file goes to a temporary directory, not over the last real run's.
    monkeypatch.setattr(runner, "__file__", str(tmp_path / "__main__.py"))

    code = runner.main(["standin"])

    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["figure", "target", "measured", "met", "in-run baseline"]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]
    assert rows == [
        ["events/s", ">= 20000/s", "3,986.4 /s", "NO", "3% of bare COPY"],
        ["p99 latency", "<= 10 ms", "8.0 ms", "yes", "bare FastAPI p99 6 ms"],
        ["peak RSS", "<= 300 MB", "140.2 MB", "yes", ""],
        ["informational", "-", "12.0 /s", "-", ""],
    ]
    assert "Machine: " in out and "cores" in out
    assert code == 1  # a target not met fails the run
    assert (tmp_path / "results" / "latest.json").exists()
