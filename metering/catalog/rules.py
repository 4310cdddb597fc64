"""The catalog's rules that need no database."""

from __future__ import annotations

from datetime import date, datetime


def is_retired(deprecation_date: date | None, at: datetime) -> bool:
    """A model is retired from the start (UTC) of its deprecation date."""
    return deprecation_date is not None and at.date() >= deprecation_date
