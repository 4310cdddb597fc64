"""The test clock for server processes: the app's injectable clock, read from a file the test
writes, so a test moves time in the servers it started as it does in the app it runs in process
(``FrozenClock``) — no test waits out a real TTL or reads the wall clock for a window.

``FileClock(path)`` is the test's side (``set``, ``advance``, ``now``); a server started with
``ServerProcess(..., clock=that)`` runs ``uvicorn --factory tests.clocked:create``, the service's
own factory with this clock in place of the system's."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi import FastAPI

# The file a server process reads its "now" from (set by tests/servers.py; not a METERING_
# setting, which the service would read).
ENV = "TESTS_CLOCK_FILE"


class FileClock:
    """An instant kept in a file: every ``now()`` reads it, so every process sees a move at
    once."""

    def __init__(self, path: Path, at: datetime | None = None) -> None:
        self.path = path
        if at is not None:
            self.set(at)

    def now(self) -> datetime:
        return datetime.fromisoformat(self.path.read_text())

    def set(self, at: datetime) -> None:
        if at.tzinfo is None:
            raise ValueError("FileClock needs an aware datetime")
        staged = self.path.with_suffix(".new")
        staged.write_text(at.astimezone(UTC).isoformat())
        os.replace(staged, self.path)  # a reader sees the old instant or the new, never half

    def advance(self, **delta: float) -> datetime:
        at = self.now() + timedelta(**delta)
        self.set(at)
        return at


def create() -> FastAPI:
    """``metering.asgi:create`` with the clock of the file named by ``TESTS_CLOCK_FILE``."""
    from metering.app import create_app
    from metering.metrics import warn_if_per_worker
    from metering.runtime import configure_logging, runtime_settings

    settings = runtime_settings()
    configure_logging(settings.log_level)
    warn_if_per_worker()
    return create_app(settings, clock=FileClock(Path(os.environ[ENV])))
