"""A model for the LiteLLM proxy of tests/gateway/test_litellm_proxy.py (loaded by LiteLLM from
its config, in .venv-gateway): a stream whose provider reports usage on every chunk and goes away
after three, before its final chunk — a stream that failed after it started."""

from collections.abc import AsyncIterator
from typing import Any

from litellm import CustomLLM

WORDS = ("Hel", "lo ", "wor")
PROMPT_TOKENS = 7


class BrokenStream(CustomLLM):
    async def astreaming(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        for index, word in enumerate(WORDS):
            yield {
                "text": word,
                "tool_use": None,
                "is_finished": False,
                "finish_reason": "",
                "index": 0,
                "usage": {
                    "prompt_tokens": PROMPT_TOKENS,
                    "completion_tokens": index + 1,
                    "total_tokens": PROMPT_TOKENS + index + 1,
                },
            }
        raise ConnectionError("the model's server went away mid-stream")


handler = BrokenStream()
