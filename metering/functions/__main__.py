"""``python -m metering.functions [--write]``: the generated functions' files against their
programs: without ``--write``, the files that differ (exit status 1 when any does); with it,
those files written anew."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metering import functions

WRITE = "python -m metering.functions --write"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metering.functions", description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the files that differ")
    args = parser.parse_args(argv)
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
