"""The models and prices a whole batch needs: for each (account, model) the account's override in
force at an instant, else the list price then (the set-based form of
``metering.catalog.service.price_in_force``, with the same half-open intervals).

Built from the rows of the batch's one lookup statement (``repository.lookup``)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from metering.catalog.service import PriceInForce
from metering.pricing import Rates

# (effective_at instants, ascending; the version in force from each, None = override ended)
_History = tuple[list[datetime], list[PriceInForce | None]]

# A price row: (model id_key, model id, version id, effective_at, input, output, cache read);
# version id None for a model without any price. An override row: (account id, model id,
# rate id, effective_at, input, output, cache read); rates None for a version ending it.
PriceRow = tuple[str, str, str | None, datetime | None, int | None, int | None, int | None]


def _in_force(history: _History | None, at: datetime) -> tuple[bool, PriceInForce | None]:
    """(whether a version is in force at ``at``, that version)."""
    if history is None:
        return False, None
    position = bisect_right(history[0], at)  # a version applies from exactly its effective_at
    if position == 0:
        return False, None
    return True, history[1][position - 1]


def _histories(rows: Iterable[PriceRow]) -> dict[tuple[str, str], _History]:
    """Versions by (first, second column), each history sorted by effective_at."""
    found: dict[tuple[str, str], list[tuple[datetime, PriceInForce | None]]] = {}
    for first, second, version_id, at, input_rate, output_rate, cache_rate in rows:
        if version_id is None or at is None:
            continue
        version = (
            None
            if input_rate is None or output_rate is None or cache_rate is None
            else PriceInForce(version_id, Rates(input_rate, output_rate, cache_rate))
        )
        found.setdefault((first, second), []).append((at, version))
    histories: dict[tuple[str, str], _History] = {}
    for group, versions in found.items():
        versions.sort(key=lambda item: item[0])
        histories[group] = ([at for at, _ in versions], [version for _, version in versions])
    return histories


@dataclass
class PriceBook:
    """The models a batch names (by lower-case id) and their prices, plus the overrides of the
    batch's accounts for those models."""

    models: dict[str, str] = field(default_factory=dict)  # id_key -> catalog spelling
    list_prices: dict[str, _History] = field(default_factory=dict)
    overrides: dict[tuple[str, str], _History] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, prices: list[PriceRow], overrides: list[PriceRow]) -> PriceBook:
        book = cls()
        for id_key, model_id, *_ in prices:
            book.models[id_key] = model_id
        book.list_prices = {
            model_id: history for (_, model_id), history in _histories(prices).items()
        }
        book.overrides = _histories(overrides)
        return book

    def price(self, account_id: str, model_id: str, at: datetime) -> PriceInForce | None:
        """The account's override in force at ``at``, else the list price then, else None."""
        if self.overrides:
            found, override = _in_force(self.overrides.get((account_id, model_id)), at)
            if found and override is not None:
                return override
        return _in_force(self.list_prices.get(model_id), at)[1]
