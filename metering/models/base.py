"""Declarative base, the naming convention Alembic relies on, and portable column types."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
)
from sqlalchemy.dialects.postgresql import DOMAIN
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator, TypeEngine

from metering.states import listed

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """TIMESTAMP WITH TIME ZONE on PostgreSQL; on SQLite a fixed-width UTC text that sorts.

    Always hands back aware UTC datetimes and refuses naive ones, so no local time leaks in.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError("UTCDateTime needs an aware datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# An auto-incrementing 64-bit key: SQLite only auto-increments an INTEGER PRIMARY KEY.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


def table(model: type[Base]) -> Table:
    """A mapped class's Core table, for set-based statements (typed for mypy)."""
    return cast(Table, model.__table__)


class _Domain(DOMAIN):
    """A domain over ``data_type`` whose check is ``check`` of a column name (``VALUE`` in the
    domain), made and dropped with the tables only on PostgreSQL (a variant's type is told of
    every dialect's ``create_all``); elsewhere the table keeps the check, named ``check_name``
    (``add_domain_checks``). Its literals are the data type's (metering.programs)."""

    cache_ok = True

    def __init__(
        self, name: str, data_type: TypeEngine[Any], check: Callable[[str], str], check_name: str
    ) -> None:
        super().__init__(name, data_type, check=check("VALUE"), constraint_name=name)
        self.column_check = check
        self.check_name = check_name

    def literal_processor(self, dialect: Dialect) -> Any:
        return self.data_type.literal_processor(dialect)

    def _on_table_create(self, target: Any, bind: Any, checkfirst: Any = False, **kw: Any) -> None:
        if bind.dialect.name == "postgresql":
            super()._on_table_create(target, bind, checkfirst, **kw)

    def _on_metadata_create(
        self, target: Any, bind: Any, checkfirst: Any = False, **kw: Any
    ) -> None:
        if bind.dialect.name == "postgresql":
            super()._on_metadata_create(target, bind, checkfirst, **kw)

    def _on_metadata_drop(self, target: Any, bind: Any, checkfirst: Any = False, **kw: Any) -> None:
        if bind.dialect.name == "postgresql":
            super()._on_metadata_drop(target, bind, checkfirst, **kw)


class _ListDomain(_Domain):
    """A domain over a VARCHAR that holds one of ``values``; elsewhere the table's check is
    named after the column."""

    cache_ok = True

    def __init__(self, name: str, length: int, values: tuple[str, ...]) -> None:
        super().__init__(name, String(length), lambda column: listed(column, values), "")
        self.values = values


def one_of(domain: str, values: Iterable[str], length: int) -> TypeEngine[str]:
    """A text that is one of ``values``, of at most ``length`` characters: on PostgreSQL the
    domain ``domain``, whose check says so; elsewhere ``VARCHAR(length)``, the table keeping
    the check (``add_domain_checks``).

    PostgreSQL reads a table's checks back from their stored text at every statement that writes
    the table, and a domain's once per connection (docs/performance.md): the lists of values the
    gateway's statements write are domains there."""
    return String(length).with_variant(_ListDomain(domain, length, tuple(values)), "postgresql")


def checked(domain: _Domain) -> TypeEngine[Any]:
    """``domain``'s data type, which on PostgreSQL is the domain (its check evaluated only where
    a value is written to the column), elsewhere the type with the table's check
    (``add_domain_checks``): for a check of one column that the gateway's statements meet, which
    as a table's would be read back at every statement writing the table, whatever it sets."""
    return domain.data_type.with_variant(domain, "postgresql")


# The domains of one column's checks (migration 0014), each written once: a name and its check.
POSITIVE_MICROCENTS = _Domain(
    "positive_microcents", BigInteger(), lambda c: f"{c} > 0", "amount_positive"
)
NON_NEGATIVE_MICROCENTS = _Domain(
    "non_negative_microcents", BigInteger(), lambda c: f"{c} >= 0", "estimate_non_negative"
)
GRANT_PRIORITY = _Domain(
    "grant_priority", Integer(), lambda c: f"{c} >= 0 AND {c} <= 100", "priority"
)
# A check passes NULL either way; the table's says so in the words SQLite's baseline stored, the
# domain's does not (Citus cannot propagate a domain check that tests VALUE IS NULL).
CONCURRENCY_LIMIT = _Domain(
    "concurrency_limit",
    Integer(),
    lambda c: f"{c} >= 1" if c == "VALUE" else f"{c} IS NULL OR {c} >= 1",
    "max_concurrent_requests_positive",
)


def add_domain_checks(table: Table) -> None:
    """Give ``table`` a SQLite check for each of its domain columns (on PostgreSQL the column's
    domain checks it): a list of values' named after the column, another's by its domain."""
    for column in table.columns:
        domain = getattr(column.type, "_variant_mapping", {}).get("postgresql")
        if isinstance(domain, _Domain):
            name = domain.check_name or column.name
            check = CheckConstraint(domain.column_check(column.name), name=name)
            table.append_constraint(check.ddl_if(dialect="sqlite"))


@dataclass(frozen=True)
class Names:
    """A column's ``info["names"]``: the column names the row of ``table`` whose ``column`` it
    holds, without a foreign key, and ``metering verify`` names every row whose named row is
    missing, calling it ``what``. ``within``: a column both rows share, which must match too
    (the key of the same account).

    The tables every gateway request writes have no foreign keys (docs/decisions/0024): their
    writers read the rows they name in the same transaction, and none of those rows is ever
    deleted."""

    table: str
    column: str
    what: str
    within: str | None = None


NAMES = "names"
ACCOUNT_ROW = Names("accounts", "id", "account")
KEY_ROW = Names("api_keys", "id", "API key of the account", within="account_id")
MODEL_ROW = Names("catalog_models", "id", "model")


def names(row: Names) -> dict[str, Names]:
    """The ``info`` of a column that names ``row`` (``Names``)."""
    return {NAMES: row}


def named_rows(metadata: MetaData) -> list[tuple[Table, list[tuple[Column[Any], Names]]]]:
    """Each table with columns that name rows without a foreign key, and those columns."""
    found = []
    for each in metadata.sorted_tables:
        named = [(column, column.info[NAMES]) for column in each.columns if NAMES in column.info]
        if named:
            found.append((each, named))
    return found
