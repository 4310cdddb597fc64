"""metering-client against the real service (a server process, SQLite and PostgreSQL): the hold,
the usage recorded and charged exactly, voids, every refusal the authorization can answer as its
typed exception, idempotent retries, and the policy when metering cannot be reached."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

import metering_client.errors as errors
from metering_client import (
    AsyncMeteringClient,
    Authorization,
    MeteringClient,
    MeteringUnavailable,
    SenderSettings,
    new_request_id,
)
from tests.gateway.support import GATEWAY, Customer, Metering, expected_charge
from tests.servers import free_port

CHAT_USAGE = {
    "prompt_tokens": 4508,
    "completion_tokens": 20,
    "total_tokens": 4528,
    "prompt_tokens_details": {"cached_tokens": 4352},
}
FAST = SenderSettings(max_delay=0.02, min_backoff=0.05, max_backoff=0.5)


def client(metering: Metering, tmp_path: Path, **kwargs: object) -> MeteringClient:
    return MeteringClient(
        metering.url,
        GATEWAY,
        spool_path=tmp_path / "spool.sqlite3",
        sender=FAST,
        **kwargs,  # type: ignore[arg-type]
    )


def authorize(gateway: MeteringClient, customer: Customer, **overrides: object) -> Authorization:
    arguments: dict[str, object] = {
        "api_key": customer.key,
        "model": "GLM-5.3",
        "api": "chat_completions",
        "prompt_tokens": 4508,
        "max_tokens": 1024,
    }
    arguments.update(overrides)
    return gateway.authorize(**arguments)  # type: ignore[arg-type]


def test_hold_then_usage_charged_exactly(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=1000)
    with client(metering, tmp_path) as gateway:
        granted = gateway.authorize(
            api_key=customer.key, model="glm-5.3", api="chat_completions",
            prompt_tokens=4508, max_tokens=1024,
        )  # fmt: skip
        assert granted.id and granted.id.startswith("auth_")
        assert (granted.api_key_id, granted.model) == (customer.key_id, "GLM-5.3")
        assert metering.holds(customer, "active")[0]["id"] == granted.id

        gateway.record(granted.usage_event(CHAT_USAGE))
        assert gateway.flush(15) == 0

    event = metering.event(customer, granted.request_id)
    assert event is not None
    expected = expected_charge("GLM-5.3", "chat_completions", CHAT_USAGE, granted.received_at)
    assert event["charge"]["total_microcents"] == expected == 87_460
    assert metering.holds(customer, "settled")[0]["id"] == granted.id
    assert [c["amount_microcents"] for c in metering.charges(customer)] == [-expected]


def test_void_releases_the_hold(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=1000)
    with client(metering, tmp_path) as gateway:
        granted = authorize(gateway, customer)
        gateway.void(granted)
        assert gateway.flush(15) == 0
    assert [h["id"] for h in metering.holds(customer, "voided")] == [granted.id]
    assert metering.charges(customer) == []


def test_a_retried_authorization_is_one_hold(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=1000)
    request_id = new_request_id()
    with client(metering, tmp_path) as gateway:
        first = authorize(gateway, customer, request_id=request_id)
        again = authorize(gateway, customer, request_id=request_id)
        assert again.id == first.id
        with pytest.raises(errors.IdempotencyConflict):
            authorize(gateway, customer, request_id=request_id, max_tokens=2048)
    assert len(metering.holds(customer, "active")) == 1


def test_each_refusal_is_its_exception(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=1000)
    poor = metering.customer(credit_cents=None)
    flash_only = metering.customer(credit_cents=1000, allowed_models=["GLM-5.3-Flash"])
    one_at_a_time = metering.customer(credit_cents=1000, max_concurrent_requests=1)
    response = metering.admin(
        "POST",
        f"/admin/v1/accounts/{customer.account_id}/api-keys",
        json={"name": "capped", "spend_limit_cents": 0.01, "spend_limit_window": "day"},
    )
    capped_key = response.json()["key"]

    with client(metering, tmp_path) as gateway:
        cases: list[tuple[type[errors.MeteringError], dict[str, object], Customer]] = [
            (errors.MissingApiKey, {"api_key": ""}, customer),
            (errors.InvalidApiKey, {"api_key": "mk_not-a-key"}, customer),
            (errors.ModelNotFound, {"model": "No-Such-Model"}, customer),
            (errors.ModelNotAllowed, {}, flash_only),
            (errors.MissingParameter, {"api": "messages", "max_tokens": None}, customer),
            (errors.ContextLengthExceeded, {"prompt_tokens": 2_000_000}, customer),
            (errors.InsufficientCredits, {}, poor),
            (errors.MemberSpendLimit, {"api_key": capped_key}, customer),
        ]
        for expected, overrides, who in cases:
            with pytest.raises(expected) as raised:
                authorize(gateway, who, **overrides)
            assert raised.value.code == expected.default_code
            assert raised.value.request_id  # metering's id of the refused call
        with pytest.raises(errors.InsufficientCredits) as credit:
            authorize(gateway, poor)
        assert set(credit.value.extra) >= {
            "credits_available_cents",
            "credits_required_cents_estimate",
        }
        assert credit.value.to_openai().status == 402

        authorize(gateway, one_at_a_time)
        with pytest.raises(errors.ConcurrencyLimitExceeded) as busy:
            authorize(gateway, one_at_a_time)
        assert busy.value.retry_after == 1
        assert busy.value.to_openai().headers == {"Retry-After": "1", "RateLimit-Reset": "1"}


def test_events_are_batched_and_each_recorded_once(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=100_000)
    usage = {"prompt_tokens": 10, "completion_tokens": 20}
    with client(metering, tmp_path) as gateway:
        event = authorize(gateway, customer).usage_event(usage)
        for i in range(1200):  # more than one batch of 1,000
            gateway.record(dataclasses.replace(event, request_id=f"batch-{i}"))
        assert gateway.flush(60) == 0
    charges = metering.charges(customer)
    assert len(charges) == 1200
    each = expected_charge("GLM-5.3", "chat_completions", usage, event.occurred_at)
    assert {c["amount_microcents"] for c in charges} == {-each}


def test_metering_unreachable_deny_is_a_429_to_retry(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with MeteringClient(dead, GATEWAY, spool_path=tmp_path / "s.sqlite3", authorize_timeout=0.5,
                        sender=FAST) as gateway:  # fmt: skip
        started = time.monotonic()
        with pytest.raises(MeteringUnavailable) as raised:
            gateway.authorize(api_key="mk_x", model="GLM-5.3", api="chat_completions",
                              prompt_tokens=1)  # fmt: skip
        assert time.monotonic() - started < 3
        assert raised.value.to_openai().status == 429
        gateway.close(timeout=0.1)


def test_outage_allow_serves_known_keys_and_loses_nothing(
    metering: Metering, tmp_path: Path
) -> None:
    customer = metering.customer(credit_cents=1000)
    stranger = metering.customer(credit_cents=1000)
    gateway = client(metering, tmp_path, on_unavailable="allow", authorize_timeout=0.5)
    try:
        before = authorize(gateway, customer)  # metering knows the key: remembered
        gateway.record(before.usage_event(CHAT_USAGE))
        assert gateway.flush(15) == 0

        metering.server.kill()
        during = authorize(gateway, customer)
        assert during.provisional and during.id is None
        assert during.api_key_id == customer.key_id
        with pytest.raises(MeteringUnavailable):
            authorize(gateway, stranger)  # never seen: not served blind
        gateway.record(during.usage_event(CHAT_USAGE))
        assert gateway.flush(1) == 1  # kept in the spool

        metering.restart()
        assert gateway.flush(30) == 0
    finally:
        gateway.close()
        if metering.server.process is None or metering.server.process.poll() is not None:
            metering.restart()
    expected = expected_charge("GLM-5.3", "chat_completions", CHAT_USAGE, during.received_at)
    assert metering.wait_for_event(customer, during.request_id)["charge"]["total_microcents"] == (
        expected
    )
    assert len(metering.charges(customer)) == 2
    metering.verify()


def test_async_client(metering: Metering, tmp_path: Path) -> None:
    customer = metering.customer(credit_cents=1000)
    usage = {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 40}

    async def run() -> Authorization:
        async with AsyncMeteringClient(
            metering.url, GATEWAY, spool_path=tmp_path / "spool.sqlite3", sender=FAST
        ) as gateway:
            granted = await gateway.authorize(
                api_key=customer.key, model="GLM-5.3", api="messages",
                prompt_tokens=100, max_tokens=50,
            )  # fmt: skip
            gateway.record(granted.usage_event(usage))
            with pytest.raises(errors.MissingParameter):  # messages: max_tokens required
                await gateway.authorize(
                    api_key=customer.key, model="GLM-5.3", api="messages", prompt_tokens=100
                )
            assert await gateway.flush(15) == 0
            return granted

    granted = asyncio.run(run())
    event = metering.event(customer, granted.request_id)
    assert event is not None
    assert event["charge"]["total_microcents"] == expected_charge(
        "GLM-5.3", "messages", usage, granted.received_at
    )
