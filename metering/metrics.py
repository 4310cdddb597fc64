"""Prometheus text metrics: counters and latency histograms kept per process (Prometheus scrapes
each process), plus gauges read from the database at scrape time, which hold across processes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import datetime

from sqlalchemy.orm import Session

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    pairs = ",".join(
        f'{n}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for n, v in zip(names, values, strict=True)
    )
    return "{" + pairs + "}"


class Counter:
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, labels
        self._values: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def inc(self, *labels: str, amount: int = 1) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0) + amount

    def value(self, *labels: str) -> int:
        with self._lock:
            return self._values.get(labels, 0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        with self._lock:
            items = sorted(self._values.items())
        for labels, value in items:
            yield f"{self.name}{_labels(self.label_names, labels)} {value}"


class Histogram:
    """Latency in seconds. Observations are timings, never money."""

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, labels
        self._series: dict[tuple[str, ...], list[float]] = {}  # bucket counts…, sum, count
        self._lock = threading.Lock()

    def observe(self, seconds: float, *labels: str) -> None:
        with self._lock:
            series = self._series.setdefault(labels, [0.0] * (len(LATENCY_BUCKETS) + 2))
            for index, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    series[index] += 1
            series[-2] += seconds
            series[-1] += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        for labels, series in items:
            names = (*self.label_names, "le")
            for index, bound in enumerate(LATENCY_BUCKETS):
                le = _labels(names, (*labels, repr(bound)))
                yield f"{self.name}_bucket{le} {int(series[index])}"
            yield f"{self.name}_bucket{_labels(names, (*labels, '+Inf'))} {int(series[-1])}"
            yield f"{self.name}_sum{_labels(self.label_names, labels)} {series[-2]:.6f}"
            yield f"{self.name}_count{_labels(self.label_names, labels)} {int(series[-1])}"


# Gauges computed from the database at scrape time: (session, now) -> exposition lines.
DatabaseCollector = Callable[[Session, datetime], Iterable[str]]


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Histogram] = {}
        self._collectors: list[DatabaseCollector] = []

    def counter(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
        metric = self._metrics.setdefault(name, Counter(name, help_text, labels))
        assert isinstance(metric, Counter)
        return metric

    def histogram(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> Histogram:
        metric = self._metrics.setdefault(name, Histogram(name, help_text, labels))
        assert isinstance(metric, Histogram)
        return metric

    def database_collector(self, collector: DatabaseCollector) -> DatabaseCollector:
        self._collectors.append(collector)
        return collector

    def render(self, session: Session, now: datetime) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        for collector in self._collectors:
            lines.extend(collector(session, now))
        return "\n".join(lines) + "\n"


REGISTRY = Registry()

REQUEST_LATENCY = REGISTRY.histogram(
    "metering_http_request_duration_seconds",
    "Time to answer an HTTP request, by route and method.",
    ("route", "method", "status"),
)
