"""Request schemas of the OpenAI-compatible endpoints.

They validate what we rely on and document the API in /openapi.json; unknown fields are kept
(`extra="allow"`) and passed through, so llama.cpp-specific parameters such as `min_p` or
`grammar` keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Stop = str | list[str]
MAX_TOKENS = 2**31 - 1  # the engines count tokens in 32-bit integers; more would wrap around


class _Passthrough(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Sampling(_Passthrough):
    model: str = Field(..., min_length=1, examples=["Qwen3-0.6B-GGUF"])
    stream: bool = False
    stop: Stop | None = Field(None, description="Up to 4 sequences where generation stops")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    repeat_penalty: float | None = Field(None, ge=0)
    seed: int | None = None

    @model_validator(mode="after")
    def _stop_count(self) -> Sampling:
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("'stop' takes at most 4 sequences")
        return self


class ChatMessage(_Passthrough):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class FunctionDef(_Passthrough):
    name: str = Field(..., min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Passthrough):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=-1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=-1, le=MAX_TOKENS)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


def legacy_max_tokens(payload: dict[str, Any]) -> None:
    """The engine reads `max_tokens`: `max_completion_tokens` is renamed to it, unless the request
    gave both, where `max_tokens` is kept, as Lemonade does (OpenAI's clients send either or both)."""
    if "max_completion_tokens" in payload:
        limit = payload.pop("max_completion_tokens")
        if payload.get("max_tokens") is None:
            payload["max_tokens"] = limit


def thinking_wanted(payload: dict[str, Any]) -> bool | None:
    """The client's thinking intent: Lemonade's top-level `enable_thinking` (it wins), else the
    OpenAI-compatible `thinking` (a boolean, or `{"type": "enabled" | "disabled"}`); None: not said."""
    if isinstance(payload.get("enable_thinking"), bool):
        return payload["enable_thinking"]
    thinking = payload.get("thinking")
    if isinstance(thinking, bool):
        return thinking
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        return thinking["type"] == "enabled"
    return None


def thinking_controls(payload: dict[str, Any]) -> None:
    """Thinking turned off the way every engine and template understands, as Lemonade does for
    clients such as OpenCode that send `thinking: false`: `reasoning_effort: "none"` (llama.cpp's
    per-request switch), the template's `enable_thinking: false`, and `/no_think` in front of the
    last user message (for templates that read only that). The client-facing fields are never
    forwarded: the engine does not know them."""
    wanted = thinking_wanted(payload)
    payload.pop("enable_thinking", None)
    payload.pop("thinking", None)
    if wanted is not False:
        return
    payload["reasoning_effort"] = "none"
    kwargs = payload.setdefault("chat_template_kwargs", {})
    if isinstance(kwargs, dict):
        kwargs["enable_thinking"] = False
    for message in reversed(payload.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            message["content"] = "/no_think\n" + message["content"]
            break


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] = Field(..., examples=["Once upon a time"])
    max_tokens: int | None = Field(None, ge=-1, le=MAX_TOKENS)
    echo: bool | None = None
    logprobs: int | bool | None = None


class EmbeddingRequest(_Passthrough):
    model: str = Field(..., min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"

    @model_validator(mode="after")
    def _not_empty(self) -> EmbeddingRequest:
        if isinstance(self.input, list) and not self.input:
            raise ValueError("'input' must not be an empty list")
        return self


class ResponsesRequest(Sampling):
    input: str | list[dict[str, Any]]
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    instructions: str | None = None
