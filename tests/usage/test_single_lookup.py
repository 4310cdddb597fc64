"""A single event's lookup (metering.usage.lookup_apart): on a Citus cluster it is read one table
at a time, and answers the rows the lookup's join answers; a key, model, price or limit changed
between two single events is seen by the second, on PostgreSQL (the join) and on the cluster
(read apart)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from metering import programs as p
from metering.usage import endpoints, repository, single
from metering.usage.lookup_apart import KEY_ID, LOOKUP_OF_ACCOUNT, MODEL_KEY
from tests.conftest import CITUS, NOW, Api
from tests.factories import GLM_RATES, add_price, change_in_database, ingest, usage_event
from tests.ledger.helpers import Setup, prepaid, set_limit

OTHER_RATES = (2 * GLM_RATES[0], 3 * GLM_RATES[1], GLM_RATES[2])
SINCE = NOW - timedelta(hours=1)


@pytest.fixture(params=["citus"])
def citus_api(_shared_apis: dict[str, Api]) -> Iterator[Api]:
    """The shared app on the Citus cluster; fails, never skips, when Citus is left out."""
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    shared = _shared_apis["citus"]
    shared.clock.set(NOW)
    yield shared
    shared.clock.set(NOW)


def _own_rates(api: Api, setup: Setup, rates: tuple[int | None, ...], since: Any = SINCE) -> None:
    """A version of the account's own rates for the model (all null: the override ends)."""
    change_in_database(
        api,
        "INSERT INTO account_rates (id, account_id, model_id, effective_at,"
        " input_microcents_per_million, output_microcents_per_million,"
        " cache_read_microcents_per_million, created_at)"
        " VALUES (:id, :account, :model, :since, :i, :o, :c, :since)",
        id=f"rate_{setup.account[-20:]}{since:%H%M}",
        account=setup.account,
        model=setup.model,
        since=since,
        i=rates[0],
        o=rates[1],
        c=rates[2],
    )


def _ended_own_rates(api: Api, setup: Setup) -> None:
    _own_rates(api, setup, OTHER_RATES, NOW - timedelta(hours=2))
    _own_rates(api, setup, (None, None, None))


# Each fact the lookup reads, changed behind the process.
FACTS: dict[str, Callable[[Api, Setup], None]] = {
    "nothing": lambda api, setup: None,
    "new list price": lambda api, setup: add_price(api, setup.model, SINCE, OTHER_RATES),
    "later list price": lambda api, setup: add_price(
        api, setup.model, NOW + timedelta(days=1), OTHER_RATES
    ),
    "repriced list version": lambda api, setup: change_in_database(
        api,
        "UPDATE price_versions SET output_microcents_per_million = :rate WHERE model_id = :id",
        rate=OTHER_RATES[1],
        id=setup.model,
    ),
    "account's own price": lambda api, setup: _own_rates(api, setup, OTHER_RATES),
    "account's own price ended": _ended_own_rates,
    "unbilled account": lambda api, setup: change_in_database(
        api, "UPDATE accounts SET billing = 'unbilled' WHERE id = :id", id=setup.account
    ),
    "account with project limits": lambda api, setup: change_in_database(
        api, "UPDATE accounts SET scope_limits = true WHERE id = :id", id=setup.account
    ),
    "key's spend limit": lambda api, setup: set_limit(api, setup.key, 7),
    "key's spend window": lambda api, setup: change_in_database(
        api,
        "UPDATE api_keys SET monthly_spend_limit_microcents = 1, spend_limit_window = 'day'"
        " WHERE id = :id",
        id=setup.key.id,
    ),
    "key's model deleted": lambda api, setup: change_in_database(
        api, "UPDATE catalog_models SET id_key = id_key || '-gone' WHERE id = :id", id=setup.model
    ),
}


def _libpq(api: Api) -> str:
    return make_url(api.url).set(drivername="postgresql").render_as_string(hide_password=False)


def _both(api: Api, setup: Setup, model_key: str) -> tuple[set[Any], set[Any]]:
    """The rows of the lookup's join for the pair (its one-account form) and of
    ``LOOKUP_OF_ACCOUNT``, each a call of its own outside a transaction block, as the single
    event makes it (delegated to the account's worker); the join's rows are also what
    ``LOOKUP_PAIRS_OF_ACCOUNT`` answers (its call, as an account's part of a batch makes it)."""
    params = repository.of_account(
        repository.lookup_params([(setup.key.id, model_key)], p.POSTGRESQL),
        setup.account,
    )
    apart = repository.of_account(
        {KEY_ID.name: setup.key.id, MODEL_KEY.name: model_key}, setup.account
    )
    with psycopg.connect(_libpq(api), autocommit=True) as connection:
        joined = connection.execute(repository.CITUS_LOOKUP, params).fetchall()
        read = connection.execute(LOOKUP_OF_ACCOUNT.call_sql, apart).fetchall()
        called = connection.execute(repository.LOOKUP_PAIRS_OF_ACCOUNT.call_sql, params).fetchall()
    assert sorted(called, key=repr) == sorted(joined, key=repr)
    # Its first row: the text of the rows the lookup is made of (what a record confirms).
    assert read[0][0] == repository.TEXT_KIND, read
    texts = repository.lookup_texts(read)
    assert bool(texts) == any(row[0] == "key" for row in read), read
    return set(joined), set(read[1:])


