"""The usage report: which rollup rows answer a query, and the report they add up to.

Reads ``usage_rollups`` only (never the raw events), always for one account. The rows are
pre-aggregated per bucket at three groupings; a query reads the cheapest one that answers it:
'model' or 'key' rows when it does not filter on the other dimension, else 'key_model' rows
summed in SQL. ``assemble`` is pure: it turns rows into complete, ordered buckets.
"""

from __future__ import annotations

import typing
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import add, itemgetter
from typing import Any, TypedDict

from sqlalchemy import BigInteger, String, and_, cast, exists, func, select, type_coerce
from sqlalchemy.orm import Session

from metering.accounts.access import ACCOUNT_MODELS
from metering.models import ApiKey, CatalogModel, Member, Project, UsageRollup, table
from metering.reports.params import ReportQuery

UNAVAILABLE = "unavailable"  # the group of models the catalog hides now

_ROLLUPS = table(UsageRollup)


class Measures(TypedDict):
    """What a report counts, by the rollup columns of the same names: a bucket's sums, the
    report's totals."""

    requests: int
    input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_microcents: int


MEASURES: tuple[str, ...] = tuple(Measures.__annotations__)
assert set(MEASURES) <= set(_ROLLUPS.c.keys())  # each is read from its rollup column

# The rollup rows a report reads: by the bucket's index within the window, then by group key (a
# model's id or an API key's id), the group's values of ``MEASURES`` in that order (a row as
# ``_rollup_rows`` selects it).
RollupRows = Mapping[int, Mapping[str, tuple[int, ...]]]


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket: its groups' keys in byte order, and each measure, by name, as the column of
    the groups' values in that order (``columns["cost_microcents"][i]`` is ``groups[i]``'s
    cost). Columns rather than a record per group: a week of hours by 50 keys is 8,400 groups,
    and as many objects by name cost the report a third of its time, or, being objects the
    cyclic garbage collector tracks to the end of the request, its full collections."""

    starting_at: datetime
    ending_at: datetime
    groups: tuple[str, ...]
    columns: dict[str, tuple[int, ...]]  # by measure name: a value per group
    sums: Measures  # over every group

    def rows(self, *measures: str) -> Iterator[tuple[Any, ...]]:
        """Each group's key and its values of ``measures``, in the order they are named."""
        return zip(self.groups, *(self.columns[name] for name in measures), strict=True)


@dataclass(frozen=True, slots=True)
class Report:
    query: ReportQuery
    billed: bool  # False: unbilled account, every cost is reported as null
    totals: Measures
    buckets: list[Bucket]
    # Each group's name: an API key's name (group_by=api_key), a project's (group_by=project),
    # a member's address (group_by=member; the service keys' group, "", has none).
    key_names: dict[str, str]


def assemble(
    query: ReportQuery, rows: RollupRows, label: Callable[[str], str] | None = None
) -> list[Bucket]:
    """Every bucket of the window in time order, empty ones included; groups whose keys get
    the same ``label`` (hidden models) are merged. Group keys sort by code point, which is
    UTF-8 byte order: the same as ``COLLATE "C"``."""
    width = query.width
    no_values = tuple(() for _ in MEASURES)
    buckets = []
    for index, start in enumerate(query.bucket_starts()):
        group = rows.get(index, {})
        if label is not None:
            group = _merged(group, label)
        keys = tuple(sorted(group))
        values = zip(*(group[key] for key in keys), strict=True) if keys else no_values
        columns = dict(zip(MEASURES, values, strict=True))
        buckets.append(Bucket(start, start + width, keys, columns, _sums(columns)))
    return buckets


def _merged(
    groups: Mapping[str, tuple[int, ...]], label: Callable[[str], str]
) -> dict[str, tuple[int, ...]]:
    """The groups by their labels, the values of those of one label added up."""
    merged: dict[str, tuple[int, ...]] = {}
    for key, values in groups.items():
        shown = label(key)
        before = merged.get(shown)
        merged[shown] = values if before is None else tuple(map(add, before, values))
    return merged


