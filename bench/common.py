"""What every benchmark shares: results, percentiles, a fresh PostgreSQL database."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from metering import migrate


@dataclass(frozen=True)
class Result:
    figure: str  # what was measured, e.g. "authorizations/s, 16 clients, 100 accounts"
    target: str  # e.g. ">= 1000/s"
    measured: float
    unit: str  # e.g. "/s", "ms", "MB"
    met: bool | None  # None when there is no target
    baseline: str = ""  # the in-run ceiling and our ratio to it, e.g. "41% of bare FastAPI"


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0–100)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil
    return ordered[int(rank) - 1]


@contextmanager
def bench_database() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one benchmark (dropped afterwards)."""
    os.environ.setdefault("METERING_TEST_BACKENDS", "postgresql")
    from tests.conftest import fresh_pg_database

    with fresh_pg_database() as url:
        migrate.upgrade(url)
        yield url
