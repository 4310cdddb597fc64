"""Run every benchmark (or those named: ``python -m bench ledger ingest``) and print one table.

``--code DIR`` measures the checkout in DIR instead of this one (``bench.compare`` uses it):
the harness is always this one's. ``--json FILE`` writes the results there instead of
``bench/results/latest.json``. The exit status is 1 when a target is not met.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench
from bench.common import CodeUnderTest, Result, load_average

HEADER = ("figure", "target", "measured", "met", "statistic", "in-run baseline")


def machine() -> str:
    cpus = len(os.sched_getaffinity(0))
    return f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}"


def modules(names: Sequence[str]) -> list[str]:
    found = sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    unknown = set(names) - {m.removeprefix("bench_") for m in found}
    if unknown:
        raise SystemExit(f"no such benchmark: {', '.join(sorted(unknown))}")
    return [m for m in found if not names or m.removeprefix("bench_") in names]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table, columns padded."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for index, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if index == 0:
            lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    return lines


def _met(result: Result) -> str:
    if result.met is None:
        return "-"
    if result.problems:
        return "NO (errors)"
    return "yes" if result.met else "NO"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--code", type=Path, help="the checkout to measure (default: this one)")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args(argv)
    code = CodeUnderTest(args.code.resolve()) if args.code else CodeUnderTest()
    results: list[Result] = []
    load_start = load_average()
    for name in modules(args.names):
        started = time.monotonic()
        print(f"== {name} (code: {code.root}) ...", flush=True)
        module = importlib.import_module(f"bench.{name}")
        results.extend(module.run(module.Config(code=code)))
        print(f"   done in {time.monotonic() - started:.0f} s", flush=True)
    print()
    load = f"1-minute load average {load_start:.1f} at the start, {load_average():.1f} at the end"
    print(f"Machine: {machine()}; {load}")
    rows = [
        (r.figure, r.target, f"{r.measured:,.1f} {r.unit}", _met(r), r.statistic, r.baseline)
        for r in results
    ]
    print("\n".join(table(HEADER, rows)))
    for result in results:
        for problem in result.problems:
            print(f"NOT MET {result.name}: {problem}")
    out = args.json or Path(bench.__file__).parent / "results" / "latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": machine(),
                "load": load,
                "code": str(code.root),
                "results": [r.as_json() for r in results],
            },
            indent=2,
        )
    )
    return 0 if all(r.met is not False for r in results) else 1


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
