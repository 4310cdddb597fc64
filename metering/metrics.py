"""/metrics on ``prometheus-client``: counters and latency histograms summed over every worker
process of the server (the library's multiprocess mode), plus gauges read from the database at
scrape time, which hold across processes anyway.

Multiprocess mode is on when ``PROMETHEUS_MULTIPROC_DIR`` names a directory before this module is
first imported: ``metering serve`` sets it to a fresh directory per start, cleaned at start
(``metering.runtime.prepare_metrics_directory``), so its workers (``--workers N``) write their
values to memory-mapped files there and any worker's scrape sums them all. A worker that dies
leaves its files, so counters never go back; only "live" gauges drop a dead worker's share
(``mark_process_dead``, as the library's docs say: at a worker's shutdown, and at scrape time for
any worker that died without one, uvicorn having no child-exit hook). Without that variable (a
single process: tests, ``uvicorn`` run by hand with one worker) the values live in the process.
"""

from __future__ import annotations

import glob
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

import prometheus_client
from prometheus_client import values
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import CollectorRegistry
from sqlalchemy.orm import Session

from metering.runtime import MULTIPROC_ENV

# The classic text format, which every Prometheus version reads (as before this module used the
# library).
CONTENT_TYPE = prometheus_client.exposition.CONTENT_TYPE_PLAIN_0_0_4
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# ``<name>_created`` series (a timestamp per counter and per process) say nothing a rate needs.
prometheus_client.disable_created_metrics()
log = logging.getLogger("metering.metrics")


def multiprocess() -> bool:
    """Whether this process's values are in the multiprocess directory (decided when
    prometheus_client was imported)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def multiprocess_directory() -> Path | None:
    path = os.environ.get(MULTIPROC_ENV)
    return Path(path) if path and multiprocess() else None


class Counter:
    """A counter, with labels or none; ``inc(*label_values, amount=1)``."""

    def __init__(
        self, registry: CollectorRegistry, name: str, help_text: str, labels: tuple[str, ...]
    ) -> None:
        self.name = name
        self._metric = prometheus_client.Counter(name, help_text, labels, registry=registry)
        self._children: dict[tuple[str, ...], prometheus_client.Counter] = {}

    def inc(self, *labels: str, amount: int = 1) -> None:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = (
                self._metric.labels(*labels) if labels else self._metric
            )
        child.inc(amount)


class Histogram:
    """Latency in seconds, with labels. Observations are timings, never money."""

    def __init__(
        self, registry: CollectorRegistry, name: str, help_text: str, labels: tuple[str, ...]
    ) -> None:
        self.name = name
        self._metric = prometheus_client.Histogram(
            name, help_text, labels, registry=registry, buckets=LATENCY_BUCKETS
        )
        self._children: dict[tuple[str, ...], prometheus_client.Histogram] = {}

    def observe(self, seconds: float, *labels: str) -> None:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._metric.labels(*labels)
        child.observe(seconds)


# Gauges computed from the database at scrape time: (session, now) -> metric families
# (prometheus_client.core.GaugeMetricFamily and the like).
DatabaseCollector = Callable[[Session, datetime], Iterable[Metric]]


class Registry:
    """This service's metrics. Counters and histograms are declared once at import
    (``counter``/``histogram``); ``render`` writes one scrape."""

    def __init__(self) -> None:
        # This process's metrics; in multiprocess mode their values are in the files, and a
        # scrape reads every worker's from there instead.
        self._process = CollectorRegistry(auto_describe=True)
        self._collectors: list[DatabaseCollector] = []
        self._workers = prometheus_client.Gauge(
            "metering_server_worker_processes",
            "Server worker processes alive (each counts 1 while it runs).",
            registry=self._process,
            multiprocess_mode="livesum",
        )
        if not multiprocess():
            # The standard process collectors: CPU, memory, file descriptors, GC, Python's
            # version. In multiprocess mode only the last is the same in every worker (the
            # library's docs: per-process collectors do not aggregate).
            prometheus_client.ProcessCollector(registry=self._process)
            prometheus_client.GCCollector(registry=self._process)
        self._platform = prometheus_client.PlatformCollector(registry=None)
        if not multiprocess():
            self._process.register(self._platform)

    def counter(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(self._process, name, help_text, labels)

    def histogram(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Histogram:
        return Histogram(self._process, name, help_text, labels)

    def database_collector(self, collector: DatabaseCollector) -> DatabaseCollector:
        self._collectors.append(collector)
        return collector

    def render(self, session: Session, now: datetime) -> bytes:
        """One scrape: every worker's counters and histograms (this process's alone outside
        multiprocess mode) and the database's gauges, as Prometheus text."""
        families = [family for collector in self._collectors for family in collector(session, now)]
        directory = multiprocess_directory()
        if directory is None:
            scrape = self._process
        else:
            forget_dead_workers(directory)
            scrape = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(scrape, path=str(directory))
            scrape.register(self._platform)
        scrape_all = CollectorRegistry(auto_describe=False)
        scrape_all.register(_Scrape(scrape, families))
        return prometheus_client.generate_latest(scrape_all)

    def worker_started(self) -> None:
        """A server worker's start (the app's lifespan): it counts in
        ``metering_server_worker_processes`` until it stops or dies. (Counted per app, so that
        several apps in one process — tests — count as many.)"""
        self._workers.inc()

    def worker_stopping(self) -> None:
        """A worker's shutdown: its share of the live gauges goes (its counters stay)."""
        self._workers.dec()
        directory = multiprocess_directory()
        if directory is not None:
            mark_process_dead(os.getpid(), str(directory))


class _Scrape:
    def __init__(self, registry: CollectorRegistry, families: list[Metric]) -> None:
        self._registry, self._families = registry, families

    def collect(self) -> Iterable[Metric]:
        yield from self._registry.collect()
        yield from self._families


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forget_dead_workers(directory: Path) -> None:
    """``mark_process_dead`` for each worker whose live-gauge file outlived it (killed, so no
    shutdown of its own): uvicorn restarts such a worker but has no hook to tell us."""
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        pid = Path(path).stem.rpartition("_")[2]
        if pid.isdigit() and not _alive(int(pid)):
            mark_process_dead(int(pid), str(directory))


def warn_if_per_worker() -> None:
    """A worker of a supervisor (uvicorn --workers N) without the multiprocess directory: its
    /metrics would count only itself."""
    if not multiprocess() and multiprocessing.parent_process() is not None:
        log.warning(
            "%s is not set: /metrics counts only the worker that answers it; start the server "
            "with `metering serve`, or set %s to an empty directory per start",
            MULTIPROC_ENV,
            MULTIPROC_ENV,
        )


REGISTRY = Registry()

REQUEST_LATENCY = REGISTRY.histogram(
    "metering_http_request_duration_seconds",
    "Time to answer an HTTP request, by route and method.",
    ("route", "method", "status"),
)
