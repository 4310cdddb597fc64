"""Remembered resolutions (PostgreSQL): an API process estimates a key's next
authorization from the resolution it read last, and the check-and-hold confirms it under the
account's lock (on one server by its stamp: the generations the database's triggers move, on a
cluster by its text). Changes made behind the process's back, straight in the database, must
take effect on the very next authorization; on SQLite nothing is remembered and the same holds.
A project's or a member's rules are changed through the service (its admin routes), which marks
the account in the same transaction: on a cluster only a marked account's confirmation reads
them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from metering.citus import text_of_account
from metering.ledger.placement.postgres import NOT_CONFIRMING, PostgresHolds
from metering.ledger.placement.sqlite import SqliteHolds
from metering.ledger.resolution import (
    AT,
    MODEL_KEY,
    SECRET_HASH,
    STAMP_NAMES,
    as_text,
    resolution,
    stamp_of,
)
from metering.ledger.service import held_counter_mismatches
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    Key,
    assert_error,
    authorization_request,
    authorize,
    change_in_database,
)
from tests.ledger.helpers import (
    Setup,
    expected_estimate,
    holds,
    prepaid,
    resolution_sources,
)

ESTIMATE = expected_estimate(1000, 100, GLM_RATES)


@pytest.fixture
def resolving_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The resolving reads made (one entry each), on either backend."""
    reads: list[str] = []
    for backend in (PostgresHolds, SqliteHolds):
        original = backend.resolve

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            reads.append(type(self).__name__)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(backend, "resolve", counted)
    yield reads


def _warm(api: Api, setup: Setup) -> None:
    """Two authorizations with the key and model, so the process has read and used them."""
    for _ in range(2):
        response = authorize(api, setup.key, setup.model)
        assert response.status_code == 200, response.text


def test_later_authorizations_skip_the_resolving_read(api: Api, resolving_reads: list[str]) -> None:
    setup = prepaid(api, 1)
    for _ in range(4):
        assert authorize(api, setup.key, setup.model).status_code == 200
    # PostgreSQL reads once, then confirms inside the check-and-hold; SQLite's read shares
    # the check-and-hold's transaction, so it reads every time.
    assert len(resolving_reads) == (4 if api.backend == "sqlite" else 1)


def _revoke(api: Api, setup: Setup) -> None:
    change_in_database(
        api, "UPDATE api_keys SET revoked_at = :now WHERE id = :id", now=NOW, id=setup.key.id
    )


def _limit(api: Api, setup: Setup) -> None:
    change_in_database(
        api,
        "UPDATE api_keys SET monthly_spend_limit_microcents = :limit WHERE id = :id",
        limit=ESTIMATE,  # the two warm-up holds are active: no room for a third
        id=setup.key.id,
    )


def _retire(api: Api, setup: Setup) -> None:
    change_in_database(
        api,
        "UPDATE catalog_models SET deprecation_date = :day WHERE id = :id",
        day=NOW.date(),
        id=setup.model,
    )


def _shrink(api: Api, setup: Setup) -> None:
    change_in_database(
        api, "UPDATE catalog_models SET context_length = 1050 WHERE id = :id", id=setup.model
    )


def _reprice(api: Api, setup: Setup) -> None:
    change_in_database(
        api,
        "UPDATE price_versions SET output_microcents_per_million = :rate WHERE model_id = :id",
        rate=2 * GLM_RATES[1],
        id=setup.model,
    )


def _unbill(api: Api, setup: Setup) -> None:
    change_in_database(
        api, "UPDATE accounts SET billing = 'unbilled' WHERE id = :id", id=setup.account
    )


def _concurrency(api: Api, setup: Setup) -> None:
    # The two warm-up holds are in flight: a limit of 2 leaves no room for a third.
    change_in_database(
        api, "UPDATE accounts SET max_concurrent_requests = 2 WHERE id = :id", id=setup.account
    )


def _narrow_account(api: Api, setup: Setup) -> None:
    change_in_database(
        api, "UPDATE accounts SET restricts_models = true WHERE id = :id", id=setup.account
    )


def _narrow_key(api: Api, setup: Setup) -> None:
    change_in_database(
        api, "UPDATE api_keys SET restricts_models = true WHERE id = :id", id=setup.key.id
    )


