"""A day's export state, in one place: its statuses, the legal transitions and the tables' check
constraints, written from the same enum.

    pending ──┬──export──▶ succeeded
              └──fail────▶ failed
    succeeded | failed ──export──▶ succeeded, ──fail──▶ failed   (the day exported again)

A day is pending from the moment its state row is made, before its first run; every whole-day
run then records how it ended, whatever the day's status was. A run's own record
(``export_runs``, append-only) keeps the outcome of that run: succeeded or failed.
"""

from __future__ import annotations

from enum import StrEnum

from metering.states import listed


class ExportStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


RUN_OUTCOMES = (ExportStatus.SUCCEEDED, ExportStatus.FAILED)

# The status a step leads to, from the statuses it may leave.
EXPORT = (frozenset(ExportStatus), ExportStatus.SUCCEEDED)
FAIL = (frozenset(ExportStatus), ExportStatus.FAILED)
TRANSITIONS = {"export": EXPORT, "fail": FAIL}


# The same rules as DDL text, for the tables' check constraints.
DAY_STATUS_CHECK = listed("status", ExportStatus)
RUN_STATUS_CHECK = listed("status", RUN_OUTCOMES)


def target(transition: str) -> str:
    return TRANSITIONS[transition][1].value
