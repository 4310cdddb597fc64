"""The price in force: the one definition of which rates apply to an account's usage of a model at
an instant, as a SQL expression that every reader embeds (the authorization's resolution and its
check-and-hold, the ingest's batch lookup, the model list).

Rule: prices are effective-dated versions. A version is in force on [its ``effective_at``, the
next version's ``effective_at``). The account's own rates (``account_rates``) override the list
price (``price_versions``) while its latest version at that instant has rates; a version whose
rates are all null ends the override, and the list price applies again. No version in force: no
price (the model cannot be billed then).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import ColumnElement, FromClause, and_, func, select

from metering.models import AccountRate, PriceVersion, table
from metering.models.catalog import RATE_COLUMNS
from metering.pricing import Rates

assert tuple(f.name for f in fields(Rates)) == RATE_COLUMNS
_LIST = table(PriceVersion)
_OVERRIDES = table(AccountRate)


@dataclass(frozen=True, slots=True)
class PriceInForce:
    version_id: str  # price_… (list) or rate_… (account override): stored with every charge
    rates: Rates


@dataclass(frozen=True)
class PriceColumns:
    """``price_in_force``'s result: ``join`` it onto the FROM clause that holds the account and
    model columns it was built from, then select its columns (all null: no price). Without an
    account (``_override`` None) it is the list price alone."""

    _override: Any
    _listed: Any
    _override_id: ColumnElement[Any] | None
    _listed_id: ColumnElement[Any]
    _account_id: Any

    def join(self, base: FromClause) -> FromClause:
        o, p = self._override, self._listed
        if o is not None:
            base = base.outerjoin(o, self._mine())
        return base.outerjoin(p, p.c.id == self._listed_id)

    def apart(self) -> tuple[FromClause, ColumnElement[bool]]:
        """What ``join`` joins, as a chain of its own and the WHERE of its first table: the
        account's override, then the list price. For reading the price one table at a time
        where the account, the model and the instant are values (metering.citus.apart)."""
        o, p = self._override, self._listed
        assert o is not None, "an account's price"
        return o.outerjoin(p, p.c.id == self._listed_id), self._mine()

    def _mine(self) -> ColumnElement[bool]:
        o = self._override
        has_rates = o.c.input_microcents_per_million.isnot(None)
        # The override is the account's own row: named by its account as well as its id.
        return and_(o.c.account_id == self._account_id, o.c.id == self._override_id, has_rates)

    @property
    def version_id(self) -> ColumnElement[Any]:
        if self._override is None:
            return self._listed.c.id
        return func.coalesce(self._override.c.id, self._listed.c.id)

    def rate(self, name: str) -> ColumnElement[Any]:
        if self._override is None:
            return self._listed.c[name]
        return func.coalesce(self._override.c[name], self._listed.c[name])

    def labelled(self) -> tuple[ColumnElement[Any], ...]:
        """The version id and the three rates, labelled with their names (``price_of`` reads
        them back by name)."""
        return (
            self.version_id.label("price_version_id"),
            *(self.rate(name).label(name) for name in RATE_COLUMNS),
        )


def _latest(versions: Any, at: Any, *match: Any) -> ColumnElement[Any]:
    return (
        select(versions.c.id)
        .where(*match, versions.c.effective_at <= at)
        .order_by(versions.c.effective_at.desc())
        .limit(1)
        .scalar_subquery()
    )


def price_in_force(account_id: Any, model_id: Any, at: Any, *, name: str = "") -> PriceColumns:
    """The rates in force for ``account_id`` (None: list prices only) and ``model_id`` at ``at``
    (column expressions or bound values)."""
    listed = _LIST.alias(f"listed{name}")
    listed_id = _latest(_LIST, at, _LIST.c.model_id == model_id)
    if account_id is None:
        return PriceColumns(None, listed, None, listed_id, None)
    return PriceColumns(
        _OVERRIDES.alias(f"override{name}"),
        listed,
        _latest(
            _OVERRIDES,
            at,
            _OVERRIDES.c.account_id == account_id,
            _OVERRIDES.c.model_id == model_id,
        ),
        listed_id,
        account_id,
    )


def price_window(account_id: Any, model_id: Any, at: Any) -> tuple[Any, Any]:
    """The instants between which the price in force for ``account_id`` and ``model_id`` is the
    one in force at ``at`` (PostgreSQL): from the latest version at or before ``at`` to the
    earliest after it, of the list's and the account's own (null: no bound), so that no price
    takes effect in between while the versions stay as they are."""
    matches = (
        (_LIST, (_LIST.c.model_id == model_id,)),
        (_OVERRIDES, (_OVERRIDES.c.account_id == account_id, _OVERRIDES.c.model_id == model_id)),
    )

    def bound(edge: Any, side: Any) -> list[Any]:
        return [
            select(edge(versions.c.effective_at))
            .where(*match, side(versions.c.effective_at))
            .scalar_subquery()
            for versions, match in matches
        ]

    since = func.greatest(*bound(func.max, lambda effective: effective <= at))
    until = func.least(*bound(func.min, lambda effective: effective > at))
    return since, until


def price_of(row: Mapping[Any, Any]) -> PriceInForce | None:
    """The price of a row that selected ``PriceColumns.labelled()`` (None: no price)."""
    version_id = row["price_version_id"]
    if version_id is None:
        return None
    return PriceInForce(version_id, Rates(**{name: int(row[name]) for name in RATE_COLUMNS}))
