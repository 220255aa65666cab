"""Request schemas of the Ollama API (github.com/ollama/ollama/blob/main/docs/api.md).

They validate what we translate (a bad value answers 400 naming the field); unknown fields are
ignored, as Ollama itself ignores them. `model` accepts Ollama's `name:latest` spelling; the routes
strip the default tag when resolving.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lemonade.api.openai.protocol import MAX_TOKENS, Tool

KeepAlive = int | float | str | None
Format = Literal["", "json"] | dict[str, Any] | None
Think = bool | Literal["low", "medium", "high"] | None


class Options(BaseModel):
    """Ollama's runtime `options`. Ones llama-server has no equivalent for are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    typical_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    num_predict: int | None = Field(None, ge=-2, le=MAX_TOKENS, description="-1 = no limit, -2 = fill the context")
    num_ctx: int | None = Field(None, ge=1, description="Context size to load the model with, when this "
                                                       "request loads it")
    stop: str | list[str] | None = None
    repeat_penalty: float | None = Field(None, ge=0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    mirostat: Literal[0, 1, 2] | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(..., min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    function: ToolCallFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = Field(None, description="Base64-encoded images")
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: str | None = None


class _ModelRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(..., min_length=1, examples=["Qwen3-0.6B-GGUF"])


class ChatRequest(_ModelRequest):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None
    format: Format = None
    options: Options | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Think = None


class GenerateRequest(_ModelRequest):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None
    format: Format = None
    options: Options | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Think = None
    # image generation models
    width: int | None = Field(None, ge=64, le=4096)
    height: int | None = Field(None, ge=64, le=4096)
    steps: int | None = Field(None, ge=1, le=500)


class EmbedRequest(_ModelRequest):
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(_ModelRequest):
    prompt: str
    options: Options | None = None
    keep_alive: KeepAlive = None


class NamedRequest(BaseModel):
    """Requests that name a model as `model` or (older clients) `name`."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _one_name(self) -> NamedRequest:
        if not (self.model or self.name):
            raise ValueError("Missing required field 'model'")
        return self

    @property
    def target(self) -> str:
        return self.model or self.name or ""


class ShowRequest(NamedRequest):
    verbose: bool = False


class PullRequest(NamedRequest):
    insecure: bool = False
    stream: bool = True