@pytest.mark.parametrize("fact", FACTS)
def test_the_lookup_read_apart_answers_the_joins_rows(citus_api: Api, fact: str) -> None:
    setup = prepaid(citus_api, 1)
    FACTS[fact](citus_api, setup)
    joined, read = _both(citus_api, setup, setup.model.lower())
    assert read == joined
    kinds = sorted(row[0] for row in joined)
    if fact == "key's model deleted":
        assert kinds == ["key"]
    elif fact == "unbilled account":
        assert kinds == ["key", "model"]
    else:  # the key, the model, and a price point for each instant
        assert kinds[:2] == ["key", "model"] and set(kinds[2:]) == {"price"}, kinds
        assert len(kinds) > 2


def test_the_lookup_read_apart_of_an_unknown_model_or_another_accounts_key(
    citus_api: Api,
) -> None:
    setup, other = prepaid(citus_api, 1), prepaid(citus_api, 1)
    joined, read = _both(citus_api, setup, "no-such-model")
    assert read == joined and sorted(row[0] for row in read) == ["key"]
    # A key of another account is not found (the account's own shard answers).
    stranger = Setup(setup.account, other.key, setup.model)
    joined, read = _both(citus_api, stranger, setup.model.lower())
    assert read == joined == set()


def _charged(api: Api, setup: Setup, request_id: str) -> tuple[str | None, int]:
    with api.database.unit_of_work() as session:
        row = session.execute(
            text(
                "SELECT price_version_id, total_microcents FROM usage_events"
                " WHERE account_id = :a AND request_id = :r"
            ),
            {"a": setup.account, "r": request_id},
        ).one()
    return row[0], int(row[1])


def test_a_price_changed_between_single_events_is_charged_by_the_next(
    pg_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = prepaid(pg_api, 100)

    def refuse(*_args: Any) -> Any:
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(endpoints, "_record_batch", refuse)
    charged = []
    changes = [
        lambda: None,
        lambda: add_price(pg_api, setup.model, SINCE, OTHER_RATES),
        lambda: _own_rates(pg_api, setup, (1, 1, 0), SINCE + timedelta(minutes=1)),
        lambda: _own_rates(pg_api, setup, (None, None, None), SINCE + timedelta(minutes=2)),
    ]
    for number, change in enumerate(changes):
        change()
        event = usage_event(setup.key, setup.model, NOW - timedelta(minutes=1))
        assert ingest(pg_api, event)["recorded"] == 1
        charged.append(_charged(pg_api, setup, event["request_id"]))
        assert number == 0 or charged[-1] != charged[-2]
    versions = [version for version, _ in charged]
    assert versions[1] == versions[3] != versions[0] and versions[2] is not None
    assert versions[2].startswith("rate_") and charged[2][1] < charged[1][1]


def test_a_keys_next_event_on_a_cluster_goes_straight_to_its_accounts_lookup(
    citus_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The account of a key is read (``api_keys``) for its first single event only; the next
    goes straight to its account's lookup, on its account's node. A remembered account that is
    not the key's (it never is: a key keeps its account) is not used: the event is recorded for
    the key's own account, at its price, and the process remembers the right one."""
    setup, other = prepaid(citus_api, 100), prepaid(citus_api, 100)

    def refuse(*_args: Any) -> Any:
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(endpoints, "_record_batch", refuse)
    single._KEY_ACCOUNTS.forget(setup.key.id)
    first = usage_event(setup.key, setup.model, NOW - timedelta(minutes=1))
    assert ingest(citus_api, first)["recorded"] == 1
    assert single._KEY_ACCOUNTS.get(setup.key.id) == setup.account
    # The key's account is not read again: a statement that cannot run stands in for it. (The
    # pair's lookup remembered is forgotten, so that it is read: tests/usage/
    # test_remembered_lookups.py has the event priced from it.)
    pair = (setup.key.id, setup.model.lower())
    single._LOOKUPS.forget(pair)
    reading = repository.KEY_ACCOUNTS
    monkeypatch.setattr(repository, "KEY_ACCOUNTS", "SELECT 1 / 0")
    second = usage_event(setup.key, setup.model, NOW - timedelta(minutes=1))
    assert ingest(citus_api, second)["recorded"] == 1
    monkeypatch.setattr(repository, "KEY_ACCOUNTS", reading)

    # Neither is the lookup remembered (the key's account is not asked for its confirmation).
    single._LOOKUPS.forget(pair)
    single._KEY_ACCOUNTS.keep(setup.key.id, other.account)
    third = usage_event(setup.key, setup.model, NOW - timedelta(minutes=1))
    assert ingest(citus_api, third)["recorded"] == 1
    assert single._KEY_ACCOUNTS.get(setup.key.id) == setup.account
    charged = [_charged(citus_api, setup, e["request_id"]) for e in (first, second, third)]
    assert charged[0] == charged[1] == charged[2], charged
    with citus_api.database.unit_of_work() as session:
        accounts = session.execute(
            text("SELECT account_id FROM usage_events WHERE request_id = ANY(:ids)"),
            {"ids": [e["request_id"] for e in (first, second, third)]},
        ).all()
    assert accounts == [(setup.account,)] * 3
