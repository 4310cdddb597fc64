"""Normalising each API's usage object into the four billing counts
(docs/api.md#post-v1usageevents)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.pricing import MAX_TOKEN_COUNT, InvalidUsage, NormalizedUsage, normalize_usage
from tests.factories import usage_object

# The docs' Chat Completions example (Usage and Billing).
DOCS_CHAT_USAGE = {
    "prompt_tokens": 4508,
    "completion_tokens": 20,
    "total_tokens": 4528,
    "prompt_tokens_details": {"cached_tokens": 4352},
    "completion_tokens_details": {"reasoning_tokens": 16},
}


class TestDocsExample:
    def test_chat_example_counts(self) -> None:
        usage = normalize_usage("chat_completions", DOCS_CHAT_USAGE)
        assert usage == NormalizedUsage(
            prompt_tokens=4508, cached_tokens=4352, output_tokens=20, reasoning_tokens=16
        )
        assert usage.uncached_input_tokens == 156

    def test_result_is_frozen(self) -> None:
        usage = normalize_usage("chat_completions", DOCS_CHAT_USAGE)
        with pytest.raises(AttributeError):
            usage.prompt_tokens = 1  # type: ignore[misc]


class TestEachApi:
    @pytest.mark.parametrize(
        ("api", "raw", "expected"),
        [
            (
                "chat_completions",
                {
                    "prompt_tokens": 22,
                    "completion_tokens": 16,
                    "total_tokens": 38,
                    "prompt_tokens_details": {"cached_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
                (22, 0, 16, 0),
            ),
            (
                "responses",
                {
                    "input_tokens": 336,
                    "output_tokens": 17,
                    "total_tokens": 353,
                    "input_tokens_details": {"cached_tokens": 128},
                    "output_tokens_details": {"reasoning_tokens": 9},
                },
                (336, 128, 17, 9),
            ),
            # The docs' Messages response: input_tokens already includes the 256 cache reads.
            (
                "messages",
                {
                    "input_tokens": 338,
                    "output_tokens": 29,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 256,
                },
                (338, 256, 29, 0),
            ),
        ],
        ids=["chat_completions", "responses", "messages"],
    )
    def test_documented_shapes(
        self, api: str, raw: dict[str, Any], expected: tuple[int, int, int, int]
    ) -> None:
        usage = normalize_usage(api, raw)
        assert (
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.output_tokens,
            usage.reasoning_tokens,
        ) == expected

    def test_messages_input_tokens_is_not_added_to_cache_reads(self) -> None:
        # Unlike Anthropic's own API, input_tokens counts every prompt token on this API.
        usage = normalize_usage(
            "messages", {"input_tokens": 1000, "cache_read_input_tokens": 900, "output_tokens": 5}
        )
        assert usage.prompt_tokens == 1000
        assert usage.uncached_input_tokens == 100

    def test_messages_has_no_reasoning_count(self) -> None:
        usage = normalize_usage(
            "messages",
            {"input_tokens": 10, "output_tokens": 50, "reasoning_tokens": 40},
        )
        assert usage.reasoning_tokens == 0
        assert usage.output_tokens == 50

    def test_messages_ignores_cache_creation(self) -> None:
        usage = normalize_usage(
            "messages",
            {"input_tokens": 10, "output_tokens": 3, "cache_creation_input_tokens": 7},
        )
        assert usage == NormalizedUsage(10, 0, 3, 0)

    def test_each_api_reads_only_its_own_field_names(self) -> None:
        # Chat Completions field names mean nothing to Responses, and the other way round.
        chat_named = {"prompt_tokens": 10, "completion_tokens": 5}
        assert normalize_usage("responses", chat_named) == NormalizedUsage(0, 0, 0, 0)
        responses_named = {"input_tokens": 10, "output_tokens": 5}
        assert normalize_usage("chat_completions", responses_named) == NormalizedUsage(0, 0, 0, 0)
        # Messages has no detail objects: a cached count nested the OpenAI way is not read.
        nested = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}}
        assert normalize_usage("messages", nested).cached_tokens == 0

    def test_unknown_api_is_refused(self) -> None:
        with pytest.raises(ValueError, match="unknown api"):
            normalize_usage("completions", {"prompt_tokens": 1})

    @settings(max_examples=60, deadline=None)
    @given(
        api=st.sampled_from(["chat_completions", "responses", "messages"]),
        data=st.data(),
    )
    def test_round_trip_of_valid_counts(self, api: str, data: st.DataObject) -> None:
        prompt = data.draw(st.integers(0, MAX_TOKEN_COUNT), label="prompt")
        cached = data.draw(st.integers(0, prompt), label="cached")
        output = data.draw(st.integers(0, MAX_TOKEN_COUNT), label="output")
        reasoning = 0 if api == "messages" else data.draw(st.integers(0, output), label="reason")
        usage = normalize_usage(api, usage_object(api, prompt, cached, output, reasoning))
        assert usage == NormalizedUsage(prompt, cached, output, reasoning)
        assert usage.uncached_input_tokens == prompt - cached


class TestMissingAndNull:
    @pytest.mark.parametrize(
        ("api", "raw", "expected"),
        [
            ("chat_completions", {}, (0, 0, 0, 0)),
            ("responses", {}, (0, 0, 0, 0)),
            ("messages", {}, (0, 0, 0, 0)),
            ("chat_completions", {"prompt_tokens": 7, "completion_tokens": 3}, (7, 0, 3, 0)),
            (
                "chat_completions",
                {
                    "prompt_tokens": 7,
                    "completion_tokens": 3,
                    "prompt_tokens_details": None,
                    "completion_tokens_details": None,
                },
                (7, 0, 3, 0),
            ),
            (
                "chat_completions",
                {
                    "prompt_tokens": 7,
                    "completion_tokens": 3,
                    "prompt_tokens_details": {},
                    "completion_tokens_details": {"reasoning_tokens": None},
                },
                (7, 0, 3, 0),
            ),
            ("chat_completions", {"prompt_tokens": None, "completion_tokens": None}, (0, 0, 0, 0)),
            # Responses omits input_tokens_details when nothing was cached (docs).
            ("responses", {"input_tokens": 22, "output_tokens": 36}, (22, 0, 36, 0)),
            (
                "responses",
                {
                    "input_tokens": 22,
                    "output_tokens": 36,
                    "input_tokens_details": None,
                    "output_tokens_details": {"reasoning_tokens": None},
                },
                (22, 0, 36, 0),
            ),
            (
                "messages",
                {"input_tokens": 22, "output_tokens": 36, "cache_read_input_tokens": None},
                (22, 0, 36, 0),
            ),
        ],
    )
    def test_missing_or_null_means_zero(
        self, api: str, raw: dict[str, Any], expected: tuple[int, int, int, int]
    ) -> None:
        assert normalize_usage(api, raw) == NormalizedUsage(*expected)


class TestExtraFieldsIgnored:
    def test_unknown_fields_everywhere(self) -> None:
        raw = {
            **DOCS_CHAT_USAGE,
            "prompt_tokens_details": {"cached_tokens": 4352, "audio_tokens": 99, "x": "y"},
            "completion_tokens_details": {
                "reasoning_tokens": 16,
                "accepted_prediction_tokens": 1.5,
                "rejected_prediction_tokens": None,
            },
            "queue_time": 0.25,
            "server_tool_use": {"web_search_requests": 3},
        }
        assert normalize_usage("chat_completions", raw) == NormalizedUsage(4508, 4352, 20, 16)

    def test_total_tokens_is_not_trusted(self) -> None:
        # total_tokens is informative only; the billing counts come from their own fields.
        raw = {**DOCS_CHAT_USAGE, "total_tokens": 1}
        assert normalize_usage("chat_completions", raw).prompt_tokens == 4508


class TestStreamFinalUsage:
    def test_chat_completions_final_chunk_usage(self) -> None:
        chunk = {
            "id": "724b7b08675f40d7aa75c80d5fe51cf5",
            "object": "chat.completion.chunk",
            "created": 1790793243,
            "model": "GLM-5.3",
            "choices": [],
            "usage": {
                "prompt_tokens": 11,
                "completion_tokens": 10,
                "total_tokens": 21,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        }
        assert normalize_usage("chat_completions", chunk["usage"]) == NormalizedUsage(11, 0, 10, 0)

    def test_responses_completed_event_usage(self) -> None:
        event = {
            "type": "response.completed",
            "response": {
                "status": "completed",
                "usage": {"input_tokens": 22, "output_tokens": 36, "total_tokens": 58},
            },
        }
        usage = normalize_usage("responses", event["response"]["usage"])  # type: ignore[index]
        assert usage == NormalizedUsage(22, 0, 36, 0)

    def test_messages_message_delta_usage(self) -> None:
        event = {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {
                "input_tokens": 278,
                "output_tokens": 54,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        assert normalize_usage("messages", event["usage"]) == NormalizedUsage(278, 0, 54, 0)


INVALID_COUNTS = [
    pytest.param(-1, id="negative"),
    pytest.param(1.0, id="float-integral"),
    pytest.param(3.5, id="float"),
    pytest.param(Decimal(5), id="decimal"),
    pytest.param("5", id="string"),
    pytest.param(True, id="true"),
    pytest.param(False, id="false"),
    pytest.param(MAX_TOKEN_COUNT + 1, id="above-max"),
    pytest.param(2**63, id="int64-overflow"),
    pytest.param([5], id="list"),
    pytest.param({"value": 5}, id="object"),
]

# Every count of every API, by the path docs/api.md#post-v1usageevents' table gives it.
COUNT_PATHS = [
    ("chat_completions", ("prompt_tokens",)),
    ("chat_completions", ("prompt_tokens_details", "cached_tokens")),
    ("chat_completions", ("completion_tokens",)),
    ("chat_completions", ("completion_tokens_details", "reasoning_tokens")),
    ("responses", ("input_tokens",)),
    ("responses", ("input_tokens_details", "cached_tokens")),
    ("responses", ("output_tokens",)),
    ("responses", ("output_tokens_details", "reasoning_tokens")),
    ("messages", ("input_tokens",)),
    ("messages", ("cache_read_input_tokens",)),
    ("messages", ("output_tokens",)),
]


def with_value(api: str, path: tuple[str, ...], value: object) -> dict[str, Any]:
    raw = usage_object(api, 100, 10, 100, 0 if api == "messages" else 10)
    node = raw
    for name in path[:-1]:
        node = node[name]
    node[path[-1]] = value
    return raw


class TestInvalid:
    @pytest.mark.parametrize("value", INVALID_COUNTS)
    @pytest.mark.parametrize(
        ("api", "path"), COUNT_PATHS, ids=[f"{a}:{'.'.join(p)}" for a, p in COUNT_PATHS]
    )
    def test_bad_count_is_invalid_usage_naming_the_field(
        self, api: str, path: tuple[str, ...], value: object
    ) -> None:
        with pytest.raises(InvalidUsage) as caught:
            normalize_usage(api, with_value(api, path, value))
        assert caught.value.field == ".".join(path)

    @pytest.mark.parametrize("api", ["chat_completions", "responses", "messages"])
    def test_max_token_count_itself_is_accepted(self, api: str) -> None:
        top = MAX_TOKEN_COUNT
        raw = usage_object(api, top, top, top, 0 if api == "messages" else top)
        reasoning = 0 if api == "messages" else top
        assert normalize_usage(api, raw) == NormalizedUsage(top, top, top, reasoning)

    def test_max_token_count_value(self) -> None:
        # The bound keeps every charge component (count × rate) inside a signed 64-bit integer.
        assert MAX_TOKEN_COUNT == 2**31 - 1

    @pytest.mark.parametrize(
        ("api", "raw", "field"),
        [
            (
                "chat_completions",
                {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}},
                "prompt_tokens_details.cached_tokens",
            ),
            (
                "chat_completions",
                {"completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 6}},
                "completion_tokens_details.reasoning_tokens",
            ),
            (
                "chat_completions",
                {"prompt_tokens_details": {"cached_tokens": 1}},
                "prompt_tokens_details.cached_tokens",
            ),
            (
                "responses",
                {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 11}},
                "input_tokens_details.cached_tokens",
            ),
            (
                "responses",
                {"output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 1}},
                "output_tokens_details.reasoning_tokens",
            ),
            # Anthropic-style counting (cache reads outside input_tokens) is invalid here.
            (
                "messages",
                {"input_tokens": 100, "cache_read_input_tokens": 4352},
                "cache_read_input_tokens",
            ),
        ],
    )
    def test_subset_larger_than_its_total(self, api: str, raw: dict[str, Any], field: str) -> None:
        with pytest.raises(InvalidUsage) as caught:
            normalize_usage(api, raw)
        assert caught.value.field == field

    def test_subset_equal_to_its_total_is_valid(self) -> None:
        raw = {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 10},
            "completion_tokens_details": {"reasoning_tokens": 4},
        }
        usage = normalize_usage("chat_completions", raw)
        assert usage == NormalizedUsage(10, 10, 4, 4)
        assert usage.uncached_input_tokens == 0

    @pytest.mark.parametrize(
        "usage",
        [None, [], [4508, 20], "usage", 42, 4.5, True],
        ids=["null", "empty-list", "list", "string", "int", "float", "bool"],
    )
    @pytest.mark.parametrize("api", ["chat_completions", "responses", "messages"])
    def test_usage_that_is_not_an_object(self, api: str, usage: object) -> None:
        with pytest.raises(InvalidUsage):
            normalize_usage(api, usage)

    @pytest.mark.parametrize("detail", [5, "x", [], [{"cached_tokens": 1}], True, 0.0])
    @pytest.mark.parametrize(
        ("api", "name", "field"),
        [
            ("chat_completions", "prompt_tokens_details", "prompt_tokens_details.cached_tokens"),
            (
                "chat_completions",
                "completion_tokens_details",
                "completion_tokens_details.reasoning_tokens",
            ),
            ("responses", "input_tokens_details", "input_tokens_details.cached_tokens"),
            ("responses", "output_tokens_details", "output_tokens_details.reasoning_tokens"),
        ],
    )
    def test_detail_that_is_not_an_object(
        self, api: str, name: str, field: str, detail: object
    ) -> None:
        raw = usage_object(api, 100, 0, 100, 0)
        raw[name] = detail
        with pytest.raises(InvalidUsage) as caught:
            normalize_usage(api, raw)
        assert caught.value.field == field
        assert name in str(caught.value)

    def test_invalid_usage_is_a_value_error(self) -> None:
        # Callers that catch ValueError (e.g. the ingest loop) must see it.
        assert issubclass(InvalidUsage, ValueError)