def _daily(api: Api, setup: Setup) -> None:
    # Yesterday's spend counts in the month's window, not in the day's.
    change_in_database(
        api,
        "INSERT INTO usage_rollups (account_id, bucket_width, grouping, bucket_start, "
        "api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, "
        "reasoning_tokens, cost_microcents, last_event_id) VALUES (:account, '1d', 'key', "
        ":day, :key, '', 1, 0, 0, 0, 0, :cost, 0)",
        account=setup.account,
        day=NOW.replace(hour=0) - timedelta(days=1),
        key=setup.key.id,
        cost=10 * ESTIMATE,
    )
    change_in_database(
        api,
        "UPDATE api_keys SET monthly_spend_limit_microcents = :limit, "
        "spend_limit_window = 'day' WHERE id = :id",
        limit=3 * ESTIMATE,
        id=setup.key.id,
    )


CHANGES: dict[str, Callable[[Api, Setup], None]] = {
    "revoked key": _revoke,
    "new spend limit": _limit,
    "retired model": _retire,
    "smaller context": _shrink,
    "new price": _reprice,
    "unbilled account": _unbill,
    "concurrency limit": _concurrency,
    "account's model list": _narrow_account,
    "key's model list": _narrow_key,
    "daily window": _daily,
}


def _admin(api: Api, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.admin(method, path, json=body)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


def _members_key(api: Api, setup: Setup) -> Key:
    """A second key of the account, owned by a new member (no limits yet)."""
    member = _admin(
        api,
        "POST",
        f"/admin/v1/accounts/{setup.account}/members",
        {"email": f"{setup.account.lower()}@example.com", "role": "developer"},
    )
    key = _admin(
        api,
        "POST",
        f"/admin/v1/accounts/{setup.account}/api-keys",
        {"name": "member's", "member_id": member["id"]},
    )
    return Key(key["id"], key["key"], setup.account)


# Changes of a key's project or member, each made by another process of the service (its admin
# routes: the service marks the account in the same transaction, so the check-and-hold then
# reads projects and members), after the account's resolutions were remembered without them.
SCOPE_CHANGES = {
    "project spend limit": ("project", {"spend_limit_cents": 0}, 402, "project_spend_limit"),
    "member spend limit": ("member", {"spend_limit_cents": 0}, 402, "member_spend_limit"),
    "project's model list": ("project", {"allowed_models": []}, 403, "model_not_allowed"),
}
PARAMS = {"model_not_allowed": "model"}


@pytest.mark.parametrize("change", SCOPE_CHANGES)
def test_a_change_of_the_keys_project_or_member_takes_effect_at_once(api: Api, change: str) -> None:
    setup = prepaid(api, 1)
    key = _members_key(api, setup)
    _warm(api, Setup(setup.account, key, setup.model))
    owner, body, status, code = SCOPE_CHANGES[change]
    with api.database.unit_of_work() as session:
        project_id, member_id = session.execute(
            text("SELECT project_id, member_id FROM api_keys WHERE id = :id"), {"id": key.id}
        ).one()
    path = {
        "project": f"/admin/v1/projects/{project_id}",
        "member": f"/admin/v1/members/{member_id}",
    }
    _admin(api, "PATCH", path[owner], body)
    response = authorize(api, key, setup.model)
    assert_error(response, status, code, param=PARAMS.get(code))
    if status == 402:
        assert response.json()["error"]["limit_scope"] == owner


def test_an_account_with_project_limits_still_confirms_what_it_remembered(
    api: Api, resolving_reads: list[str]
) -> None:
    # The account is marked (its project has a limit, far above what is held): the
    # check-and-hold reads the key's project and member, and still finds what was read.
    setup = prepaid(api, 1)
    with api.database.unit_of_work() as session:
        project_id = session.execute(
            text("SELECT project_id FROM api_keys WHERE id = :id"), {"id": setup.key.id}
        ).scalar_one()
    _admin(api, "PATCH", f"/admin/v1/projects/{project_id}", {"spend_limit_cents": 100})
    for _ in range(4):
        assert authorize(api, setup.key, setup.model).status_code == 200
    assert len(resolving_reads) == (4 if api.backend == "sqlite" else 1)


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_behind_the_process_takes_effect_at_once(api: Api, change: str) -> None:
    setup = prepaid(api, 1)
    _warm(api, setup)
    CHANGES[change](api, setup)
    response = authorize(api, setup.key, setup.model)
    if change == "revoked key":
        assert_error(response, 401, "invalid_api_key", param="api_key")
    elif change == "new spend limit":
        assert_error(response, 402, "member_spend_limit")
    elif change == "retired model":
        assert_error(response, 404, "model_not_found", param="model")
    elif change == "smaller context":
        # The output the context leaves room for: 1050 - 1000 tokens.
        assert response.status_code == 200, response.text
        assert response.json()["max_tokens"] == 50
        assert response.json()["estimate_microcents"] == expected_estimate(1000, 50, GLM_RATES)
    elif change == "concurrency limit":
        assert_error(response, 429, "concurrency_limit_exceeded")
    elif change == "account's model list":
        assert_error(response, 404, "model_not_found", param="model")
    elif change == "key's model list":
        assert_error(response, 403, "model_not_allowed", param="model")
    elif change == "daily window":
        # Today: nothing spent, two holds in flight, this one fits exactly.
        assert response.status_code == 200, response.text
        assert_error(authorize(api, setup.key, setup.model), 402, "member_spend_limit")
    elif change == "new price":
        assert response.status_code == 200, response.text
        doubled = expected_estimate(1000, 100, (GLM_RATES[0], 2 * GLM_RATES[1], 0))
        assert response.json()["estimate_microcents"] == doubled
    else:
        assert response.status_code == 200, response.text
        placed = [hold for hold in holds(api, setup.account) if hold.id == response.json()["id"]]
        assert [hold.counted for hold in placed] == [False]
    with api.database.unit_of_work() as session:
        assert [m for m in held_counter_mismatches(session) if setup.account in m] == []


def test_a_retry_after_the_model_retired_replays_with_a_remembered_resolution(
    api: Api,
) -> None:
    tomorrow = (NOW + timedelta(days=1)).date()
    setup = prepaid(api, 1, deprecation_date=tomorrow.isoformat())
    _warm(api, setup)
    body = authorization_request(setup.key, setup.model, request_id="retry-after-retirement")
    hold = api.gateway("POST", "/v1/authorizations", json=body)
    assert hold.status_code == 200, hold.text
    _retire(api, setup)
    again = api.gateway("POST", "/v1/authorizations", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == hold.json()
    conflicting = api.gateway("POST", "/v1/authorizations", json={**body, "max_tokens": 99})
    assert_error(conflicting, 409, "idempotency_conflict", param="request_id")


def test_a_retry_with_a_remembered_resolution_replays_without_a_second_hold(api: Api) -> None:
    setup = prepaid(api, 1)
    _warm(api, setup)
    body = authorization_request(setup.key, setup.model, request_id="remembered-retry")
    first = api.gateway("POST", "/v1/authorizations", json=body)
    again = api.gateway("POST", "/v1/authorizations", json=body)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert len(holds(api, setup.account)) == 3


def _place(
    api: Api, setup: Setup, confirm: Mapping[str, Any], hold_id: str
) -> list[tuple[Any, ...]]:
    """One call of ``metering_place_holds`` with a hold sent with ``confirm``'s confirming
    fields (``_confirming``; on a cluster, of its one-account form, which reads the resolution
    again by statements of one table each: metering.citus.apart)."""
    hold = {
        "id": hold_id,
        "account_id": setup.account,
        "api_key_id": setup.key.id,
        "request_id": None,
        "request_fingerprint": "f" * 64,
        "model_id": setup.model,
        "api": "chat_completions",
        "prompt_tokens": 1000,
        "requested_max_tokens": 100,
        "n": 1,
        "reasoning": False,
        "max_tokens": 100,
        "estimate_microcents": ESTIMATE,
        "created_at": NOW.isoformat(),
        "expires_at": (NOW + timedelta(hours=1)).isoformat(),
        "spend_limit": None,
        "window_start": NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0).isoformat(),
        "window_end": "2100-01-01T00:00:00+00:00",
        **NOT_CONFIRMING,
        **confirm,
    }
    with api.database.unit_of_work() as session:
        call = (
            "metering_place_holds_of_account(:account, :now, CAST(:holds AS json))"
            if api.backend == "citus"
            else "metering_place_holds(:now, CAST(:holds AS json))"
        )
        placed = [
            tuple(row)
            for row in session.execute(
                text(f"SELECT * FROM {call}"),
                {
                    "account": setup.account,
                    "now": NOW,
                    "holds": json.dumps([hold], default=datetime.isoformat),
                },
            )
        ]
        session.commit()
        return placed


def _secret_hash(api: Api, setup: Setup) -> str:
    with api.database.unit_of_work() as session:
        return str(
            session.execute(
                text("SELECT secret_hash FROM api_keys WHERE id = :id"), {"id": setup.key.id}
            ).scalar_one()
        )


def test_the_check_and_hold_places_only_a_confirmed_resolution(plain_pg_api: Api) -> None:
    # One server confirms a stamp (a cluster its text: the test below, and tests/test_citus.py
    # proves its statements' routes). A stamp that differs from the database's in any part, or
    # whose price bounds leave out the hold's instant, is stale; the one read is confirmed until
    # a change of its inputs moves a generation.
    setup = prepaid(plain_pg_api, 1)
    stamp = _confirming(plain_pg_api, setup)
    assert stamp is not None and stamp["valid_from"] <= NOW and stamp["valid_until"] is None
    doctored = {
        "an account's older generation": {"generation": stamp["generation"] - 1},
        "a model's newer generation": {"model_generation": stamp["model_generation"] + 1},
        "a price that ended": {"valid_until": NOW},
        "a price not yet in force": {"valid_from": NOW + timedelta(microseconds=1)},
    }
    for name, change in doctored.items():
        hold_id = f"auth_{name.replace(' ', '_')}"
        assert _place(plain_pg_api, setup, {**stamp, **change}, hold_id) == [
            (hold_id, "stale", 1_000_000, None)
        ], name
    assert [hold.id for hold in holds(plain_pg_api, setup.account)] == []
    assert _place(plain_pg_api, setup, stamp, "auth_confirmed") == [
        ("auth_confirmed", "granted", 1_000_000, None)
    ]
    assert [hold.id for hold in holds(plain_pg_api, setup.account)] == ["auth_confirmed"]
    _revoke(plain_pg_api, setup)
    assert _place(plain_pg_api, setup, stamp, "auth_revoked")[0][1] == "stale"
    assert [hold.id for hold in holds(plain_pg_api, setup.account)] == ["auth_confirmed"]


def test_metrics_count_reads_remembered_and_stale_resolutions(pg_api: Api) -> None:
    setup = prepaid(pg_api, 1)
    before = resolution_sources(pg_api)
    _warm(pg_api, setup)  # one read, then one remembered
    _reprice(pg_api, setup)
    assert authorize(pg_api, setup.key, setup.model).status_code == 200  # stale, read again
    assert authorize(pg_api, setup.key, setup.model).status_code == 200  # remembered
    after = resolution_sources(pg_api)
    assert {source: after[source] - before[source] for source in after} == {
        "read": 2,
        "remembered": 3,
        "stale": 1,
    }


def _confirming(api: Api, setup: Setup) -> dict[str, Any] | None:
    """What a fresh read gives the check-and-hold to confirm the resolution by (None: no live
    key): on one server its stamp; on a cluster its text (read for the account's shard, as the
    service reads it there) with the key and model it is recomputed for."""
    found = resolution(SECRET_HASH, MODEL_KEY, AT).subquery("resolution")
    secret_hash, model_key = _secret_hash(api, setup), setup.model.lower()
    params = {"secret_hash": secret_hash, "model_key": model_key, "now": NOW}
    with api.database.unit_of_work() as session:
        if api.backend == "citus":
            sql = text_of_account(select(as_text(found)))
            value = (
                session.connection()
                .exec_driver_sql(sql, {**params, "p_account_id": setup.account})
                .scalar_one_or_none()
            )
            if value is None:
                return None
            return {"resolution": str(value), "secret_hash": secret_hash, "model_key": model_key}
        row = session.execute(select(*stamp_of(found, AT)), params).one_or_none()
        return None if row is None else dict(zip(STAMP_NAMES, row, strict=True))


def _own_price(api: Api, setup: Setup) -> None:
    """The account's own rates for the model, in force since an hour before ``NOW``."""
    since = NOW - timedelta(hours=1)
    api.clock.set(since)
    try:
        _admin(
            api,
            "POST",
            f"/admin/v1/accounts/{setup.account}/rates",
            {
                "model": setup.model,
                "effective_at": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "input_microcents_per_million": 1,
                "output_microcents_per_million": 1,
                "cache_read_microcents_per_million": 0,
            },
        )
    finally:
        api.clock.set(NOW)


def _account_lists(api: Api, setup: Setup, *, with_model: bool) -> None:
    _narrow_account(api, setup)
    if with_model:
        change_in_database(
            api,
            "INSERT INTO account_models (account_id, model_id) VALUES (:account, :model)",
            account=setup.account,
            model=setup.model,
        )


def _key_lists(api: Api, setup: Setup, *, with_model: bool) -> None:
    models = [setup.model] if with_model else []
    _admin(api, "PATCH", f"/admin/v1/api-keys/{setup.key.id}", {"allowed_models": models})


def _scope(api: Api, setup: Setup, scope: str, body: dict[str, Any]) -> None:
    """The key's project or member (``scope``) changed through the service (which marks the
    account)."""
    with api.database.unit_of_work() as session:
        scope_id = session.execute(
            text(f"SELECT {scope}_id FROM api_keys WHERE id = :id"), {"id": setup.key.id}
        ).scalar_one()
    _admin(api, "PATCH", f"/admin/v1/{scope}s/{scope_id}", body)


# Each fact a resolution rests on, changed behind the process; and whether the resolution's
# text stays the same (a list that still names the model: read, and found, by the confirmation).
FACTS: dict[str, tuple[Callable[[Api, Setup], None], bool]] = {
    "revoked key": (_revoke, False),
    "key's spend limit": (_limit, False),
    "retired model": (_retire, False),
    "smaller context": (_shrink, False),
    "new list price": (_reprice, False),
    "account's own price": (_own_price, False),
    "unbilled account": (_unbill, False),
    "concurrency limit": (_concurrency, False),
    "account's list without the model": (
        lambda a, s: _account_lists(a, s, with_model=False),
        False,
    ),
    "account's list with the model": (lambda a, s: _account_lists(a, s, with_model=True), True),
    "key's list without the model": (lambda a, s: _key_lists(a, s, with_model=False), False),
    "key's list with the model": (lambda a, s: _key_lists(a, s, with_model=True), True),
    "project spend limit": (
        lambda a, s: _scope(a, s, "project", {"spend_limit_cents": 100}),
        False,
    ),
    "project's list without the model": (
        lambda a, s: _scope(a, s, "project", {"allowed_models": []}),
        False,
    ),
    "project's list with the model": (
        lambda a, s: _scope(a, s, "project", {"allowed_models": [s.model]}),
        True,
    ),
    "member spend limit": (lambda a, s: _scope(a, s, "member", {"spend_limit_cents": 100}), False),
}


@pytest.mark.parametrize("fact", FACTS)
def test_the_check_and_hold_confirms_exactly_the_resolution_read(pg_api: Api, fact: str) -> None:
    # What was read is confirmed; a change of any fact it rests on makes the remembered one
    # stale. On one server every such change moves a generation (the database's triggers), so
    # the stamp read afresh differs; a cluster recomputes the fresh read's text byte for byte
    # (from its statements of one table each), and a change that leaves it as it was keeps it.
    account = prepaid(pg_api, 1)
    setup = Setup(account.account, _members_key(pg_api, account), account.model)
    remembered = _confirming(pg_api, setup)
    assert remembered is not None
    assert _place(pg_api, setup, remembered, f"auth_read_{setup.account}")[0][1] == "granted"
    change, same_text = FACTS[fact]
    same = same_text and pg_api.backend == "citus"
    change(pg_api, setup)
    now = _confirming(pg_api, setup)
    assert (now == remembered) is same
    outcome = _place(pg_api, setup, remembered, f"auth_remembered_{setup.account}")[0][1]
    assert outcome == ("granted" if same else "stale")
    if now is not None:  # read again: confirmed (whatever the checks then decide)
        assert _place(pg_api, setup, now, f"auth_read_again_{setup.account}")[0][1] != "stale"
