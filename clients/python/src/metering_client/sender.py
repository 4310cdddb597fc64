"""The background sender: the journal's entries to metering, in order, batched, until acknowledged.

One thread per client (per process). It wakes when something is appended, gathers for up to
``max_delay`` seconds or ``max_batch`` events, and sends the journal's head: a run of events as
one ``POST /v1/usage/events``, a void as one ``DELETE``. What metering acknowledged leaves the
journal; on a transient failure (no answer, a 5xx, a 429) the same entries, with the same
``request_id``s, are sent again after a growing pause (capped at ``max_backoff``), forever: usage
is never dropped, and while metering is away the journal is the durable spool that a restarted
gateway replays first.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx2 as httpx

from metering_client.spool import Entry, Spool

log = logging.getLogger("metering_client")

MAX_BATCH = 1000  # metering's largest batch


@dataclass(frozen=True)
class SenderSettings:
    max_batch: int = MAX_BATCH
    max_delay: float = 0.1
    min_backoff: float = 0.1
    max_backoff: float = 10.0


class Sender:
    def __init__(
        self,
        spool: Spool,
        http: Callable[[], httpx.Client],
        settings: SenderSettings = SenderSettings(),
    ) -> None:
        self.spool = spool
        self._make_http = http
        self.settings = settings
        self._wake = threading.Event()  # something was appended
        self._kick = threading.Event()  # send now: a flush, a full batch, or closing
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._appended = 0
        self._batch_limit = settings.max_batch
        self._backoff = 0.0
        self.last_error: str | None = None
        self._wake.set()  # what a previous run left in the journal goes first
        self._thread = threading.Thread(target=self._run, name="metering-sender", daemon=True)
        self._thread.start()

    # -- the callers' side ---------------------------------------------------------------------

    def notify(self) -> None:
        """Something was appended to the journal."""
        self._appended += 1
        if self._appended >= self.settings.max_batch:
            self._kick.set()
        self._wake.set()

    def flush(self, timeout: float) -> int:
        """Send now and wait until the journal is empty or ``timeout`` passes; what is left."""
        deadline = time.monotonic() + timeout
        self._kick.set()
        with self._idle:
            while True:
                left = self.spool.pending()
                remaining = deadline - time.monotonic()
                if left == 0 or remaining <= 0 or not self._thread.is_alive():
                    return left
                self._idle.wait(min(remaining, 0.05))

    def close(self, timeout: float) -> int:
        left = self.flush(timeout)
        self._stop.set()
        self._kick.set()
        self._thread.join(timeout=max(timeout, 1.0))
        return left

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        http = self._make_http()
        try:
            while not self._stop.is_set():
                if self._backoff:
                    # A pause after a failure: new entries wait; a flush or closing does not.
                    self._kick.wait(self._backoff)
                elif self._wake.wait(timeout=1.0) and not self._kick.is_set():
                    # Gather a batch: up to max_delay, unless max_batch arrived already.
                    self._kick.wait(self.settings.max_delay)
                if self._stop.is_set():
                    break
                self._wake.clear()
                self._kick.clear()
                self._appended = 0
                self._drain(http)
                with self._idle:
                    self._idle.notify_all()
        finally:
            http.close()

    def _drain(self, http: httpx.Client) -> None:
        while not self._stop.is_set():
            entries = self.spool.head(self._batch_limit)
            if not entries:
                self._backoff = 0.0
                return
            if entries[0].kind == "void":
                done = self._send_void(http, entries[0])
            else:
                run = []
                for entry in entries:
                    if entry.kind != "event":
                        break
                    run.append(entry)
                done = self._send_events(http, run)
            if not done:
                self._pause()
                return
            self._backoff = 0.0
            self.last_error = None
            with self._idle:
                self._idle.notify_all()

    def _pause(self) -> None:
        base = max(self.settings.min_backoff, min(self.settings.max_backoff, self._backoff * 2))
        self._backoff = base * random.uniform(0.8, 1.2)

    def _failed(self, what: str) -> bool:
        if self.last_error != what:
            log.warning("metering: %s; will retry (the entries stay in the spool)", what)
        self.last_error = what
        return False

    def _send_events(self, http: httpx.Client, entries: list[Entry]) -> bool:
        try:
            response = http.post("/v1/usage/events", json={"events": [e.body for e in entries]})
        except httpx.HTTPError as exc:
            return self._failed(f"usage not sent ({type(exc).__name__}: {exc})")
        if response.status_code == 413 and len(entries) > 1:
            # Too big a body for metering's limit: halve the batches until it fits.
            self._batch_limit = max(1, len(entries) // 2)
            return True
        if response.status_code != 200:
            if 400 <= response.status_code < 500 and response.status_code not in (401, 408, 429):
                if len(entries) == 1:
                    # Metering refuses this one event's request as a whole, every time: keep
                    # it aside rather than block every event behind it.
                    self.spool.bury(entries[0].seq, f"{response.status_code}: {response.text}")
                    log.error(
                        "metering refused usage event %s (%s); kept in the spool's dead table",
                        entries[0].body.get("request_id"),
                        response.text,
                    )
                    return True
                self._batch_limit = 1  # find the event it refuses
                return True
            self.spool.count_attempt([e.seq for e in entries])
            return self._failed(f"usage not recorded (HTTP {response.status_code})")
        self._batch_limit = self.settings.max_batch
        results = response.json().get("data", [])
        acknowledged = []
        for entry, result in zip(entries, results, strict=False):
            status = result.get("status")
            if status == "rejected":
                self.spool.bury(entry.seq, f"rejected: {result.get('error')}")
                log.error("metering rejected usage event %s: %s", entry.seq, result.get("error"))
                continue
            if status == "quarantined":
                # Kept by metering for an operator (GET /admin/v1/quarantine): ours no more.
                log.warning(
                    "metering quarantined usage event %s: %s",
                    result.get("request_id"),
                    (result.get("error") or {}).get("code"),
                )
            acknowledged.append(entry.seq)
        self.spool.remove(acknowledged)
        return True

    def _send_void(self, http: httpx.Client, entry: Entry) -> bool:
        authorization_id = str(entry.body["authorization_id"])
        try:
            response = http.delete(f"/v1/authorizations/{authorization_id}")
        except httpx.HTTPError as exc:
            return self._failed(f"void not sent ({type(exc).__name__}: {exc})")
        if response.status_code in (200, 404):
            # 404: no such hold (nothing to release); 200: released, or no longer active.
            self.spool.remove([entry.seq])
            return True
        if 400 <= response.status_code < 500 and response.status_code not in (401, 408, 429):
            self.spool.bury(entry.seq, f"{response.status_code}: {response.text}")
            return True
        self.spool.count_attempt([entry.seq])
        return self._failed(f"void not done (HTTP {response.status_code})")
