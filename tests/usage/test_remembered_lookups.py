"""Remembered lookups (PostgreSQL, and a Citus cluster's single events): an API process prices
a single event from the lookup it read last for the event's key and model, and the event's
record is made only if that lookup still holds, in the same statement (on a cluster in the
record's call: ``metering.usage.single``). A change made behind the process's back, straight in
the database, must take effect on the very next event, which is recorded once, priced as a
fresh lookup prices it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Table, text
from sqlalchemy.sql import visitors

from metering.db import Database
from metering.kit.timeutil import format_timestamp
from metering.programs import POSTGRESQL
from metering.usage import repository, single
from tests import oracle
from tests.conftest import CITUS, NOW, Api, run_on_database, running_api, server_database
from tests.factories import (
    GLM_RATES,
    Key,
    change_in_database,
    chat_usage,
    counted_by,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    unique,
    usage_event,
)
from tests.security.helpers import assert_books_reconcile

USAGE = (1200, 300, 200)  # prompt, completion, cached
AT = NOW - timedelta(minutes=5)


@pytest.fixture
def pg_api(plain_pg_url: str, tmp_path: Path) -> Iterator[Api]:
    """A PostgreSQL database of its own (``metering verify`` checks all of it)."""
    with running_api("postgresql", plain_pg_url, tmp_path) as api:
        api.clock.set(NOW)
        yield api


@pytest.fixture
def citus_api(tmp_path: Path) -> Iterator[Api]:
    """A database of its own on the Citus cluster; fails, never skips, when Citus is left
    out."""
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with server_database("citus", tmp_path) as url, running_api("citus", url, tmp_path) as api:
        api.clock.set(NOW)
        yield api


class Setup:
    def __init__(self, api: Api) -> None:
        self.model = priced_model(api, NOW - timedelta(days=1))
        self.account = create_account(api)
        self.key: Key = create_key(api, self.account)
        grant(api, self.account, 100)


def _lookups(api: Api) -> dict[str, int]:
    sources = ("read", "remembered", "stale")
    return counted_by(api, "metering_usage_single_lookups_total", "source", sources)


def _send(api: Api, setup: Setup) -> dict[str, Any]:
    """One single-event request; its one result."""
    event = usage_event(setup.key, setup.model, AT, chat_usage(*USAGE))
    [result] = ingest(api, event)["data"]
    return dict(result)


def _charge(rates: tuple[int, int, int]) -> int:
    prompt, completion, cached = USAGE
    tokens = oracle.Tokens(prompt, cached, completion)
    return oracle.charge(tokens, rates).total_microcents


def test_a_key_and_models_lookup_is_read_once_then_remembered(pg_api: Api) -> None:
    setup = Setup(pg_api)
    before = _lookups(pg_api)
    results = [_send(pg_api, setup) for _ in range(4)]
    assert [r["status"] for r in results] == ["recorded"] * 4
    assert {r["charge"]["total_microcents"] for r in results} == {_charge(GLM_RATES)}
    after = _lookups(pg_api)
    assert {k: after[k] - before[k] for k in after} == {"read": 1, "remembered": 3, "stale": 0}
    assert_books_reconcile(pg_api)


def _reprice(api: Api, setup: Setup) -> tuple[int, int, int]:
    doubled = (GLM_RATES[0], 2 * GLM_RATES[1], GLM_RATES[2])
    change_in_database(
        api,
        "UPDATE price_versions SET output_microcents_per_million = :rate WHERE model_id = :id",
        rate=doubled[1],
        id=setup.model,
    )
    return doubled


def _override(api: Api, setup: Setup) -> tuple[int, int, int]:
    halved = (GLM_RATES[0] // 2, GLM_RATES[1] // 2, GLM_RATES[2] // 2)
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{setup.account}/rates",
        json={
            "model": setup.model,
            "effective_at": format_timestamp(NOW),
            "input_microcents_per_million": halved[0],
            "output_microcents_per_million": halved[1],
            "cache_read_microcents_per_million": halved[2],
        },
    )
    assert response.status_code == 201, response.text
    # Effective before the event, which the admin route refuses (the past is immutable).
    change_in_database(
        api,
        "UPDATE account_rates SET effective_at = :at WHERE account_id = :a",
        at=AT - timedelta(hours=1),
        a=setup.account,
    )
    return halved


def _unbill(api: Api, setup: Setup) -> tuple[int, int, int]:
    change_in_database(
        api, "UPDATE accounts SET billing = 'unbilled' WHERE id = :id", id=setup.account
    )
    return (0, 0, 0)


@pytest.mark.parametrize("change", [_reprice, _override, _unbill], ids=lambda c: c.__name__)
def test_a_change_to_what_the_lookup_read_prices_the_next_event(
    pg_api: Api, change: Callable[[Api, Setup], tuple[int, int, int]]
) -> None:
    setup = Setup(pg_api)
    for _ in range(2):
        assert _send(pg_api, setup)["status"] == "recorded"
    before = _lookups(pg_api)
    rates = change(pg_api, setup)
    results = [_send(pg_api, setup) for _ in range(2)]
    assert [r["status"] for r in results] == ["recorded"] * 2
    assert [r["charge"]["total_microcents"] for r in results] == [_charge(rates)] * 2
    after = _lookups(pg_api)
    # The first after the change found the remembered lookup stale, read it again and kept it.
    assert {k: after[k] - before[k] for k in after} == {"read": 1, "remembered": 2, "stale": 1}
    assert_books_reconcile(pg_api)


def _key_limit_reached_by_next_event(api: Api, setup: Setup, limit: int) -> None:
    """The key's own spend limit set to ``limit`` behind the process, which the next event's
    charge reaches: that event's record writes the key's notice."""
    change_in_database(
        api,
        "UPDATE api_keys SET monthly_spend_limit_microcents = :limit WHERE id = :id",
        limit=limit,
        id=setup.key.id,
    )
    assert _send(api, setup)["status"] == "recorded"
    with api.database.reading() as session:
        percents = session.execute(
            text("SELECT percent FROM spend_limit_notices WHERE api_key_id = :k"),
            {"k": setup.key.id},
        ).scalars()
        assert 100 in set(percents)


def test_a_key_limit_set_meanwhile_is_counted_by_the_next_event(pg_api: Api) -> None:
    """The key's own spend limit (one of what the lookup reads): set in the database after
    two events, it is reached by the third, whose record writes the key's notice."""
    setup = Setup(pg_api)
    for _ in range(2):
        assert _send(pg_api, setup)["status"] == "recorded"
    _key_limit_reached_by_next_event(pg_api, setup, 3 * _charge(GLM_RATES))
    assert_books_reconcile(pg_api)


