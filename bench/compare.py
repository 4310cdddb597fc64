"""Before/after: the named benchmarks on a clean checkout of BASE and on the working tree,
alternated (before, after, before, after, ...), and one table of the medians.

``make bench-compare BASE=<rev> [BENCH="ledger ingest"]`` (``python -m bench.compare --base REV
ledger ingest``). BASE's tree is extracted (``git archive``) into a temporary directory; both
sides are then measured by this working tree's harness, which drives each side's own code only
as an operator does — its ``metering migrate`` (so BASE's migrations make BASE's schema), its
``metering catalog import`` and ``verify``, and uvicorn processes of its ``metering.asgi`` —
so BASE needs no benchmark code of its own, and both sides are measured the same way.

For each figure: the median of each side's runs (with their range), each also as a ratio to its
in-run ceiling (the do-nothing FastAPI app, ...), the ratio after/before, and a flag when the
figure got worse by more than ``--tolerance`` (10%): lower for a rate, higher for a latency or a
size. A run whose figure was not met for errors is flagged, whatever its number. Each benchmark
run does ``BENCH_ROUNDS`` (default here: 1) rounds against its own ceiling; ``--runs`` (3) sets
how often each side runs. The exit status is 1 when a figure is flagged.

``--reference REV`` (``make bench-compare``: ``REFERENCE``, a pinned commit) runs a third side,
alternated with the two: each figure's ratio to its ceiling is shown beside the reference's, and
flagged when it fell below it by more than the tolerance. A change that keeps each figure within
10% of the commit before it can still, feature after feature, halve a ratio; the reference holds
the ratio to the state it was measured at, whatever the number of commits since.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from bench.__main__ import modules, table
from bench.common import HARNESS_ROOT, load_average, median

HEADER = (
    "figure",
    "statistic",
    "before",
    "after",
    "after/before",
    "before ÷ ceiling",
    "after ÷ ceiling",
    "flag",
)
REFERENCE_HEADER = (*HEADER[:-1], "reference ÷ ceiling", "flag")
SIDES = ("before", "after", "reference")


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=HARNESS_ROOT, check=True, capture_output=True).stdout


def checkout(rev: str, into: Path) -> str:
    """BASE's tree, exactly as committed, in ``into``; its full commit id."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
    with tarfile.open(fileobj=BytesIO(git("archive", "--format=tar", commit))) as archive:
        archive.extractall(into, filter="data")
    return commit


@dataclass
class Figure:
    """One figure's values over the runs of each side."""

    name: str
    figure: str = ""
    unit: str = ""
    statistic: str = ""
    higher_is_better: bool = True
    values: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    ratios: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    problems: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in SIDES})

    def add(self, side: str, result: dict[str, Any]) -> None:
        self.figure, self.unit = result["figure"], result["unit"]
        self.statistic, self.higher_is_better = result["statistic"], result["higher_is_better"]
        self.values[side].append(float(result["measured"]))
        if result.get("ceiling"):
            self.ratios[side].append(float(result["measured"]) / float(result["ceiling"]))
        self.problems[side] += result["problems"]

    def change(self) -> float | None:
        before, after = median(self.values["before"]), median(self.values["after"])
        return after / before if before else None

    def worse_by(self) -> float | None:
        """How much worse after is than before (0.12: 12% worse), in the figure's direction."""
        change = self.change()
        if change is None:
            return None
        return 1 - change if self.higher_is_better else change - 1

    def flag(self, tolerance: float, reference: bool = False) -> str:
        flags = []
        for side in ("before", "after", "reference") if reference else ("before", "after"):
            if self.problems[side]:
                flags.append(f"{side}: ERRORS")
            if not self.values[side]:
                flags.append(f"{side}: MISSING")
        worse = self.worse_by()
        if worse is not None and worse > tolerance:
            flags.append(f"WORSE by {worse:.0%}" + (" (ranges overlap)" if self.overlap() else ""))
        below = self.below_reference() if reference else None
        if below is not None and below > tolerance:
            flags.append(f"RATIO {below:.0%} WORSE THAN THE REFERENCE'S")
        return "; ".join(flags)

    def below_reference(self) -> float | None:
        """How much worse after's ratio to its ceiling is than the reference's (0.2: 20%
        worse), in the figure's direction; None for a figure without a ceiling."""
        after, reference = self.ratios["after"], self.ratios["reference"]
        if not after or not reference or not median(reference):
            return None
        change = median(after) / median(reference)
        return 1 - change if self.higher_is_better else change - 1

    def overlap(self) -> bool:
        """Whether some run of one side measured within the range of the other's: on a busy
        machine, a change of the median is then as likely the machine as the code."""
        before, after = self.values["before"], self.values["after"]
        return bool(before and after) and min(after) <= max(before) and min(before) <= max(after)

    def row(self, tolerance: float, reference: bool = False) -> tuple[str, ...]:
        def value(side: str) -> str:
            values = self.values[side]
            if not values:
                return "-"
            spread = f" ({min(values):,.1f}–{max(values):,.1f})" if len(values) > 1 else ""
            return f"{median(values):,.1f} {self.unit}{spread}"

        def ratio(side: str) -> str:
            ratios = self.ratios[side]
            return f"{median(ratios):.1%}" if ratios else "-"

        change = self.change()
        runs = len(self.values["after"])
        return (
            self.figure.strip(),
            f"median of {runs} runs ({self.statistic} each)" if runs > 1 else self.statistic,
            value("before"),
            value("after"),
            f"{change:.3f}" if change is not None else "-",
            ratio("before"),
            ratio("after"),
            *((ratio("reference"),) if reference else ()),
            self.flag(tolerance, reference),
        )


