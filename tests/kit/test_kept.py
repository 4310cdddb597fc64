"""``Kept``, the bounded memo the gateway's hot paths keep what they read in (metering.kit.kept)."""

from __future__ import annotations

from metering.kit.kept import Kept


def test_kept_until_forgotten_and_started_again_empty_when_full() -> None:
    kept: Kept[str, int] = Kept(limit=3)
    assert kept.get("a") is None
    for number, key in enumerate("abc"):
        kept.keep(key, number)
    kept.keep("b", 10)  # full: emptied first, then kept
    assert [kept.get(key) for key in "abc"] == [None, 10, None]
    kept.keep("c", 2)
    kept.forget("b")
    kept.forget("z")  # nothing to forget
    assert [kept.get(key) for key in "abc"] == [None, None, 2]
