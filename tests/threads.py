"""Worker threads whose failures fail the test.

An exception raised in a plain ``threading.Thread`` ends that thread and is printed, and the test
goes on to pass on whatever the other threads did. ``Workers`` keeps each worker's exception and
raises them at ``join`` (one: itself; several: an ``ExceptionGroup``); a worker still running at
the join's deadline is a failure too. ``run_together`` runs callables at once and returns what
each returned, in order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Workers:
    """Start threads with ``start``; ``join`` waits for all and raises what any of them raised."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._errors: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()

    def start(
        self, target: Callable[..., Any], *args: Any, name: str | None = None, daemon: bool = False
    ) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except BaseException as error:
                with self._lock:
                    self._errors.append((threading.current_thread().name, error))

        thread = threading.Thread(target=run, name=name or f"worker-{len(self._threads)}")
        thread.daemon = daemon
        self._threads.append(thread)
        thread.start()
        return thread

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def failed(self) -> bool:
        with self._lock:
            return bool(self._errors)

    def join(self, timeout: float = 120) -> None:
        """Wait up to ``timeout`` seconds in all; raise the workers' exceptions, or an
        AssertionError naming the workers still running."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        running = [thread.name for thread in self._threads if thread.is_alive()]
        with self._lock:
            errors = list(self._errors)
        if running:
            errors.append(("join", AssertionError(f"workers still running: {running}")))
        if len(errors) == 1:
            raise errors[0][1]
        if errors:
            raise ExceptionGroup(
                "worker threads failed",
                [e if isinstance(e, Exception) else RuntimeError(repr(e)) for _, e in errors],
            )


@contextmanager
def workers(timeout: float = 120) -> Iterator[Workers]:
    """``with workers() as pool: pool.start(...)``: joined (and their failures raised) on leaving
    the block; when the block itself raised, the workers are joined and its exception goes on."""
    pool = Workers()
    try:
        yield pool
    except BaseException:
        for thread in pool._threads:
            thread.join(timeout)
        raise
    pool.join(timeout)


def run_together(*calls: Callable[[], Any], timeout: float = 120) -> list[Any]:
    """Run each call in its own thread, all at once; what each returned, in order. Any
    exception in any call fails the caller (raised once all have ended)."""
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        results[index] = calls[index]()

    pool = Workers()
    for index in range(len(calls)):
        pool.start(run, index)
    pool.join(timeout)
    return results
