"""The durable journal of what is still to be sent to metering (a SQLite file).

``record`` and ``void`` append here before anything else happens, so an event survives a crash
of the gateway (``kill -9`` included) from the moment ``record`` returns; the background sender
reads the journal in order, sends, and deletes what metering has acknowledged. Replaying an
entry twice is harmless: ingest deduplicates by ``request_id`` and a second void is a no-op.

WAL with ``synchronous=NORMAL``: a committed append survives the process dying at any point;
only an operating-system crash or power loss may take the last few appends with it.

Entries metering will never take (an event it *rejected*: no valid request id) move to the
``dead`` table, kept for an operator, never dropped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Kind = Literal["event", "void"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('event', 'void')),
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dead (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    reason TEXT NOT NULL,
    added_at TEXT NOT NULL,
    buried_at TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: Kind
    body: dict[str, Any]


def default_spool_path() -> Path:
    """``$XDG_STATE_HOME/metering-client/spool.sqlite3`` (``~/.local/state`` by default)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "metering-client" / "spool.sqlite3"


class Spool:
    """One SQLite file; safe to use from several threads of one process (a lock serialises the
    short statements), and from several processes (SQLite's own locking; each entry may then be
    sent twice, which metering deduplicates)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def append(self, kind: Kind, body: dict[str, Any]) -> int:
        text = json.dumps(body, separators=(",", ":"))
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO journal (kind, body, added_at) VALUES (?, ?, ?)",
                (kind, text, _now()),
            )
        return int(cursor.lastrowid or 0)

    def head(self, limit: int) -> list[Entry]:
        """The oldest ``limit`` entries, in the order they were appended."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, kind, body FROM journal ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [Entry(seq, kind, json.loads(body)) for seq, kind, body in rows]

    def remove(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM journal WHERE seq = ?", [(s,) for s in seqs])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def count_attempt(self, seqs: Sequence[int]) -> None:
        with self._lock:
            self._db.executemany(
                "UPDATE journal SET attempts = attempts + 1 WHERE seq = ?", [(s,) for s in seqs]
            )

    def bury(self, seq: int, reason: str) -> None:
        """Move an entry metering will never take to ``dead`` (kept for an operator)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO dead (seq, kind, body, reason, added_at, buried_at) "
                    "SELECT seq, kind, body, ?, added_at, ? FROM journal WHERE seq = ?",
                    (reason, _now(), seq),
                )
                self._db.execute("DELETE FROM journal WHERE seq = ?", (seq,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def pending(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM journal").fetchone()[0])

    def dead(self) -> list[tuple[int, str, dict[str, Any], str]]:
        """The buried entries: (seq, kind, body, reason)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, kind, body, reason FROM dead ORDER BY seq"
            ).fetchall()
        return [(seq, kind, json.loads(body), reason) for seq, kind, body, reason in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
