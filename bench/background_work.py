"""The scheduler's work, run in the code under test for bench_citus to measure: its tick (the
per-account scans: expired holds, due grant expiries, expiring grants, the days due for export)
or its webhook delivery passes. Run as ``python bench/background_work.py tick|deliver N`` with
the code under test on ``PYTHONPATH`` and its ``METERING_*`` settings in the environment.

The handshake keeps the process's start-up out of the figures: it does the work once unmeasured
(imports, connections, plans; for ``deliver``, a pass with nothing due), prints ``ready`` and
waits for a line on stdin; the harness reads the nodes' CPU and sends it; then ``tick`` runs N
ticks and ``deliver`` runs passes until N messages are delivered (or a pass finds nothing more
and 30 s have passed). Last, one line of JSON on stdout: ``cpu`` (this process's CPU seconds,
every thread), ``done`` (ticks run, or messages delivered) and ``passes``; the harness then
reads the nodes' CPU again, before this process closes its connections (their backends would
end, and on a server not of the bench's own their CPU would go uncounted): it waits for stdin's
next line, or its end.
"""

from __future__ import annotations

import json
import sys
import time


def main(job: str, count: int) -> int:
    from metering.db import Database
    from metering.kit.clock import SystemClock
    from metering.runtime import with_secret_key
    from metering.scheduler import Scheduler
    from metering.settings import Settings

    settings = with_secret_key(Settings())
    database = Database.from_url(settings.effective_database_url, pool_size=2)
    scheduler = Scheduler(database, settings, SystemClock())
    try:
        deliverer = scheduler.deliverer
        if job == "deliver" and deliverer is None:
            print("no secret key: no webhook delivery", file=sys.stderr)
            return 2
        warm = scheduler.tick if job == "tick" else deliverer.run_once  # type: ignore[union-attr]
        warm()
        print("ready", flush=True)
        sys.stdin.readline()
        started = time.process_time()
        done = passes = 0
        if job == "tick":
            for _ in range(count):
                scheduler.tick()
                passes += 1
            done = passes
        else:
            assert deliverer is not None
            deadline = time.monotonic() + 30
            while done < count:
                report = deliverer.run_once()
                passes += 1
                done += report.delivered
                if report.attempted == 0:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        cpu = time.process_time() - started
        print(json.dumps({"cpu": cpu, "done": done, "passes": passes}), flush=True)
        sys.stdin.readline()  # the connections kept open until the harness has read the nodes
        return 0
    finally:
        scheduler.close()
        database.dispose()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
