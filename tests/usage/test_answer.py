"""The ingest answer is written by a template on the hot path: it must be exactly the JSON the
generic encoder writes for the same results (same keys, same order, same escaping)."""

from __future__ import annotations

import json
from typing import Any

from metering.usage.endpoints import render_answer
from metering.usage.events import CHARGE_FIELDS, Problem
from metering.usage.service import (
    DUPLICATE,
    QUARANTINED,
    RECORDED,
    REJECTED,
    BatchOutcome,
    Result,
)


def generic(outcome: BatchOutcome) -> bytes:
    counts = outcome.counts()
    body: dict[str, Any] = {
        "object": "list",
        "data": [result.body() for result in outcome.results],
        "recorded": counts[RECORDED],
        "duplicates": counts[DUPLICATE],
        "quarantined": counts[QUARANTINED],
        "rejected": counts[REJECTED],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def test_every_kind_of_result_is_written_as_the_generic_encoder_writes_it() -> None:
    charge = (156, 4352, 20, 16, 3432, 77248, 6780, 87460, "price_ghv2")
    unbilled = (82, 256, 29, 0, 0, 0, 0, 0, None)
    outcome = BatchOutcome(
        [
            Result(0, "req-1.a:b_c", RECORDED, charge),
            Result(1, "req-1.a:b_c", DUPLICATE, charge),
            Result(2, "req-2", RECORDED, unbilled),
            Result(
                3, "req-3", QUARANTINED, error=Problem("model_not_found", "no «model»", "model")
            ),
            Result(4, None, REJECTED, error=Problem("invalid_parameter", "an event must be…")),
            Result(5, 'quote"and\\slash', REJECTED, error=Problem("invalid_parameter", "x")),
            Result(6, "req-4", RECORDED, (0, 0, 0, 0, 0, 0, 0, 0, 'odd "version"')),
        ]
    )
    answer = render_answer(outcome, outcome.counts())
    assert answer == generic(outcome)
    decoded = json.loads(answer)
    assert decoded["data"][0]["charge"] == dict(zip(CHARGE_FIELDS, charge, strict=True))
    assert decoded["data"][2]["charge"]["price_version_id"] is None
    assert (decoded["recorded"], decoded["duplicates"], decoded["rejected"]) == (3, 1, 2)


def test_the_rollup_rows_are_written_as_the_generic_encoder_writes_them() -> None:
    """The rollups' hourly document (a template on the hot path) against ``Upsert.json``."""
    from datetime import UTC, datetime

    from metering.programs import POSTGRESQL, SQLITE, records_json
    from metering.usage import rollups
    from metering.usage.rollups import HOURLY_IN

    hour = datetime(2026, 11, 29, 13, tzinfo=UTC)
    day = datetime(2026, 11, 29, tzinfo=UTC)
    big = 2**62
    rows = [
        ("acct_1", "key_1", "GLM-5.3", hour, day, 1, 4508, 4352, 20, 0, 87460, 9),
        ("acct_1", "key_1", "", hour, day, 2, 5, 0, 7, 1, big, 10),
        ("acct_«2»", "", 'model "quoted" \\ é', hour, day, 3, 0, 0, 0, 0, 0, big),
    ]
    names = [name for name, _ in HOURLY_IN.columns]
    named = [dict(zip(names, row, strict=True)) for row in rows]
    assert rollups.ENCODE(named) == records_json(HOURLY_IN, named, POSTGRESQL)
    assert rollups.ENCODE_SQLITE(named) == records_json(HOURLY_IN, named, SQLITE)
    assert json.loads(rollups.ENCODE(named))[2]["model_id"] == 'model "quoted" \\ é'
