"""Request schema of Anthropic's Messages API (the parts that are checked before translation).

Content blocks stay plain dicts here: the translator walks them, so that an unknown block type can
be ignored with a warning (as the spec asks) while a known block with a bad field still gets a
400 naming the exact place (`messages.2.content.0.source.data`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lemonade.api.openai.protocol import MAX_TOKENS

# Fields translated to the engine; any other top-level field is ignored with a warning.
SUPPORTED_FIELDS = {"model", "max_tokens", "messages", "system", "temperature", "top_p", "top_k",
                    "stop_sequences", "stream", "tools", "tool_choice", "thinking", "output_config"}


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs the tool's 'name'")
        return self


class Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(..., min_length=1, examples=["Qwen3-0.6B-GGUF"])
    messages: list[MessageParam] = Field(..., min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(..., ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    output_config: dict[str, Any] | None = Field(None, description="Only 'format' (json_schema) is honoured")