def _model_gone_quarantines(api: Api, setup: Setup) -> None:
    """The model's id renamed behind the process: its next event is quarantined, not recorded,
    and the books still reconcile."""
    change_in_database(
        api,
        "UPDATE catalog_models SET id_key = :other WHERE id = :id",
        other=unique("gone").lower(),
        id=setup.model,
    )
    result = _send(api, setup)
    assert result["status"] == "quarantined", result
    assert result["error"]["code"] == "model_not_found"
    assert_books_reconcile(api)


def test_a_model_no_longer_found_is_quarantined_not_recorded(pg_api: Api) -> None:
    setup = Setup(pg_api)
    assert _send(pg_api, setup)["status"] == "recorded"
    _model_gone_quarantines(pg_api, setup)


def test_on_a_cluster_a_single_events_lookup_is_remembered_and_confirmed_by_its_record(
    citus_api: Api,
) -> None:
    """The same on a Citus cluster, where the lookup is a call of its own and the record
    confirms the one remembered in its call (metering.usage.lookup_apart), in one database:
    read once, then remembered; each change to what it read (the list price, an override of
    the account's, its billing, the key's limit) taken by the next event, which finds it stale
    and reads it afresh; a model no longer found quarantines the event."""
    api = citus_api
    setup = Setup(api)
    before = _lookups(api)
    results = [_send(api, setup) for _ in range(4)]
    assert [r["status"] for r in results] == ["recorded"] * 4
    assert {r["charge"]["total_microcents"] for r in results} == {_charge(GLM_RATES)}
    spent = 4 * _charge(GLM_RATES)
    after = _lookups(api)
    assert {k: after[k] - before[k] for k in after} == {"read": 1, "remembered": 3, "stale": 0}
    for change in (_reprice, _override, _unbill):
        before = _lookups(api)
        rates = change(api, setup)
        results = [_send(api, setup) for _ in range(2)]
        assert [r["charge"]["total_microcents"] for r in results] == [_charge(rates)] * 2, change
        spent += 2 * _charge(rates)
        after = _lookups(api)
        assert {k: after[k] - before[k] for k in after} == {
            "read": 1,
            "remembered": 2,
            "stale": 1,
        }, change
    change_in_database(
        api, "UPDATE accounts SET billing = 'prepaid' WHERE id = :id", id=setup.account
    )
    _key_limit_reached_by_next_event(api, setup, spent + 1)
    _model_gone_quarantines(api, setup)


