"""/metrics with two server workers (docs/operations.md#metrics: one scrape covers every worker), on
each backend, through ``metering serve --workers 2`` as an operator starts it: requests spread
over both workers, then every scrape — whichever worker answers it — reports exactly their
number; no counter ever goes back from one scrape to the next, not even when a worker is killed
and replaced; a file left in the metrics directory by an earlier start is not counted; and each
scrape passes ``promtool check metrics`` (Debian's prometheus package, installed by
``make test``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BACKENDS, Api, migrated_database
from tests.servers import ServerProcess

ROUTE = "/v1/models"
LATENCY = "metering_http_request_duration_seconds"
WORKERS = "metering_server_worker_processes"
STALE_REQUESTS = 1000

Series = tuple[str, tuple[tuple[str, str], ...]]


def promtool_problems(text: str) -> str:
    """``promtool check metrics``' complaints about one scrape (empty: none)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs it (.ci/install-promtool)"
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    return "" if done.returncode == 0 else f"exit {done.returncode}: {done.stdout}{done.stderr}"


def parse(text: str) -> dict[Series, tuple[str, float]]:
    """Every sample of a scrape: (name, sorted labels) -> (its family's type, value)."""
    found: dict[Series, tuple[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, f"{key} twice in one scrape"
            found[key] = (family.type, sample.value)
    return found


def route_count(samples: dict[Series, tuple[str, float]], route: str = ROUTE) -> float:
    labels = (("method", "GET"), ("route", route), ("status", "200"))
    return samples.get((f"{LATENCY}_count", labels), ("", 0.0))[1]


def per_worker_counts(directory: Path, route: str) -> dict[int, float]:
    """What each worker's own file holds for ``route`` (its pid -> count): where the requests
    and scrapes went."""
    counts = {}
    for path in directory.glob("histogram_*.db"):
        pid = int(path.stem.rpartition("_")[2])
        for family in MultiProcessCollector.merge([str(path)]):
            for sample in family.samples:
                if sample.name == f"{LATENCY}_count" and sample.labels.get("route") == route:
                    counts[pid] = counts.get(pid, 0.0) + sample.value
    return counts


def live_workers(directory: Path) -> set[int]:
    """The pids whose share of the live-worker gauge (1 while a worker runs) is in the
    directory. A process that only imported the metrics (the embedded server's supervisor,
    which runs the scheduler's jobs) has a file there too, with a share of 0: not a worker."""
    return {
        int(path.stem.rpartition("_")[2])
        for path in directory.glob("gauge_livesum_*.db")
        if any(
            value
            for key, value, _timestamp, _position in MmapedDict.read_all_values_from_file(str(path))
            if WORKERS in key
        )
    }


def leave_stale_file(directory: Path) -> None:
    """A worker of an earlier start (its pid long gone) that answered STALE_REQUESTS requests."""
    code = (
        "from metering.metrics import REQUEST_LATENCY\n"
        f"for _ in range({STALE_REQUESTS}):\n"
        f"    REQUEST_LATENCY.observe(0.01, {ROUTE!r}, 'GET', '200')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert list(directory.glob("histogram_*.db"))


@pytest.fixture(params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    directory = tmp_path / "metrics"
    directory.mkdir()
    leave_stale_file(directory)
    with migrated_database(request.param, tmp_path) as url:
        process = ServerProcess(
            url,
            tmp_path / "server",
            workers=2,
            serve_command=True,
            extra_env={"PROMETHEUS_MULTIPROC_DIR": str(directory)},
        )
        try:
            yield process.start(), directory
        finally:
            process.stop()


def get(server: ServerProcess, path: str) -> httpx.Response:
    """On a connection of its own, so the kernel may hand it to either worker."""
    return httpx.get(server.base_url + path, timeout=30, headers={"connection": "close"})


class Scrapes:
    """Scrapes compared with the one before: no counter, histogram count, sum or bucket lower."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.last: dict[Series, tuple[str, float]] = {}
        self.count = 0

    def take(self) -> dict[Series, tuple[str, float]]:
        response = get(self.server, "/metrics")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert promtool_problems(response.text) == ""
        samples = parse(response.text)
        went_back = {
            key: (before, samples.get(key, (kind, 0.0))[1])
            for key, (kind, before) in self.last.items()
            if kind in ("counter", "histogram")
            and samples.get(key, (kind, 0.0))[1] < before
            and not key[0].endswith("_created")
        }
        assert went_back == {}, f"scrape {self.count + 1}: went back {went_back}"
        self.last = samples
        self.count += 1
        return samples


def spread(server: ServerProcess, directory: Path, route: str, minimum: int, limit: int) -> int:
    """GET ``route`` until both workers have answered it (at least ``minimum`` times in all);
    the number sent."""
    sent = 0
    while sent < limit:
        response = get(server, route)
        assert response.status_code == 200, response.text
        sent += 1
        if sent >= minimum and len(per_worker_counts(directory, route)) >= 2:
            # Both live workers' files (the stale one's pid answers nothing now).
            answered = per_worker_counts(directory, route)
            if sum(1 for count in answered.values() if count > 0) >= 2:
                return sent
    raise AssertionError(f"{limit} requests never reached both workers")


def test_every_scrape_counts_every_worker(server: tuple[ServerProcess, Path]) -> None:
    process, directory = server
    # The earlier start's file was removed at this start.
    assert per_worker_counts(directory, ROUTE) == {}

    sent = spread(process, directory, ROUTE, minimum=40, limit=400)
    assert sum(per_worker_counts(directory, ROUTE).values()) == sent

    scrapes = Scrapes(process)
    while scrapes.count < 10 or len(per_worker_counts(directory, "/metrics")) < 2:
        assert scrapes.count < 100, "a hundred scrapes never reached both workers"
        samples = scrapes.take()
        assert route_count(samples) == sent
        assert samples[(WORKERS, ())][1] == 2
        assert samples[("metering_authorizations_expired_without_usage", ())][1] == 0

    # More requests between scrapes: each scrape counts all of them.
    for _ in range(3):
        sent += spread(process, directory, ROUTE, minimum=10, limit=10)
        assert route_count(scrapes.take()) == sent


def test_a_killed_worker_is_replaced_and_its_counts_stay(
    server: tuple[ServerProcess, Path],
) -> None:
    process, directory = server
    sent = spread(process, directory, ROUTE, minimum=20, limit=400)
    scrapes = Scrapes(process)
    assert route_count(scrapes.take()) == sent

    victim = max(per_worker_counts(directory, ROUTE).items(), key=lambda item: item[1])[0]
    os.kill(victim, signal.SIGKILL)
    # uvicorn starts a worker in its place; the dead one's counts stay in the sum, and it no
    # longer counts as a live worker.
    deadline = time.monotonic() + 30
    while True:
        try:
            samples = scrapes.take()
        except httpx.HTTPError:
            samples = {}  # the connection went to the dying worker
        # The dead worker no longer counts (its live file went at a scrape): a 2 is then the
        # survivor and its replacement.
        live = live_workers(directory)
        if samples and victim not in live and samples[(WORKERS, ())][1] == 2:
            assert len(live) == 2
            break
        assert time.monotonic() < deadline, f"no replacement worker: {live}, {samples}"
        time.sleep(0.2)
    assert route_count(samples) == sent

    sent += spread(process, directory, ROUTE, minimum=20, limit=20)
    for _ in range(5):
        samples = scrapes.take()
        assert route_count(samples) == sent
        assert samples[(WORKERS, ())][1] == 2


def test_a_single_process_scrape_passes_promtool(api: Api) -> None:
    """The app in one process (no multiprocess directory): its own values, the standard process
    collectors, and the database's gauges."""
    assert api.client.get(ROUTE).status_code == 200
    response = api.client.get("/metrics")
    assert response.status_code == 200
    assert promtool_problems(response.text) == ""
    samples = parse(response.text)
    assert route_count(samples) >= 1
    assert samples[(WORKERS, ())][1] >= 1  # the apps running in this process (tests')
    assert any(name == "python_info" for name, _labels in samples)
    assert ("process_resident_memory_bytes", ()) in samples
    assert ("metering_authorizations_expired_without_usage", ()) in samples