def _sums(columns: Mapping[str, Iterable[int]]) -> Measures:
    """Each measure's column added up."""
    return typing.cast(Measures, {name: sum(columns[name]) for name in MEASURES})


def totals(buckets: Sequence[Bucket]) -> Measures:
    """Each measure over every bucket."""
    sums = [bucket.sums for bucket in buckets]
    return _sums({name: map(itemgetter(name), sums) for name in MEASURES})


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
) -> RollupRows:
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
    # Each row is (bucket_start as the driver has it, group key, *MEASURES), as selected above.
    groups_of: defaultdict[str, dict[str, tuple[int, ...]]] = defaultdict(dict)
    for row in fetched:
        groups_of[row[0]][row[1]] = row[2:]
    rows = {}
    for raw, groups in groups_of.items():
        start = decode(raw) if decode else raw
        assert isinstance(start, datetime)
        index = query.bucket_index(start)
        assert index not in rows  # one stored text per instant: the rollups' key
        rows[index] = groups
    return rows


# A key's project and member ("" for a service key's), by key id.
Owners = Mapping[str, tuple[str, str]]


def _owners(session: Session, account_id: str, query: ReportQuery) -> Owners:
    """Each of the account's keys' project and member, when the query groups or filters by
    either (else nothing is read)."""
    if query.group_by not in ("project", "member") and not (query.project_ids or query.member_ids):
        return {}
    return {
        key_id: (project_id or "", member_id or "")
        for key_id, project_id, member_id in session.execute(
            select(ApiKey.id, ApiKey.project_id, ApiKey.member_id).where(
                ApiKey.account_id == account_id
            )
        )
    }


def _owner_label(owners: Owners, index: int) -> Callable[[str], str]:
    """A key's group: its project (``index`` 0) or its member (1; "" for a service key)."""
    by_owner = {key_id: owner[index] for key_id, owner in owners.items()}
    return lambda key_id: by_owner.get(key_id, "")


def _key_filter(query: ReportQuery, owners: Owners) -> frozenset[str] | None:
    """The keys the query's filters select (by key, project and member), None: every key."""
    selected = query.api_key_ids
    for wanted, index in ((query.project_ids, 0), (query.member_ids, 1)):
        if wanted is None:
            continue
        keys = frozenset(key_id for key_id, owner in owners.items() if owner[index] in wanted)
        selected = keys if selected is None else selected & keys
    return selected


def usage_report(session: Session, account_id: str, billing: str, query: ReportQuery) -> Report:
    """The report of ``account_id``'s usage for ``query``."""
    catalog: Sequence[tuple[str, str, bool]] = ()
    if query.group_by == "model" or query.models is not None:
        # Hidden as this account sees it: a hidden model its own list names (a private
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
    elif query.group_by == "project":
        key_names = dict(
            session.execute(
                select(Project.id, Project.name).where(Project.account_id == account_id)
            ).all()
        )
    elif query.group_by == "member":
        key_names = dict(
            session.execute(
                select(Member.id, Member.email).where(Member.account_id == account_id)
            ).all()
        )
    owners = _owners(session, account_id, query)
    key_ids = _key_filter(query, owners)
    model_ids = _model_filter(query, catalog)
    rows: RollupRows = {}
    if model_ids is None or model_ids:
        rows = _rollup_rows(session, account_id, query, model_ids, key_ids)
    hidden = {model_id for model_id, _, is_hidden in catalog if is_hidden}
    label = _shown_as(hidden) if query.group_by == "model" and hidden else None
    if query.group_by in ("project", "member"):
        # Each key's rows under its project or member (fixed for the key's life).
        label = _owner_label(owners, 0 if query.group_by == "project" else 1)
    buckets = assemble(query, rows, label)
    return Report(
        query=query,
        billed=billing != "unbilled",
        totals=totals(buckets),
        buckets=buckets,
        key_names=key_names,
    )
