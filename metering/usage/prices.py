"""The prices a whole batch needs, from one statement: for each (account, model) pair of the
batch, the price in force (metering.catalog.prices, the rule's one definition) evaluated at each
instant where it can change — every ``effective_at`` of the model's list versions and of the
account's overrides for it. Between two such instants the price is constant, so an event's
price is the one evaluated at the latest of them at or before its ``occurred_at`` (none before
the first: no price in force)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from metering.catalog.prices import PriceInForce

# (account id, model id, instant, the price in force from then on, or None)
Breakpoint = tuple[str, str, datetime, PriceInForce | None]


@dataclass
class PriceBook:
    """The models a batch names (by lower-case id), and the price timelines of its pairs."""

    models: dict[str, str] = field(default_factory=dict)  # id_key -> catalog spelling
    _timelines: dict[tuple[str, str], tuple[list[datetime], list[PriceInForce | None]]] = field(
        default_factory=dict
    )

    @classmethod
    def from_breakpoints(cls, models: dict[str, str], points: Iterable[Breakpoint]) -> PriceBook:
        found: dict[tuple[str, str], list[tuple[datetime, PriceInForce | None]]] = {}
        for account_id, model_id, at, price in points:
            found.setdefault((account_id, model_id), []).append((at, price))
        book = cls(models)
        for pair, timeline in found.items():
            timeline.sort(key=lambda point: point[0])
            book._timelines[pair] = ([at for at, _ in timeline], [p for _, p in timeline])
        return book

    def price(self, account_id: str, model_id: str, at: datetime) -> PriceInForce | None:
        """The price in force for the account and model at ``at``, else None."""
        timeline = self._timelines.get((account_id, model_id))
        if timeline is None:
            return None
        position = bisect_right(timeline[0], at)
        return None if position == 0 else timeline[1][position - 1]

    def part(self, model_key: str, account_id: str) -> PriceBook:
        """What of this book one (account, model) pair is priced from: the model's spelling
        and that pair's timeline (nothing of a model this book does not know)."""
        part = PriceBook()
        model_id = self.models.get(model_key)
        if model_id is not None:
            part.models[model_key] = model_id
            timeline = self._timelines.get((account_id, model_id))
            if timeline is not None:
                part._timelines[account_id, model_id] = timeline
        return part

    @classmethod
    def merged(cls, books: Iterable[PriceBook]) -> PriceBook:
        """One book of several books' models and timelines (each pair's from the last book
        that has it)."""
        merged = cls()
        for book in books:
            merged.models.update(book.models)
            merged._timelines.update(book._timelines)
        return merged
