"""The models and prices a whole batch needs, read at once: for each (account, model) the
account's override in force at an instant, else the list price then (the set-based form of
``metering.catalog.service.price_in_force``, with the same half-open intervals)."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.catalog.service import PriceInForce
from metering.models import AccountRate, CatalogModel, PriceVersion, table
from metering.pricing import Rates

# (effective_at instants, ascending; the version in force from each, None = override ended)
_History = tuple[list[datetime], list[PriceInForce | None]]


def _append(history: _History, at: datetime, version: PriceInForce | None) -> None:
    history[0].append(at)
    history[1].append(version)


def _in_force(history: _History | None, at: datetime) -> tuple[bool, PriceInForce | None]:
    """(whether a version is in force at ``at``, that version)."""
    if history is None:
        return False, None
    position = bisect_right(history[0], at)  # a version applies from exactly its effective_at
    if position == 0:
        return False, None
    return True, history[1][position - 1]


def _rates(row: Any) -> Rates:
    return Rates(
        row.input_microcents_per_million,
        row.output_microcents_per_million,
        row.cache_read_microcents_per_million,
    )


@dataclass
class PriceBook:
    """The models a batch names (by lower-case id) and their prices, read in one query, plus
    account overrides in a second one only for accounts that have any."""

    models: dict[str, str] = field(default_factory=dict)  # id_key -> catalog spelling
    list_prices: dict[str, _History] = field(default_factory=dict)
    overrides: dict[tuple[str, str], _History] = field(default_factory=dict)

    @classmethod
    def load(
        cls, session: Session, model_keys: Collection[str], override_accounts: Collection[str]
    ) -> PriceBook:
        book = cls()
        if not model_keys:
            return book
        lists: dict[str, _History] = defaultdict(lambda: ([], []))
        # Core, not ORM, execution: this runs on every ingest request.
        for row in session.connection().execute(
            select(
                CatalogModel.id_key,
                CatalogModel.id.label("model_id"),
                PriceVersion.id,
                PriceVersion.effective_at,
                PriceVersion.input_microcents_per_million,
                PriceVersion.output_microcents_per_million,
                PriceVersion.cache_read_microcents_per_million,
            )
            .outerjoin(PriceVersion, PriceVersion.model_id == CatalogModel.id)
            .where(CatalogModel.id_key.in_(sorted(model_keys)))
            .order_by(CatalogModel.id, PriceVersion.effective_at)
        ):
            book.models[row.id_key] = row.model_id
            if row.id is not None:
                _append(lists[row.model_id], row.effective_at, PriceInForce(row.id, _rates(row)))
        book.list_prices = dict(lists)
        if override_accounts and book.models:
            overrides: dict[tuple[str, str], _History] = defaultdict(lambda: ([], []))
            rates = table(AccountRate)
            for rate in session.connection().execute(
                select(rates)
                .where(
                    rates.c.account_id.in_(sorted(override_accounts)),
                    rates.c.model_id.in_(sorted(book.models.values())),
                )
                .order_by(rates.c.account_id, rates.c.model_id, rates.c.effective_at)
            ):
                ended = rate.input_microcents_per_million is None
                version = None if ended else PriceInForce(rate.id, _rates(rate))
                _append(overrides[(rate.account_id, rate.model_id)], rate.effective_at, version)
            book.overrides = dict(overrides)
        return book

    def price(self, account_id: str, model_id: str, at: datetime) -> PriceInForce | None:
        """The account's override in force at ``at``, else the list price then, else None."""
        found, override = _in_force(self.overrides.get((account_id, model_id)), at)
        if found and override is not None:
            return override
        return _in_force(self.list_prices.get(model_id), at)[1]
