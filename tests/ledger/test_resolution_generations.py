"""The resolution generations (one PostgreSQL server): the database's triggers move an account's
or a model's ``resolution_generation`` on every change of a row a resolution reads, and on
nothing else; a remembered resolution's stamp also bounds its price's time. What a change does
to the next authorization is tests/ledger/test_remembered_resolutions.py's."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from metering.citus.distribution import ONE_SERVER_TRIGGERS
from metering.ledger.resolution import generation_owner, inputs
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    add_price,
    authorize,
    change_in_database,
    expect,
    grant,
    ingest,
    usage_event,
)
from tests.ledger.helpers import (
    expected_estimate,
    prepaid,
    resolution_sources,
)

(TRIGGER,) = ONE_SERVER_TRIGGERS
# pg_trigger.tgtype's bits (PostgreSQL's trigger.h).
_ROW, _BEFORE, _INSERT, _DELETE, _UPDATE = 1, 2, 4, 8, 16


def _triggers(api: Api) -> dict[str, tuple[str, frozenset[str], frozenset[str], str]]:
    """The generations' triggers of the database, by table: when, on what, the columns of its
    ``UPDATE OF``, the function it runs."""
    with api.database.unit_of_work() as session:
        rows = session.execute(
            text(
                "SELECT c.relname, t.tgtype, p.proname, ARRAY(SELECT a.attname FROM "
                "unnest(t.tgattr) AS n JOIN pg_attribute a ON a.attrelid = t.tgrelid "
                "AND a.attnum = n) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgname = :name"
            ),
            {"name": TRIGGER},
        ).all()
    events = {"INSERT": _INSERT, "DELETE": _DELETE, "UPDATE": _UPDATE}
    found = {}
    for table, kind, function, columns in rows:
        assert kind & _ROW, table
        found[table] = (
            "BEFORE" if kind & _BEFORE else "AFTER",
            frozenset(name for name, bit in events.items() if kind & bit),
            frozenset(columns),
            function,
        )
    return found


def test_every_input_of_a_resolution_moves_its_owners_generation(plain_pg_api: Api) -> None:
    # Derived, not listed: the tables and columns the resolving statement names
    # (metering.ledger.resolution.inputs) are exactly those the migrated database watches. An
    # owner's own row moves its own generation before its update; any other row moves its
    # owner's after an insert, a delete or an update of a column read.
    functions = {"accounts": "metering_resolution_of_account_changed"}
    functions["catalog_models"] = "metering_resolution_of_model_changed"
    expected = {}
    for table, columns in inputs().items():
        owner, column = generation_owner(table)
        if column is None:
            own = ("BEFORE", frozenset({"UPDATE"}), columns, "metering_resolution_changed")
            expected[table] = own
        else:
            changes = frozenset({"INSERT", "DELETE", "UPDATE"})
            expected[table] = ("AFTER", changes, columns, functions[owner])
    assert _triggers(plain_pg_api) == expected


def test_a_cluster_has_no_generation_triggers(pg_api: Api) -> None:
    # Citus refuses triggers on shards: distributing drops them (its check-and-hold confirms a
    # resolution's text); one server keeps them.
    assert bool(_triggers(pg_api)) is (pg_api.backend == "postgresql")


def _generations(api: Api, account_id: str, model_id: str) -> tuple[int, int]:
    with api.database.unit_of_work() as session:
        row = session.execute(
            text(
                "SELECT a.resolution_generation, m.resolution_generation FROM accounts a, "
                "catalog_models m WHERE a.id = :account AND m.id = :model"
            ),
            {"account": account_id, "model": model_id},
        ).one()
    return int(row[0]), int(row[1])


def test_what_a_resolution_does_not_read_moves_no_generation(plain_pg_api: Api) -> None:
    # Charges, holds, top-ups and a key's name are not inputs: a remembered resolution stays
    # confirmed through them (else every settlement would cost the next authorization a read).
    api = plain_pg_api
    setup = prepaid(api, 1000)
    for _ in range(2):
        expect(authorize(api, setup.key, setup.model), 200)
    before = _generations(api, setup.account, setup.model)
    counted = resolution_sources(api)
    ingest(api, usage_event(setup.key, setup.model, NOW))
    change_in_database(api, "UPDATE api_keys SET name = 'renamed' WHERE id = :id", id=setup.key.id)
    renamed = "UPDATE catalog_models SET display_name = 'Renamed' WHERE id = :id"
    change_in_database(api, renamed, id=setup.model)
    grant(api, setup.account, 5)
    assert _generations(api, setup.account, setup.model) == before
    expect(authorize(api, setup.key, setup.model), 200)
    after = resolution_sources(api)
    assert {source: after[source] - counted[source] for source in after} == {
        "read": 0,
        "remembered": 1,
        "stale": 0,
    }


def test_a_price_that_takes_effect_later_ends_a_remembered_resolution(plain_pg_api: Api) -> None:
    # A price version made before the read but in force only from an instant after it changes
    # no row at that instant: the stamp's bounds end the remembered resolution there, and the
    # next authorization is estimated at the new price.
    api = plain_pg_api
    setup = prepaid(api, 1000)
    later = NOW + timedelta(hours=1)
    dearer = (GLM_RATES[0], 3 * GLM_RATES[1], GLM_RATES[2])
    add_price(api, setup.model, later, dearer)
    for _ in range(2):
        expect(authorize(api, setup.key, setup.model), 200)
    counted = resolution_sources(api)
    before = authorize(api, setup.key, setup.model, max_tokens=100)
    assert before.json()["estimate_microcents"] == expected_estimate(1000, 100, GLM_RATES)
    api.clock.set(later)
    after = authorize(api, setup.key, setup.model, max_tokens=100)
    assert after.status_code == 200, after.text
    assert after.json()["estimate_microcents"] == expected_estimate(1000, 100, dearer)
    seen = resolution_sources(api)
    assert {source: seen[source] - counted[source] for source in seen} == {
        "read": 1,
        "remembered": 2,
        "stale": 1,
    }
