"""What a process read last, kept for its next use: ``Kept``.

The gateway's hot paths keep a few things they read (a key's resolution, a single event's
lookup, a key's account on a cluster, an account's hash): the next request then saves a round
trip or the work. Nothing is ever decided on what is kept — each user confirms it in the
database, or uses it only where a wrong value costs time, never an answer — so a process may
drop it at any time: bounded, it starts again empty when full (a miss costs one read)."""

from __future__ import annotations

from typing import Generic, TypeVar

Key = TypeVar("Key")
Value = TypeVar("Value")

# What each memo keeps at most (10,000 keys and models, accounts, ...).
LIMIT = 10_000


class Kept(Generic[Key, Value]):
    """A bounded memo: ``get``, ``keep`` (emptied first when full), ``forget``."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._kept: dict[Key, Value] = {}

    def get(self, key: Key) -> Value | None:
        return self._kept.get(key)

    def keep(self, key: Key, value: Value) -> None:
        if len(self._kept) >= self._limit:
            self._kept.clear()
        self._kept[key] = value

    def forget(self, key: Key) -> None:
        self._kept.pop(key, None)
