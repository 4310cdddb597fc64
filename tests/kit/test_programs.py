"""The programs engine's expressions that differ per backend, run on both: a program defined
once gives the same answer interpreted on SQLite and as its generated PL/pgSQL function."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    func,
    literal,
    select,
)

from metering import programs as p
from metering.models.base import UTCDateTime
from metering.programs import POSTGRESQL, SQLITE, Backend
from metering.programs.sqlite import ProgramError
from tests.conftest import BACKENDS

ROWS_IN = p.Records("p_rows", (("id", BigInteger()), ("amount", BigInteger())))
KEPT = p.Rows("v_kept", (("id", BigInteger()), ("amount", BigInteger())))


def _last_kept(on: Backend) -> list[p.Step]:
    rows = on.records(ROWS_IN, "r")
    kept = select(rows.c.id, rows.c.amount).where(rows.c.amount > 0)
    return [p.Collect(kept, into=KEPT, order_by=("id",)), p.Return(on.last(KEPT, "id"))]


LAST_KEPT = p.Program("metering_test_last_kept", params=(ROWS_IN,), build=_last_kept,
                      returns=BigInteger())  # fmt: skip

CASES: list[tuple[list[dict[str, int]], int | None]] = [
    ([], None),
    ([{"id": 7, "amount": 0}], None),
    ([{"id": 7, "amount": 1}], 7),
    # Collected in id order, whatever the input's order: the last is the largest.
    ([{"id": 9, "amount": 1}, {"id": 3, "amount": 2}, {"id": 12, "amount": 0}], 9),
    ([{"id": 2**62, "amount": 1}, {"id": 5, "amount": 1}], 2**62),
]


def _kept_five(on: Backend) -> list[p.Step]:
    rows = on.records(ROWS_IN, "r")
    kept = select(rows.c.id, rows.c.amount).where(rows.c.amount > 0)
    return [
        p.Collect(kept, into=KEPT),
        p.When(on.holds_any(KEPT, "amount", 5), (p.Return(literal(1)),)),
        p.Return(literal(0)),
    ]


KEPT_FIVE = p.Program("metering_test_kept_five", params=(ROWS_IN,), build=_kept_five,
                      returns=BigInteger())  # fmt: skip

HOLDS_ANY_CASES: list[tuple[list[dict[str, int]], int]] = [
    ([], 0),  # nothing collected: no row holds it
    ([{"id": 1, "amount": 0}], 0),
    ([{"id": 1, "amount": 5}], 1),
    ([{"id": 1, "amount": 3}, {"id": 2, "amount": 5}, {"id": 3, "amount": 4}], 1),
    ([{"id": 1, "amount": 3}, {"id": 2, "amount": 4}], 0),
    ([{"id": 1, "amount": 50}], 0),
]


def _run(backend: str, url: str, rows: list[dict[str, int]], program: p.Program = LAST_KEPT) -> Any:
    if backend == "postgresql":
        with psycopg.connect(url.replace("+psycopg", "")) as connection:
            connection.execute(program.plpgsql)
            records = p.records_json(ROWS_IN, rows, POSTGRESQL)
            row = connection.execute(program.call_sql, {"p_rows": records}).fetchone()
            connection.rollback()  # the test's function goes with it
            return row[0] if row else None
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return program.run(connection, p_rows=p.records_json(ROWS_IN, rows, SQLITE))
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_last_is_the_last_collected_row_on_both_backends(
    backend: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        url = request.getfixturevalue("plain_pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'programs.db'}"
    for rows, expected in CASES:
        assert _run(backend, url, rows) == expected, rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_holds_any_finds_a_value_among_the_collected_rows_on_both_backends(
    backend: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        url = request.getfixturevalue("plain_pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'programs.db'}"
    for rows, expected in HOLDS_ANY_CASES:
        assert _run(backend, url, rows, KEPT_FIVE) == expected, rows


def test_holds_any_is_an_expression_of_the_collected_array_on_postgresql() -> None:
    # PL/pgSQL evaluates it on its fast path: no statement of its own.
    assert "IF 5 = ANY (v_kept_amount) THEN" in KEPT_FIVE.plpgsql


def _divide(on: Backend) -> list[p.Step]:
    rows = on.records(ROWS_IN, "r")
    return [
        p.Collect(select(rows.c.id, rows.c.amount), into=KEPT),
        _quotient(on),
        p.Return(literal(1)),
    ]


def _quotient(on: Backend) -> p.Step:
    """A step built by a function of its own: a statement that divides by the kept amount."""
    kept = on.rows(KEPT, "k")
    return p.Run(select((literal(1) / kept.c.amount).label("q")))


DIVIDE = p.Program("metering_test_divide", params=(ROWS_IN,), build=_divide, returns=BigInteger())


def test_a_plpgsql_error_leads_back_to_the_step_and_where_it_was_built(plain_pg_url: str) -> None:
    """The line a PL/pgSQL error's CONTEXT names is the failing step's line of the generated
    text, and the step knows the function that built it."""
    with psycopg.connect(plain_pg_url.replace("+psycopg", "")) as connection:
        connection.execute(DIVIDE.plpgsql)
        records = p.records_json(ROWS_IN, [{"id": 1, "amount": 0}], POSTGRESQL)
        with pytest.raises(psycopg.errors.DivisionByZero) as raised:
            connection.execute(DIVIDE.call_sql, {"p_rows": records})
        connection.rollback()  # the test's function goes with it
    context = raised.value.diag.context or ""
    match = re.search(r"function metering_test_divide\(json\) line (\d+)", context)
    assert match is not None, context
    text, step = DIVIDE.step_at(int(match.group(1)))
    assert isinstance(step, p.Run) and text.strip().startswith("PERFORM")
    assert step.origin == f"{__name__}._quotient"
    assert DIVIDE.steps(POSTGRESQL)[0].origin == f"{__name__}._divide"


# What a column of text may hold that an array literal must quote or escape: nothing special,
# the empty string, the word NULL, the literal's own punctuation, quotes and backslashes,
# whitespace, non-ASCII; and null.
_AWKWARD = ["acct_1", "", "NULL", "null", "{a,b}", 'say "hi"', "back\\slash\\", " x ", "«é»", None]
_MIXED_IN = p.Records(
    "p_mixed",
    (
        ("label", String()),
        ("amount", BigInteger()),
        ("prepaid", p.Boolean()),
        ("at", UTCDateTime()),
    ),
)
_MIXED_BY_COLUMN = replace(_MIXED_IN, by_column=True)


# Labels that need no escaping, none null: each column is written in one join, not an element at
# a time (yet "NULL" and "" must still be quoted, and "{a,b}" read as one element).
_PLAIN = ["acct_1", "", "NULL", "null", "{a,b}", " x ", "«é»", "req-2:3.4_5"]


@pytest.mark.parametrize(
    ("labels", "with_nulls", "by_attribute"),
    [
        (_AWKWARD, True, False),
        (_PLAIN, False, False),
        (_PLAIN, False, True),
        (_AWKWARD, True, True),
        ([], False, False),
    ],
    ids=["awkward", "plain", "plain-objects", "awkward-objects", "no-rows"],
)
def test_rows_read_from_column_arrays_are_the_rows_read_from_json(
    plain_pg_url: str, labels: list[str | None], with_nulls: bool, by_attribute: bool
) -> None:
    """Rows read from one array literal per column (``Records.by_column``, ``arrays_encoder``)
    are, on PostgreSQL, the rows read from their JSON document, in the same order: with values
    that need escaping and nulls, without them, and read from objects by attribute
    (``attributes``) as from mappings by name."""
    at = datetime(2026, 11, 29, 13, 5, 7, 123, tzinfo=UTC)
    india = timezone(timedelta(hours=5, minutes=30))

    def time(index: int) -> datetime | None:
        """In UTC or at another offset, with or without a fraction of a second; or null."""
        if with_nulls and index == 3:
            return None
        moment = at + timedelta(hours=index) if index % 2 else at.replace(microsecond=0)
        return moment.astimezone(india) if index % 3 == 2 else moment

    rows = [
        {
            "label": label,
            "amount": [0, -(2**63), 2**63 - 1, None if with_nulls else 7][index % 4],
            "prepaid": [True, False, None if with_nulls else True][index % 3],
            "at": time(index),
        }
        for index, label in enumerate(labels)
    ]
    columns = [*_MIXED_IN.names, "position"]

    def read(relation: Any, params: Mapping[str, Any]) -> list[Any]:
        statement = select(*(relation.c[name] for name in columns)).order_by(relation.c.position)
        with psycopg.connect(plain_pg_url.replace("+psycopg", "")) as connection:
            return connection.execute(p.psycopg_text(statement), params).fetchall()

    if by_attribute:
        attributes = {name: f"held.{name}" for name in _MIXED_IN.names}
        objects = [SimpleNamespace(held=SimpleNamespace(**row)) for row in rows]
        arrays = p.arrays_encoder(_MIXED_BY_COLUMN, attributes)(objects)
    else:
        arrays = p.arrays_encoder(_MIXED_BY_COLUMN)(rows)
    from_arrays = read(POSTGRESQL.records(_MIXED_BY_COLUMN, "c"), arrays)
    from_json = read(
        POSTGRESQL.records(_MIXED_IN, "c"),
        {_MIXED_IN.name: p.records_json(_MIXED_IN, rows, POSTGRESQL)},
    )
    assert from_arrays == from_json
    assert [row[0] for row in from_arrays] == labels


def test_a_time_without_its_offset_is_refused_in_a_column_array() -> None:
    """A naive time names no instant: ``arrays_encoder`` refuses it as ``records_json`` does,
    among aware times as alone (the column written in one pass checks every time first)."""
    aware = datetime(2026, 11, 29, 13, 5, 7, tzinfo=UTC)
    encode = p.arrays_encoder(_MIXED_BY_COLUMN)
    for times in ([aware.replace(tzinfo=None)], [aware, aware.replace(tzinfo=None), None]):
        rows = [{"label": "a", "amount": 1, "prepaid": True, "at": at} for at in times]
        with pytest.raises(ValueError, match="aware"):
            encode(rows)


def test_a_statement_with_positional_parameters_takes_the_same_values(plain_pg_url: str) -> None:
    """``positional``: each name numbered at its first use, a name used twice one parameter,
    a literal ``%`` unescaped; run by a raw cursor, the same answer as the named statement."""
    named = p.psycopg_text(
        select(
            literal("50%").label("text"),
            bindparam("b", type_=BigInteger) + bindparam("a", type_=BigInteger),
            bindparam("b", type_=BigInteger) * 2,
        )
    )
    raw = p.positional(named)
    assert raw.names == ("b", "a")
    assert "%(" not in raw.text and "$1" in raw.text and "$2" in raw.text
    values = {"a": 3, "b": 2**40}
    with psycopg.connect(plain_pg_url.replace("+psycopg", "")) as connection:
        expected = connection.execute(named, values).fetchone()
        found = psycopg.RawCursor(connection).execute(raw.text, raw.params(values)).fetchone()
    assert found == expected == ("50%", 2**40 + 3, 2**41)


# A one-row Collect (``Collect.one_row``): a DML statement's one returned row kept as arrays of
# one, with no aggregate on PostgreSQL; more than one row is an error on both backends.
_ONE_ROW_TABLE = Table(
    "metering_test_one_row",
    MetaData(),
    Column("id", BigInteger()),
    Column("amount", BigInteger()),
)
_NEWEST = p.Var("v_newest", BigInteger())


def _one_row(on: Backend) -> list[p.Step]:
    rows = on.records(ROWS_IN, "r")
    inserted = (
        _ONE_ROW_TABLE.insert()
        .from_select(["id", "amount"], select(rows.c.id, rows.c.amount))
        .returning(_ONE_ROW_TABLE.c.id, _ONE_ROW_TABLE.c.amount)
    )
    kept = on.rows(KEPT, "k")
    return [
        p.Collect(inserted, into=KEPT, largest=("id", _NEWEST), one_row=True),
        p.Return(
            on.count(KEPT) * 1_000_000
            + func.coalesce(_NEWEST.ref, 0) * 1_000
            + func.coalesce(select(func.sum(kept.c.amount)).scalar_subquery(), 0)
        ),
    ]


ONE_ROW = p.Program("metering_test_one_row", params=(ROWS_IN,), build=_one_row,
                    returns=BigInteger())  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_row_collect_keeps_its_row_and_refuses_two(
    backend: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    cases = [([], 0), ([{"id": 7, "amount": 3}], 1_007_003)]
    two = [{"id": 1, "amount": 1}, {"id": 2, "amount": 2}]
    if backend == "postgresql":
        url = request.getfixturevalue("plain_pg_url")
        with psycopg.connect(url.replace("+psycopg", "")) as connection:
            connection.execute("CREATE TEMP TABLE metering_test_one_row (id BIGINT, amount BIGINT)")
            connection.execute(ONE_ROW.plpgsql)
            for rows, expected in cases:
                records = p.records_json(ROWS_IN, rows, POSTGRESQL)
                row = connection.execute(ONE_ROW.call_sql, {"p_rows": records}).fetchone()
                assert row is not None and row[0] == expected, rows
            with pytest.raises(psycopg.errors.TooManyRows):
                records = p.records_json(ROWS_IN, two, POSTGRESQL)
                connection.execute(ONE_ROW.call_sql, {"p_rows": records})
            connection.rollback()
        assert "array_agg" not in ONE_ROW.plpgsql and "max(" not in ONE_ROW.plpgsql
        return
    engine = create_engine(f"sqlite:///{tmp_path / 'programs.db'}")
    try:
        with engine.begin() as connection:
            _ONE_ROW_TABLE.create(connection)
            for rows, expected in cases:
                records = p.records_json(ROWS_IN, rows, SQLITE)
                assert ONE_ROW.run(connection, p_rows=records) == expected, rows
            with pytest.raises(ProgramError, match="more than one row"):
                ONE_ROW.run(connection, p_rows=p.records_json(ROWS_IN, two, SQLITE))
    finally:
        engine.dispose()


def test_a_one_row_collect_is_of_a_dml_statement_returning_its_columns() -> None:
    rows = POSTGRESQL.records(ROWS_IN, "r")
    with pytest.raises(ValueError, match="DML"):
        p.Collect(select(rows.c.id, rows.c.amount), into=KEPT, one_row=True)
    misnamed = _ONE_ROW_TABLE.insert().returning(_ONE_ROW_TABLE.c.amount, _ONE_ROW_TABLE.c.id)
    with pytest.raises(ValueError, match="not v_kept's"):
        p.Collect(misnamed, into=KEPT, one_row=True)