def _read(statement: Any) -> tuple[set[str], set[tuple[str, str]]]:
    """The tables a statement names, and their columns it names (by table)."""
    elements = list(visitors.iterate(statement))
    tables = {element.name for element in elements if isinstance(element, Table)}
    columns = {
        (element.table.name, element.name)
        for element in elements
        if isinstance(element, Column) and isinstance(element.table, Table)
    }
    return tables, columns


def test_the_confirmation_reads_every_table_and_column_the_lookup_reads() -> None:
    """A remembered lookup is confirmed by the rows it is made of, not by the lookup again
    (``repository.confirming``): whatever the lookup reads, the confirmation must read too,
    the price tables' rows whole, the others' columns that the lookup names."""
    lookup_tables, lookup_columns = _read(repository._lookup(POSTGRESQL))
    confirmed_tables, confirmed_columns = _read(repository._inputs_text())
    whole = {source.name for source, _ in repository.instant_sources(None, None)}
    assert lookup_tables == confirmed_tables
    assert {"price_versions", "account_rates"} == whole
    assert {(table, column) for table, column in lookup_columns - confirmed_columns} <= {
        (table, column) for table, column in lookup_columns if table in whole
    }
    # The test sees what it must: the key's limit and the account's billing are named.
    assert {("api_keys", "monthly_spend_limit_microcents"), ("accounts", "billing")} <= (
        lookup_columns & confirmed_columns
    )


# -- Events that arrived together (``single.record_gathered``): their pairs' lookups remembered
# too, and their record made only if every one of them still holds.


def _gathered(api: Api, events: list[dict[str, Any]]) -> list[Any]:
    """``events`` recorded as events that arrived together at one process; each one's charge."""
    database = Database.from_url(api.url, pool_size=1)
    try:
        results = run_on_database(database, single.record_gathered(database, events, NOW))
    finally:
        database.dispose()
    assert results is not None and all(result is not None for result in results), results
    return [result.charge_values.total_microcents for result in results]


def _events(setup: Setup, keys: list[Key], count: int) -> list[dict[str, Any]]:
    return [
        usage_event(keys[n % len(keys)], setup.model, AT, chat_usage(*USAGE)) for n in range(count)
    ]


@pytest.mark.parametrize("change", [_reprice, _override, _unbill], ids=lambda c: c.__name__)
def test_events_gathered_are_priced_from_their_pairs_remembered_lookups_while_they_hold(
    pg_api: Api, change: Callable[[Api, Setup], tuple[int, int, int]]
) -> None:
    setup = Setup(pg_api)
    keys = [setup.key, create_key(pg_api, setup.account)]
    before = _lookups(pg_api)
    for _ in range(2):
        assert _gathered(pg_api, _events(setup, keys, 3)) == [_charge(GLM_RATES)] * 3
    after = _lookups(pg_api)
    # Two pairs: read, with their texts, by the first group; remembered by the second.
    assert {k: after[k] - before[k] for k in after} == {"read": 2, "remembered": 2, "stale": 0}

    rates = change(pg_api, setup)
    for _ in range(2):
        assert _gathered(pg_api, _events(setup, keys, 3)) == [_charge(rates)] * 3
    # The first group after the change found them stale (nothing written), read them again
    # and kept them; the second was priced from them.
    again = _lookups(pg_api)
    assert {k: again[k] - after[k] for k in after} == {"read": 2, "remembered": 4, "stale": 2}
    assert_books_reconcile(pg_api)


def test_a_lookup_remembered_alone_is_confirmed_by_events_gathered(pg_api: Api) -> None:
    """A pair's lookup kept by a single event is confirmed as it is by events gathered: the
    text of the rows it is made of reads the same in both records."""
    setup = Setup(pg_api)
    assert _send(pg_api, setup)["status"] == "recorded"
    before = _lookups(pg_api)
    assert _gathered(pg_api, _events(setup, [setup.key], 2)) == [_charge(GLM_RATES)] * 2
    after = _lookups(pg_api)
    assert {k: after[k] - before[k] for k in after} == {"read": 0, "remembered": 1, "stale": 0}
    assert _send(pg_api, setup)["status"] == "recorded"
    assert _lookups(pg_api)["stale"] == after["stale"]
    assert_books_reconcile(pg_api)
