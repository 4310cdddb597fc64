"""End to end: the OpenAI and Anthropic SDKs call a real LiteLLM proxy with a customer's key; the
proxy (metering_client.litellm) holds, records and voids against a real metering server.

Each call is recorded once and charged exactly from the usage the SDK received (the expected
charge computed here from the catalog file's rates); refusals reach the SDKs as their own
exceptions (402 ``insufficient_credits``, 403, 404, 429 with ``Retry-After``); a stream that
broke after it started is charged as ``failed``; metering stopped for part of a run loses
nothing (the proxy's spool replays it) and ``metering verify`` is clean afterwards.

One proxy for the module (LiteLLM takes tens of seconds to start), in front of a metering server
per backend on a fixed port."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from metering_client import MeteringClient
from tests.conftest import BACKENDS
from tests.gateway.litellm_proxy import (
    BROKEN_STREAM,
    UNKNOWN_TO_METERING,
    LiteLLMProxy,
    running_proxy,
)
from tests.gateway.support import (
    GATEWAY,
    Customer,
    Metering,
    expected_charge,
    now,
    running_metering,
)
from tests.servers import free_port

METERING_PORT = free_port()
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteLLMProxy]:
    with running_proxy(
        tmp_path_factory.mktemp("litellm"), f"http://127.0.0.1:{METERING_PORT}"
    ) as started:
        yield started


@pytest.fixture(scope="module", params=[b for b in ("sqlite", "postgresql") if b in BACKENDS])
def metering(
    request: pytest.FixtureRequest, proxy: LiteLLMProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Metering]:
    workdir = tmp_path_factory.mktemp(request.param)
    with running_metering(request.param, workdir, port=METERING_PORT) as service:
        yield service
        # Nothing of this database's left for the next backend's server on the same port.
        proxy.wait_drained()


def openai_client(proxy: LiteLLMProxy, customer: Customer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=customer.key, max_retries=0)


def anthropic_client(proxy: LiteLLMProxy, customer: Customer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=customer.key, max_retries=0)


def usage_dict(usage: Any) -> dict[str, Any]:
    return dict(usage.model_dump(exclude_none=True))


def assert_charged(
    metering: Metering, customer: Customer, calls: list[tuple[str, str, str, dict[str, Any]]]
) -> None:
    """Each call (request id, model, api, usage the SDK received) recorded once, at its price."""
    for request_id, model, api, usage in calls:
        event = metering.wait_for_event(customer, request_id)
        assert event["charge"]["total_microcents"] == expected_charge(model, api, usage, now()), (
            request_id,
            usage,
        )
    charges = metering.charges(customer)
    assert len(charges) == len(calls)
    assert sum(c["amount_microcents"] for c in charges) == -sum(
        expected_charge(model, api, usage, now()) for _, model, api, usage in calls
    )


def test_openai_sdk_chat_completions_charged_from_the_usage_it_received(
    proxy: LiteLLMProxy, metering: Metering
) -> None:
    customer = metering.customer(credit_cents=1000)
    client = openai_client(proxy, customer)

    raw = client.chat.completions.with_raw_response.create(
        model="GLM-5.3", messages=HELLO, max_tokens=256
    )
    completion = raw.parse()
    whole = (raw.headers["x-litellm-call-id"], "GLM-5.3", "chat_completions",
             usage_dict(completion.usage))  # fmt: skip

    # A stream the customer did not ask usage for still ends with its usage chunk, as the
    # reference API's streams do.
    raw_stream = client.chat.completions.with_raw_response.create(
        model="GLM-5.3-Flash", messages=HELLO, max_tokens=256, stream=True
    )
    chunks = list(raw_stream.parse())
    assert chunks[-1].usage is not None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = (raw_stream.headers["x-litellm-call-id"], "GLM-5.3-Flash", "chat_completions",
                usage_dict(chunks[-1].usage))  # fmt: skip

    proxy.wait_drained()
    assert_charged(metering, customer, [whole, streamed])
    assert metering.holds(customer, "active") == []
    assert len(metering.holds(customer, "settled")) == 2


def test_anthropic_sdk_messages_charged_from_the_usage_it_received(
    proxy: LiteLLMProxy, metering: Metering
) -> None:
    customer = metering.customer(credit_cents=1000)
    raw = anthropic_client(proxy, customer).messages.with_raw_response.create(
        model="GLM-5.3", max_tokens=1024, messages=HELLO
    )
    message = raw.parse()
    assert message.usage.input_tokens > 0
    proxy.wait_drained()
    assert_charged(
        metering,
        customer,
        [(raw.headers["x-litellm-call-id"], "GLM-5.3", "messages", usage_dict(message.usage))],
    )


def test_out_of_credit_is_the_sdks_402(proxy: LiteLLMProxy, metering: Metering) -> None:
    customer = metering.customer(credit_cents=None)
    with pytest.raises(openai.APIStatusError) as refused:
        openai_client(proxy, customer).chat.completions.create(
            model="GLM-5.3", messages=HELLO, max_tokens=256
        )
    assert refused.value.status_code == 402
    assert refused.value.code == "insufficient_credits"
    assert refused.value.type == "insufficient_credits"
    assert refused.value.body["credits_available_cents"] == 0  # type: ignore[index]
    assert refused.value.body["credits_required_cents_estimate"] > 0  # type: ignore[index]

    with pytest.raises(anthropic.PaymentRequiredError) as billing:
        anthropic_client(proxy, customer).messages.create(
            model="GLM-5.3", max_tokens=256, messages=HELLO
        )
    assert billing.value.status_code == 402
    assert billing.value.body["type"] == "error"  # type: ignore[index]
    assert billing.value.body["error"]["type"] == "billing_error"  # type: ignore[index]
    assert billing.value.body["error"]["code"] == "insufficient_credits"  # type: ignore[index]
    assert metering.holds(customer, "active") == []
    assert metering.charges(customer) == []


def test_models_the_key_cannot_use(proxy: LiteLLMProxy, metering: Metering) -> None:
    customer = metering.customer(credit_cents=1000, allowed_models=["GLM-5.3-Flash"])
    client = openai_client(proxy, customer)
    with pytest.raises(openai.PermissionDeniedError) as forbidden:
        client.chat.completions.create(model="GLM-5.3", messages=HELLO, max_tokens=16)
    assert (forbidden.value.status_code, forbidden.value.code) == (403, "model_not_allowed")
    assert forbidden.value.param == "model"
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        anthropic_client(proxy, customer).messages.create(
            model="GLM-5.3", max_tokens=16, messages=HELLO
        )
    assert denied.value.body["error"]["code"] == "model_not_allowed"  # type: ignore[index]

    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model=UNKNOWN_TO_METERING, messages=HELLO, max_tokens=16)
    assert unknown.value.code == "model_not_found"
    assert metering.holds(customer, "active") == []


def test_keys_metering_does_not_know(proxy: LiteLLMProxy, metering: Metering) -> None:
    with pytest.raises(openai.AuthenticationError) as invalid:
        openai.OpenAI(
            base_url=f"{proxy.url}/v1", api_key="mk_nope", max_retries=0
        ).chat.completions.create(model="GLM-5.3", messages=HELLO, max_tokens=16)
    assert invalid.value.code == "invalid_api_key"
    assert invalid.value.param is None

    missing = httpx.post(
        f"{proxy.url}/v1/messages",
        json={"model": "GLM-5.3", "max_tokens": 16, "messages": HELLO},
        timeout=30,
    )
    assert missing.status_code == 401
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["code"] == "missing_api_key"
    # LiteLLM's other routes (pass-through, management) would skip metering: not served.
    customer = metering.customer(credit_cents=1000)
    other = httpx.get(
        f"{proxy.url}/key/list", headers={"Authorization": f"Bearer {customer.key}"}, timeout=30
    )
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "not_found"


def test_concurrency_is_429_with_retry_after(proxy: LiteLLMProxy, metering: Metering) -> None:
    customer = metering.customer(credit_cents=1000, max_concurrent_requests=1)
    with MeteringClient(metering.url, GATEWAY, spool_path=proxy.workdir / "own.sqlite3") as own:
        in_flight = own.authorize(
            api_key=customer.key, model="GLM-5.3", api="chat_completions", prompt_tokens=10
        )
        with pytest.raises(openai.RateLimitError) as busy:
            openai_client(proxy, customer).chat.completions.create(
                model="GLM-5.3", messages=HELLO, max_tokens=16
            )
        assert busy.value.code == "concurrency_limit_exceeded"
        assert busy.value.response.headers["retry-after"] == "1"
        assert busy.value.response.headers["ratelimit-reset"] == "1"
        with pytest.raises(anthropic.RateLimitError) as limited:
            anthropic_client(proxy, customer).messages.create(
                model="GLM-5.3", max_tokens=16, messages=HELLO
            )
        assert limited.value.response.headers["retry-after"] == "1"
        assert limited.value.body["error"]["code"] == "concurrency_limit_exceeded"  # type: ignore[index]
        own.void(in_flight)
    assert [h["id"] for h in metering.holds(customer, "active")] == []


def test_a_stream_that_broke_after_it_started_is_charged_as_failed(
    proxy: LiteLLMProxy, metering: Metering
) -> None:
    customer = metering.customer(credit_cents=1000)
    raw = openai_client(proxy, customer).chat.completions.with_raw_response.create(
        model=BROKEN_STREAM, messages=HELLO, max_tokens=64, stream=True
    )
    received = []
    with pytest.raises(openai.APIError):
        for chunk in raw.parse():
            received.append(chunk)
    assert received and all(c.usage is None for c in received)  # LiteLLM strips the usage

    request_id = raw.headers["x-litellm-call-id"]
    proxy.wait_drained()
    event = metering.wait_for_event(customer, request_id)
    assert event["outcome"] == "failed"
    # The provider's last report before it went away (tests/gateway/broken_stream.py).
    usage = {"prompt_tokens": 7, "completion_tokens": 3}
    assert event["charge"]["total_microcents"] == expected_charge(
        BROKEN_STREAM, "chat_completions", usage, now()
    )


def test_metering_outage_loses_nothing(proxy: LiteLLMProxy, metering: Metering) -> None:
    customer = metering.customer(credit_cents=1000)
    stranger = metering.customer(credit_cents=1000)
    client = openai_client(proxy, customer)
    calls = []
    raw = client.chat.completions.with_raw_response.create(
        model="GLM-5.3", messages=HELLO, max_tokens=64
    )
    calls.append((raw.headers["x-litellm-call-id"], "GLM-5.3", "chat_completions",
                  usage_dict(raw.parse().usage)))  # fmt: skip
    proxy.wait_drained()

    metering.server.kill()
    try:
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model="GLM-5.3", messages=HELLO, max_tokens=64
            )
            calls.append((raw.headers["x-litellm-call-id"], "GLM-5.3", "chat_completions",
                          usage_dict(raw.parse().usage)))  # fmt: skip
        raw_stream = client.chat.completions.with_raw_response.create(
            model="GLM-5.3", messages=HELLO, max_tokens=64, stream=True
        )
        chunks = list(raw_stream.parse())
        calls.append((raw_stream.headers["x-litellm-call-id"], "GLM-5.3", "chat_completions",
                      usage_dict(chunks[-1].usage)))  # fmt: skip
        message = anthropic_client(proxy, customer).messages.with_raw_response.create(
            model="GLM-5.3", max_tokens=64, messages=HELLO
        )
        calls.append((message.headers["x-litellm-call-id"], "GLM-5.3", "messages",
                      usage_dict(message.parse().usage)))  # fmt: skip
        # A key the proxy never saw authorized is not served blind: the reference API's
        # transient 429, which the SDKs retry by themselves.
        with pytest.raises(openai.RateLimitError) as unavailable:
            openai_client(proxy, stranger).chat.completions.create(
                model="GLM-5.3", messages=HELLO, max_tokens=64
            )
        assert unavailable.value.code == "auth_backend_unavailable"
        assert proxy.pending() == 4  # the usage waits in the proxy's spool
    finally:
        metering.restart()

    proxy.wait_drained()
    assert_charged(metering, customer, calls)
    assert metering.charges(stranger) == []
    metering.verify()
