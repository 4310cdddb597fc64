"""The spool survives ``kill -9`` of the gateway process holding unsent events, and they are
replayed exactly once: a child process records events and is killed without warning, then a new
client on the same spool file sends what was left, against the real service.

Two crashes: while metering is unreachable (every event still in the spool), and while the
sender is sending (some batches recorded by metering but not yet struck from the spool: their
replay finds them ``duplicate``, charged once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from metering_client import MeteringClient, SenderSettings
from metering_client.spool import Spool
from tests.gateway.support import GATEWAY, Metering, expected_charge, now
from tests.servers import free_port

# The child: records EVENTS usage events of one key, says so, and waits to be killed.
CHILD = f"""
import sys, time
from datetime import datetime, UTC
from metering_client import MeteringClient, UsageEvent

url, spool, key_id, prefix, count = sys.argv[1:6]
client = MeteringClient(url, "{GATEWAY}", spool_path=spool, authorize_timeout=0.2)
for i in range(int(count)):
    client.record(UsageEvent(
        request_id=f"{{prefix}}-{{i}}", api_key_id=key_id, model="GLM-5.3",
        api="chat_completions", usage={{"prompt_tokens": 1000, "completion_tokens": 100}},
        occurred_at=datetime.now(UTC),
    ))
print("recorded", flush=True)
time.sleep(600)
"""
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}


def record_then_die(url: str, spool: Path, key_id: str, prefix: str, count: int) -> None:
    """A child process records ``count`` events and is ``kill -9``ed once they are recorded."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(spool), key_id, prefix, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "recorded"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL


def replay(url: str, spool: Path) -> int:
    """A new gateway process's client on the same spool: what it still had to send; sends it."""
    left = Spool(spool)
    pending = left.pending()
    left.close()
    with MeteringClient(url, GATEWAY, spool_path=spool, sender=SenderSettings()) as client:
        assert client.flush(60) == 0
    return pending


def test_killed_while_metering_is_unreachable(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=1000)
    spool = tmp_path / "spool.sqlite3"
    record_then_die(f"http://127.0.0.1:{free_port()}", spool, customer.key_id, "away", 50)

    assert replay(metering.url, spool) == 50  # every one survived the kill
    assert replay(metering.url, spool) == 0  # and was sent once
    charges = metering.charges(customer)
    assert len(charges) == 50
    each = expected_charge("GLM-5.3", "chat_completions", USAGE, now())
    assert {c["amount_microcents"] for c in charges} == {-each}
    for i in (0, 49):
        assert metering.event(customer, f"away-{i}") is not None
    metering.verify()


def test_killed_while_sending(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=10_000)
    spool = tmp_path / "spool.sqlite3"
    record_then_die(metering.url, spool, customer.key_id, "busy", 3000)

    assert replay(metering.url, spool) > 0  # it died holding unsent events
    charges = metering.charges(customer)
    assert len(charges) == 3000  # each event once: the replayed ones found duplicate
    assert len({c["usage_event_id"] for c in charges}) == 3000
    metering.verify()
