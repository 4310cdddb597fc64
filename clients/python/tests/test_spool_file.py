"""The spool file on its own: entries in the order appended, kept across a reopen, removed only
when acknowledged, and an entry metering will never take kept aside (``dead``), not dropped.
(The crash and replay through the real service: tests/gateway/test_spool_crash.py.)"""

from __future__ import annotations

from pathlib import Path

from metering_client.spool import Spool


def test_order_reopen_remove_and_bury(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "spool.sqlite3"
    spool = Spool(path)
    for i in range(5):
        spool.append("event", {"request_id": f"r{i}"})
    spool.append("void", {"authorization_id": "auth_1"})
    spool.close()

    spool = Spool(path)
    entries = spool.head(10)
    assert [e.kind for e in entries] == ["event"] * 5 + ["void"]
    assert [e.body.get("request_id") for e in entries[:5]] == [f"r{i}" for i in range(5)]
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert [e.body for e in spool.head(2)] == [{"request_id": "r0"}, {"request_id": "r1"}]

    spool.remove([entries[0].seq, entries[2].seq])
    spool.bury(entries[1].seq, "rejected: no valid request_id")
    assert spool.pending() == 3
    assert [e.body.get("request_id") for e in spool.head(10)][:2] == ["r3", "r4"]
    assert spool.dead() == [
        (entries[1].seq, "event", {"request_id": "r1"}, "rejected: no valid request_id")
    ]
    spool.close()


def test_sequence_numbers_are_never_reused(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite3")
    first = spool.append("event", {"request_id": "a"})
    spool.remove([first])
    assert spool.append("event", {"request_id": "b"}) > first
    spool.close()
