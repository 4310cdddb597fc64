"""Run every benchmark (or those named: `python -m bench ledger ingest`) and print one table."""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

import bench
from bench.common import Result


def _machine() -> str:
    cpus = len(__import__("os").sched_getaffinity(0))
    return f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}"


def main(names: list[str]) -> int:
    modules = sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    if names:
        modules = [m for m in modules if m.removeprefix("bench_") in names]
    results: list[Result] = []
    for name in modules:
        started = time.monotonic()
        print(f"== {name} ...", flush=True)
        module = importlib.import_module(f"bench.{name}")
        results.extend(module.run())
        print(f"   done in {time.monotonic() - started:.0f} s", flush=True)
    print()
    print(f"Machine: {_machine()}")
    header = ("figure", "target", "measured", "met", "in-run baseline")
    rows = [
        (
            r.figure,
            r.target,
            f"{r.measured:,.1f} {r.unit}",
            "-" if r.met is None else ("yes" if r.met else "NO"),
            r.baseline,
        )
        for r in results
    ]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(
        json.dumps({"machine": _machine(), "results": [r.__dict__ for r in results]}, indent=2)
    )
    return 0 if all(r.met is not False for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
