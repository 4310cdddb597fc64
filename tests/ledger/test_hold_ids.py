"""A hold's id names its account (metering.states.holds), so a cluster can find a hold on its
account's shard from the id alone (docs/citus.md); ids of the earlier form name none."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.kit.ids import new_id
from metering.states import holds
from metering.usage.events import MAX_AUTHORIZATION_ID
from tests.conftest import NOW, Api
from tests.factories import authorize, create_account, create_key, grant, priced_model

# The random part of an account id: new_id's alphabet (base32, lower case), 1-20 long.
ACCOUNT_PARTS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz234567", min_size=1, max_size=20)


@given(ACCOUNT_PARTS)
def test_a_new_id_names_its_account(part: str) -> None:
    account = f"acct_{part}"
    hold_id = holds.new_hold_id(account)
    assert hold_id.startswith("auth_")
    assert holds.account_of(hold_id) == account
    assert len(hold_id) <= MAX_AUTHORIZATION_ID
    assert hold_id != holds.new_hold_id(account)


def test_a_new_account_id_is_one_a_hold_can_name() -> None:
    account = new_id("acct")
    assert holds.account_of(holds.new_hold_id(account)) == account


@pytest.mark.parametrize(
    "hold_id",
    [
        # the earlier form; new_id is random, the test id is not (every run names it the same)
        pytest.param(new_id("auth"), id="the-earlier-form"),
        "auth_x",
        "auth__abcdefghijklmnop",
        "auth_abc_short",
        "acct_abc_abcdefghijklmnop",
        "",
        "auth_a_b_abcdefghijklmnop",
    ],
)
def test_other_ids_name_no_account(hold_id: str) -> None:
    assert holds.account_of(hold_id) is None


def test_the_api_answers_ids_that_name_the_account(api: Api) -> None:
    model = priced_model(api, NOW - timedelta(days=1))
    account = create_account(api)
    grant(api, account, 100)
    response = authorize(api, create_key(api, account), model)
    assert response.status_code == 200, response.text
    assert holds.account_of(response.json()["id"]) == account
    voided = api.gateway("DELETE", f"/v1/authorizations/{response.json()['id']}")
    assert voided.json()["status"] == "voided"
