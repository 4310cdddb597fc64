"""tests/threads.py: a worker's failure reaches the test."""

from __future__ import annotations

import threading

import pytest

from tests.threads import Workers, run_together, workers


def _fail(message: str) -> None:
    raise AssertionError(message)


def test_a_workers_assertion_is_raised_at_join() -> None:
    pool = Workers()
    pool.start(lambda: None)
    pool.start(_fail, "a 500")
    with pytest.raises(AssertionError, match="a 500"):
        pool.join(10)


def test_several_failures_are_all_raised() -> None:
    with pytest.raises(ExceptionGroup) as caught, workers(10) as pool:
        pool.start(_fail, "one")
        pool.start(_fail, "two")
    assert sorted(str(e) for e in caught.value.exceptions) == ["one", "two"]


def test_a_worker_still_running_at_the_deadline_fails() -> None:
    release = threading.Event()
    pool = Workers()
    pool.start(release.wait, daemon=True)
    with pytest.raises(AssertionError, match="still running"):
        pool.join(0.05)
    release.set()


def test_run_together_returns_in_order() -> None:
    barrier = threading.Barrier(3)
    assert run_together(*(lambda i=i: (barrier.wait(), i)[1] for i in range(3))) == [0, 1, 2]
