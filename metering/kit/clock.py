"""The one clock. Every "now" in the service comes from here so tests can move time."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FrozenClock:
    """A settable clock for tests; thread-safe because the app serves from a thread pool."""

    def __init__(self, at: datetime) -> None:
        self._lock = threading.Lock()
        self._at = at

    def now(self) -> datetime:
        with self._lock:
            return self._at

    def set(self, at: datetime) -> None:
        if at.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        with self._lock:
            self._at = at.astimezone(UTC)

    def advance(self, **delta: float) -> datetime:
        with self._lock:
            self._at = self._at + timedelta(**delta)
            return self._at
