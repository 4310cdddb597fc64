"""The usage report: which rollup rows answer a query, and the report they add up to.

Reads ``usage_rollups`` only (never the raw events), always for one account. The rows are
pre-aggregated per bucket at three groupings; a query reads the cheapest one that answers it:
'model' or 'key' rows when it does not filter on the other dimension, else 'key_model' rows
summed in SQL. ``assemble`` is pure: it turns rows into complete, ordered buckets.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from operator import add

from sqlalchemy import BigInteger, String, and_, cast, exists, func, select, type_coerce
from sqlalchemy.orm import Session

from metering.accounts.access import ACCOUNT_MODELS
from metering.models import ApiKey, CatalogModel, UsageRollup, table
from metering.reports.params import ReportQuery

UNAVAILABLE = "unavailable"  # the group of models the catalog hides now
MEASURES = ("requests", "input_tokens", "cache_read_tokens", "output_tokens", "cost_microcents")

# (bucket index within the window, group key, MEASURES)
RollupRow = tuple[int, str, tuple[int, ...]]

_ROLLUPS = table(UsageRollup)


@dataclass(frozen=True, slots=True)
class Bucket:
    starting_at: datetime
    ending_at: datetime
    sums: tuple[int, ...]  # the MEASURES, over every group
    results: list[tuple[str, tuple[int, ...]]]  # (group key, MEASURES), by key in byte order


@dataclass(frozen=True, slots=True)
class Report:
    query: ReportQuery
    billed: bool  # False: unbilled account, every cost is reported as null
    totals: tuple[int, ...]
    buckets: list[Bucket]
    key_names: dict[str, str]  # api_key id → name (group_by=api_key only)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Building a large report allocates tens of thousands of short-lived, acyclic tuples; the
    collections they trigger (and the occasional full one over the whole heap) cost more than
    the report itself. Nothing here makes cycles, so the cyclic GC is paused meanwhile
    (reference counting still frees everything). Process-wide, but harmless to other threads:
    they merely see the collector paused for these few milliseconds."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def assemble(
    query: ReportQuery, rows: Iterable[RollupRow], label: Callable[[str], str] | None = None
) -> list[Bucket]:
    """Every bucket of the window in time order, empty ones included; rows whose group keys get
    the same ``label`` (hidden models) are merged. Group keys sort by code point, which is
    UTF-8 byte order: the same as ``COLLATE "C"``."""
    groups: list[dict[str, tuple[int, ...]]] = [{} for _ in range(query.bucket_count)]
    for index, key, values in rows:
        group = groups[index]
        if label is not None:
            key = label(key)
        merged = group.get(key)
        group[key] = values if merged is None else tuple(map(add, merged, values))
    width = query.width
    buckets = []
    for start, group in zip(query.bucket_starts(), groups, strict=True):
        results = [(key, group[key]) for key in sorted(group)]
        sums = column_sums([values for _, values in results])
        buckets.append(Bucket(start, start + width, sums, results))
    return buckets


def column_sums(rows: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    if not rows:
        return (0,) * len(MEASURES)
    return tuple(map(sum, zip(*rows, strict=True)))


def _model_filter(query: ReportQuery, catalog: Sequence[tuple[str, str, bool]]) -> set[str] | None:
    """The catalog ids the ``models`` filter selects: a visible model by its id (any case), the
    hidden ones only as ``unavailable`` (the name the report shows for them)."""
    if query.models is None:
        return None
    wanted = query.models
    hidden_wanted = UNAVAILABLE in wanted
    return {
        model_id
        for model_id, id_key, hidden in catalog
        if (hidden and hidden_wanted) or (not hidden and id_key in wanted)
    }


def _shown_as(hidden: set[str]) -> Callable[[str], str]:
    """The name the report shows for a model: ``unavailable`` for the hidden ones."""
    return lambda model_id: UNAVAILABLE if model_id in hidden else model_id


def _rollup_rows(
    session: Session,
    account_id: str,
    query: ReportQuery,
    model_ids: set[str] | None,
    key_ids: frozenset[str] | None,
) -> Sequence[RollupRow]:
    c = _ROLLUPS.c
    by_model = query.group_by == "model"
    other_dimension_filtered = key_ids is not None if by_model else model_ids is not None
    grouping = "key_model" if other_dimension_filtered else ("model" if by_model else "key")
    group_column = c.model_id if by_model else c.api_key_id
    conditions = [
        c.account_id == account_id,
        c.bucket_width == query.bucket_width,
        c.grouping == grouping,
        c.bucket_start >= query.starting_at,
        c.bucket_start < query.ending_at,
    ]
    if model_ids is not None:
        conditions.append(c.model_id.in_(sorted(model_ids)))
    if key_ids is not None:
        conditions.append(c.api_key_id.in_(sorted(key_ids)))
    # The driver's own value for bucket_start, decoded below once per bucket rather than once
    # per row (a week of hours by 50 keys is 8,400 rows but 168 buckets).
    raw_start = type_coerce(c.bucket_start, String)
    if grouping == "key_model":
        # PostgreSQL's SUM(bigint) is numeric; the cast keeps the values Python ints.
        sums = [cast(func.sum(c[m]), BigInteger) for m in MEASURES]
        statement = (
            select(raw_start, group_column, *sums)
            .where(*conditions)
            .group_by(c.bucket_start, group_column)
        )
    else:
        statement = select(raw_start, group_column, *(c[m] for m in MEASURES)).where(*conditions)
    # The driver's rows as they are: no Row objects for thousands of plain tuples.
    result = session.connection().execute(statement)
    fetched = result.cursor.fetchall()
    result.close()
    dialect = session.get_bind().dialect
    decode = c.bucket_start.type.dialect_impl(dialect).result_processor(dialect, None)
    index_of = {}
    for raw in {row[0] for row in fetched}:
        start = decode(raw) if decode else raw
        assert isinstance(start, datetime)
        index_of[raw] = query.bucket_index(start)
    return [(index_of[row[0]], row[1], row[2:]) for row in fetched]


def usage_report(session: Session, account_id: str, billing: str, query: ReportQuery) -> Report:
    """The report of ``account_id``'s usage for ``query``."""
    catalog: Sequence[tuple[str, str, bool]] = ()
    if query.group_by == "model" or query.models is not None:
        # Hidden as this account sees it (§10): a hidden model its own list names (a private
        # model) is shown by its id.
        named = exists().where(
            ACCOUNT_MODELS.c.account_id == account_id,
            ACCOUNT_MODELS.c.model_id == CatalogModel.id,
        )
        catalog = session.execute(
            select(CatalogModel.id, CatalogModel.id_key, and_(CatalogModel.hidden, ~named))
        ).all()
    key_names: dict[str, str] = {}
    if query.group_by == "api_key":
        key_names = dict(
            session.execute(
                select(ApiKey.id, ApiKey.name).where(ApiKey.account_id == account_id)
            ).all()
        )
    model_ids = _model_filter(query, catalog)
    rows: Sequence[RollupRow] = ()
    if model_ids is None or model_ids:
        rows = _rollup_rows(session, account_id, query, model_ids, query.api_key_ids)
    hidden = {model_id for model_id, _, is_hidden in catalog if is_hidden}
    label = _shown_as(hidden) if query.group_by == "model" and hidden else None
    buckets = assemble(query, rows, label)
    return Report(
        query=query,
        billed=billing != "unbilled",
        totals=column_sums([bucket.sums for bucket in buckets]),
        buckets=buckets,
        key_names=key_names,
    )
