"""Names the system resolver answers for a test: lines added to ``/etc/hosts`` and removed
after (under a lock: other test sessions on the machine may do the same)."""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOSTS = Path("/etc/hosts")
_LOCK = Path("/tmp/metering-tests-etc-hosts.lock")


def _edit(change: str, marker: str) -> None:
    with _LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lines = [line for line in HOSTS.read_text().splitlines() if not line.endswith(marker)]
        HOSTS.write_text("\n".join(lines + change.splitlines()) + "\n")


@contextmanager
def resolving(names: dict[str, str]) -> Iterator[None]:
    """The system resolver answers ``names`` (name: address) while the block runs."""
    if not os.access(HOSTS, os.W_OK):
        raise AssertionError(f"{HOSTS} must be writable for the real resolver's tests")
    marker = f"# metering-test-{uuid.uuid4().hex}"
    _edit("\n".join(f"{address} {name} {marker}" for name, address in names.items()), marker)
    try:
        yield
    finally:
        _edit("", marker)
