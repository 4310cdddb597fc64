"""The gateway client's own overhead (metering-client, clients/python): what one LLM request
costs the gateway process in CPU for its two calls, ``authorize`` (an HTTP round trip to
metering) and ``record`` (an append to the spool; the background sender batches and sends).

``REQUESTS`` requests one after another from one thread against a metering server on
PostgreSQL: (a) the gateway process's CPU time per request (``time.process_time``: every
thread, the sender's included, from the first authorization to the last event acknowledged),
and (b) the median time of one ``record`` call, the part that sits on the request's path
after the model answered. The server's own time is not counted in (a) (another process).
Every event must be recorded (none left in the spool) and ``metering verify`` clean, else the
figures are not met.

The client measured is the one installed in this virtualenv (this checkout's, editable); with
``--code`` only the server comes from the other checkout.

Run: ``python -m bench gateway``.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    GATEWAY_TOKEN,
    Admin,
    CodeUnderTest,
    Result,
    bench_database,
    catalog_file,
    median,
)
from metering_client import MeteringClient, SenderSettings

MODEL = "Bench-Gateway"
RATES = (22_000_000, 339_000_000, 17_750_000)
USAGE = {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500}
# Targets: the client must not be what a gateway's CPU goes to (a model call is ~100s of ms).
CPU_TARGET_US = 2000.0
RECORD_TARGET_US = 500.0


@dataclass
class Config:
    code: CodeUnderTest
    requests: int = int(os.environ.get("BENCH_GATEWAY_REQUESTS", "2000"))


def run(config: Config) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp, bench_database() as url:
        workdir = Path(tmp)
        code = config.code
        code.migrate(url, workdir)
        code.import_catalog(url, workdir, catalog_file(workdir, [MODEL], RATES))
        server = code.server(url, workdir / "server", workers=1).start()
        try:
            with Admin(server.base_url) as admin:
                account = admin.account("bench-gateway")
                admin.grant(account, 10**9)
                _, key = admin.key(account)
            cpu_us, record_us, left = measure(server.base_url, key, workdir, config.requests)
        finally:
            server.stop()
        problems = [f"{left} events never acknowledged"] if left else []
        problems += code.verify(url, workdir)
    figure = f"client CPU per request (authorize + record), {config.requests} requests"
    return [
        Result(
            name="gateway.client_cpu",
            figure=figure,
            target=f"<= {CPU_TARGET_US:.0f} µs",
            measured=round(cpu_us, 1),
            unit="µs",
            target_met=cpu_us <= CPU_TARGET_US,
            statistic="process CPU time / requests",
            higher_is_better=False,
            problems=tuple(problems),
        ),
        Result(
            name="gateway.record_call",
            figure="one record() call (spool append), on the request's path",
            target=f"<= {RECORD_TARGET_US:.0f} µs",
            measured=round(record_us, 1),
            unit="µs",
            target_met=record_us <= RECORD_TARGET_US,
            statistic=f"median of {config.requests} calls",
            higher_is_better=False,
            problems=tuple(problems),
        ),
    ]


def measure(base_url: str, key: str, workdir: Path, requests: int) -> tuple[float, float, int]:
    """(CPU µs per request, median µs of one record call, events left unsent)."""
    client = MeteringClient(
        base_url, GATEWAY_TOKEN, spool_path=workdir / "spool.sqlite3", sender=SenderSettings()
    )
    try:
        # One request first, outside the measure: connections opened, code paths warm.
        warm = client.authorize(api_key=key, model=MODEL, api="chat_completions",
                                prompt_tokens=1200, max_tokens=512)  # fmt: skip
        client.record(warm.usage_event(USAGE))
        client.flush(60)
        records: list[float] = []
        cpu_start = time.process_time()
        for _ in range(requests):
            granted = client.authorize(api_key=key, model=MODEL, api="chat_completions",
                                       prompt_tokens=1200, max_tokens=512)  # fmt: skip
            event = granted.usage_event(USAGE)
            started = time.perf_counter()
            client.record(event)
            records.append(time.perf_counter() - started)
        left = client.flush(120)
        cpu = time.process_time() - cpu_start
    finally:
        client.close(timeout=5)
    return cpu / requests * 1e6, median(records) * 1e6, left