def _run_side(side: str, code: Path, names: Sequence[str], out: Path, log: Path) -> None:
    env = {**os.environ, "BENCH_ROUNDS": os.environ.get("BENCH_ROUNDS", "1")}
    command = [sys.executable, "-m", "bench", "--code", str(code), "--json", str(out), *names]
    with open(log, "w") as handle:
        done = subprocess.run(
            command, cwd=HARNESS_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT
        )
    if not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"the {side} run failed (exit {done.returncode}):\n{tail}")


def compare(
    base: str,
    names: Sequence[str],
    runs: int = 3,
    tolerance: float = 0.10,
    reference: str | None = None,
) -> tuple[list[str], int]:
    """(the report's lines, the exit status)."""
    names = [m.removeprefix("bench_") for m in modules(names)]
    figures: dict[str, Figure] = {}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        before_root = Path(tmp) / "base"
        commit = checkout(base, before_root)
        sides = {"before": before_root, "after": HARNESS_ROOT}
        pinned = ""
        if reference:
            sides["reference"] = Path(tmp) / "reference"
            pinned = checkout(reference, sides["reference"])
        load_start = load_average()
        # One benchmark at a time, so the two sides of a pair run minutes apart at most.
        for index in range(runs):
            for name in names:
                for side, root in sides.items():
                    started = time.monotonic()
                    out = Path(tmp) / f"{name}-{side}-{index}.json"
                    log = Path(tmp) / f"{name}-{side}-{index}.log"
                    print(f"== run {index + 1}/{runs}: {name}, {side} ({root}) ...", flush=True)
                    _run_side(side, root, [name], out, log)
                    for result in json.loads(out.read_text())["results"]:
                        figure = figures.setdefault(result["name"], Figure(result["name"]))
                        figure.add(side, result)
                    print(
                        f"   done in {time.monotonic() - started:.0f} s, load {load_average():.1f}",
                        flush=True,
                    )
        load_end = load_average()
    pinned_side = f", reference: {reference} ({pinned[:12]})" if reference else ""
    lines = [
        "",
        f"before: {base} ({commit[:12]}), after: the working tree {HARNESS_ROOT}{pinned_side}; "
        f"benchmarks: {' '.join(names)}; {runs} run(s) of each, alternated; 1-minute load "
        f"average {load_start:.1f} at the start, {load_end:.1f} at the end",
        *table(
            REFERENCE_HEADER if reference else HEADER,
            [figure.row(tolerance, bool(reference)) for figure in figures.values()],
        ),
    ]
    for figure in figures.values():
        for side in sides:
            for problem in dict.fromkeys(figure.problems[side]):
                lines.append(f"ERRORS {side} {figure.name}: {problem}")
    flagged = [f.name for f in figures.values() if f.flag(tolerance, bool(reference))]
    lines.append(
        f"FLAGGED: {', '.join(flagged)}"
        if flagged
        else f"no figure worse by more than {tolerance:.0%}, no errors"
    )
    return lines, 1 if flagged else 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--base", required=True, help="the revision to compare with (BASE)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="default 0.10 (10%%)")
    parser.add_argument(
        "--reference", help="a pinned revision whose ratios to the ceilings after's must keep"
    )
    parser.add_argument("names", nargs="*", help="benchmarks (default: ledger ingest)")
    args = parser.parse_args(argv)
    lines, status = compare(
        args.base, args.names or ["ledger", "ingest"], args.runs, args.tolerance, args.reference
    )
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
