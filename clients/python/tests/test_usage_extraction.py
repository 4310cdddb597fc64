"""The usage to send, from the OpenAI and Anthropic SDKs' own objects, their JSON, and raw
server-sent events; a stream without final usage is reported (``MissingUsage``), never zero.

The transcripts are the reference API docs' examples."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message, RawMessageDeltaEvent, RawMessageStartEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from metering_client import MissingUsage, UsageCollector, usage_from_response, usage_from_stream

CHAT_USAGE = {
    "prompt_tokens": 4508,
    "completion_tokens": 20,
    "total_tokens": 4528,
    "prompt_tokens_details": {"cached_tokens": 4352},
    "completion_tokens_details": {"reasoning_tokens": 16},
}


def chat_completion(usage: dict | None = CHAT_USAGE) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1790793243,
        "model": "GLM-5.3",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "51"},
            }
        ],
        "usage": usage,
    }


def chunk(content: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if usage else [{"index": 0, "delta": {"content": content}}]
    return {
        "id": "724b7b08",
        "object": "chat.completion.chunk",
        "created": 1790793243,
        "model": "GLM-5.3",
        "choices": choices,
        "usage": usage,
    }


STREAM_USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 10,
    "total_tokens": 21,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0},
}
MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_b9f3",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "GLM-5.3",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    },
}
MESSAGE_DELTA = {
    "type": "message_delta",
    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
    "usage": {
        "input_tokens": 278,
        "output_tokens": 54,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    },
}


class TestWholeResponses:
    def test_openai_sdk_chat_completion(self) -> None:
        response = ChatCompletion.model_validate(chat_completion())
        usage = usage_from_response(response, "chat_completions")
        assert usage["prompt_tokens"] == 4508
        assert usage["completion_tokens"] == 20
        assert usage["prompt_tokens_details"]["cached_tokens"] == 4352
        assert usage["completion_tokens_details"]["reasoning_tokens"] == 16
        json.dumps(usage)  # ready for the wire

    def test_its_json(self) -> None:
        assert usage_from_response(chat_completion(), "chat_completions") == CHAT_USAGE

    def test_anthropic_sdk_message(self) -> None:
        message = Message.model_validate(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "GLM-5.3",
                "content": [{"type": "text", "text": "Hi"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 2095, "output_tokens": 503,
                          "cache_read_input_tokens": 1024},
            }
        )  # fmt: skip
        usage = usage_from_response(message, "messages")
        assert (usage["input_tokens"], usage["output_tokens"]) == (2095, 503)
        assert usage["cache_read_input_tokens"] == 1024

    def test_responses_json(self) -> None:
        response = {"object": "response", "usage": {"input_tokens": 336, "output_tokens": 17}}
        assert usage_from_response(response, "responses")["output_tokens"] == 17

    @pytest.mark.parametrize(
        "usage", [None, {"prompt_tokens": 3}, {"prompt_tokens": "3", "completion_tokens": 1}]
    )
    def test_no_usage_is_reported_never_zero(self, usage: dict | None) -> None:
        with pytest.raises(MissingUsage):
            usage_from_response(chat_completion(usage), "chat_completions")

    def test_an_unknown_api_is_a_programming_error(self) -> None:
        with pytest.raises(ValueError):
            usage_from_response(chat_completion(), "embeddings")  # type: ignore[arg-type]


class TestStreams:
    def test_openai_sdk_chunks_final_usage_chunk(self) -> None:
        chunks = [
            ChatCompletionChunk.model_validate(c)
            for c in (chunk("1"), chunk(", 2"), chunk(usage=STREAM_USAGE))
        ]
        assert usage_from_stream(chunks, "chat_completions") == STREAM_USAGE

    def test_a_stream_without_its_usage_chunk_is_reported(self) -> None:
        chunks = [ChatCompletionChunk.model_validate(chunk(str(i))) for i in range(5)]
        with pytest.raises(MissingUsage) as raised:
            usage_from_stream(chunks, "chat_completions")
        assert "5 stream items" in str(raised.value)

    def test_raw_server_sent_events(self) -> None:
        text = "".join(
            f"data: {json.dumps(c)}\n\n" for c in (chunk("a"), chunk(usage=STREAM_USAGE))
        )
        assert usage_from_stream([text.encode(), b"data: [DONE]\n\n"], "chat_completions") == (
            STREAM_USAGE
        )

    def test_a_provider_that_reports_usage_on_every_chunk_gives_the_last(self) -> None:
        partial = {**STREAM_USAGE, "completion_tokens": 4, "total_tokens": 15}
        collector = UsageCollector("chat_completions")
        collector.add(chunk(usage=partial))
        assert collector.usage()["completion_tokens"] == 4
        collector.add(chunk(usage=STREAM_USAGE))
        assert collector.usage()["completion_tokens"] == 10

    def test_anthropic_sdk_events_message_delta_completes_message_start(self) -> None:
        events = [
            RawMessageStartEvent.model_validate(MESSAGE_START),
            RawMessageDeltaEvent.model_validate(MESSAGE_DELTA),
        ]
        usage = usage_from_stream(events, "messages")
        assert (usage["input_tokens"], usage["output_tokens"]) == (278, 54)

    def test_anthropic_s_own_delta_carries_output_only(self) -> None:
        start = json.loads(json.dumps(MESSAGE_START))
        start["message"]["usage"]["input_tokens"] = 25
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                 "usage": {"output_tokens": 15}}  # fmt: skip
        usage = usage_from_stream([start, delta], "messages")
        assert (usage["input_tokens"], usage["output_tokens"]) == (25, 15)

    def test_message_start_alone_is_not_usage(self) -> None:
        with pytest.raises(MissingUsage):
            usage_from_stream([MESSAGE_START], "messages")

    def test_responses_completed_event(self) -> None:
        events = [
            {"type": "response.created", "response": {"usage": {"input_tokens": 0,
                                                                "output_tokens": 0}}},
            {"type": "response.output_text.delta", "delta": "Four"},
            {"type": "response.completed", "response": {"usage": {"input_tokens": 22,
                                                                  "output_tokens": 36}}},
        ]  # fmt: skip
        assert usage_from_stream(events, "responses") == {"input_tokens": 22, "output_tokens": 36}
        with pytest.raises(MissingUsage):
            usage_from_stream(events[:2], "responses")
