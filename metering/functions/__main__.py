"""``python -m metering.functions [--write]``: the generated functions' files against their
programs: without ``--write``, the files that differ (exit status 1 when any does); with it,
those files written anew. ``--step NAME LINE``: which step line ``LINE`` of the function
``NAME`` renders, and where it was built (a PL/pgSQL error's ``CONTEXT`` names both)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metering import functions

WRITE = "python -m metering.functions --write"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metering.functions", description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the files that differ")
    parser.add_argument(
        "--step",
        nargs=2,
        metavar=("NAME", "LINE"),
        help="the step that line LINE of the function NAME renders, and where it was built",
    )
    args = parser.parse_args(argv)
    if args.step is not None:
        print(functions.step_at(args.step[0], int(args.step[1])))
        return 0
    root = Path.cwd()
    if args.write:
        for path in functions.write():
            print(f"wrote {_shown(path, root)}" if path.exists() else f"removed {path.name}")
        return 0
    stale = functions.stale()
    for path, reason in stale.items():
        print(f"{_shown(path, root)}: {reason}: run `{WRITE}`")
    return 1 if stale else 0


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


if __name__ == "__main__":
    sys.exit(main())
