"""A tool named in `tool_choice` is called, every time.

Why: llama-server reads `tool_choice` as a string. OpenAI's object form (`{"type": "function",
"function": {"name": ...}}`) it takes as "auto" (a warning in its log, nothing to the client), and its
"required" grammar lets any text come before the call, so a small model can talk until `max_tokens`
and never call (Gemma 3 270M did). A named tool is forced here the way a grammar can force it: the
model is asked for that tool's arguments under a JSON-schema grammar (`response_format`; the tool
stays described in the prompt by the chat template), and the answer, or each streamed piece of it,
becomes the call. Used through serving/chat.py by the OpenAI chat route, the Anthropic translation,
MCP's `lemonade_chat` and the omni loop.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from lemonade.errors import APIError


def named_tool(body: dict[str, Any]) -> str | None:
    """The function an OpenAI chat body's `tool_choice` names, or None for a string choice (auto,
    none, required: llama-server's own). A choice naming nothing that `tools` offers is a 400, as
    at OpenAI."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str) or not name:
        raise APIError(400, "Invalid value for 'tool_choice': an object must be {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}, or use \"auto\", \"none\" or \"required\"",
                       code="invalid_argument", extra={"param": "tool_choice"})
    if _tool(body, name) is None:
        offered = ", ".join(repr(n) for n in _names(body)) or "no tools"
        raise APIError(400, f"Invalid value for 'tool_choice': no function named {name!r} is in 'tools' "
                       f"(offered: {offered})", code="invalid_argument", extra={"param": "tool_choice"})
    return name


def forced(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The body to send the engine: `name` the only tool on offer, its arguments asked for under a
    grammar, no `tool_choice` (an object would be read as "auto")."""
    tool = _tool(body, name)
    assert tool is not None, "named_tool() checks the name first"
    schema = (tool.get("function") or {}).get("parameters") or {"type": "object"}
    sent = {k: v for k, v in body.items() if k not in ("tool_choice", "parallel_tool_calls")}
    sent["tools"] = [tool]
    sent["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    return sent


def as_call(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A non-streamed answer to a `forced` body, its content (the arguments) made the call to `name`."""
    choices = data.get("choices") or [{}]
    message = choices[0].get("message") or {}
    content = message.get("content")
    arguments = content if isinstance(content, str) else ""
    call = {"id": _call_id(), "type": "function", "function": {"name": name, "arguments": arguments.strip()}}
    reply: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    if message.get("reasoning_content"):
        reply["reasoning_content"] = message["reasoning_content"]
    finish = choices[0].get("finish_reason")
    return {**data, "choices": [{**choices[0], "message": reply,
                                 "finish_reason": "length" if finish == "length" else "tool_calls"}]}


def as_call_stream(name: str) -> Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]]:
    """A transform of the engine's SSE stream for a `forced` body: content deltas become the call's
    argument deltas, as OpenAI streams a forced call (the call's id, type and name first, then
    `arguments` piece by piece, `finish_reason` "tool_calls"). Other events pass unchanged."""

    async def transform(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        call_id = _call_id()
        opened: set[int] = set()  # choices whose call header was sent
        buffer = b""
        async for chunk in chunks:
            *events, buffer = (buffer + chunk).split(b"\n\n")
            out = b"".join(_event(event, name, call_id, opened) for event in events)
            if out:
                yield out
        if buffer.strip():
            yield _event(buffer, name, call_id, opened)

    return transform


def _event(event: bytes, name: str, call_id: str, opened: set[int]) -> bytes:
    """One SSE event, re-shaped if it is a chat chunk with choices."""
    text = event.strip()
    if not text.startswith(b"data:") or text == b"data: [DONE]":
        return event + b"\n\n"
    try:
        data = json.loads(text[5:])
    except ValueError:
        return event + b"\n\n"
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        return event + b"\n\n"
    for choice in data["choices"]:
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        delta = choice.get("delta") or {}
        piece = delta.pop("content", None)
        call: dict[str, Any] = {"index": 0}
        if index not in opened and (piece or "role" in delta or choice.get("finish_reason")):
            opened.add(index)
            call.update({"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}})
        if piece:
            call.setdefault("function", {})["arguments"] = piece
        if len(call) > 1:
            delta["tool_calls"] = [call]
            if "role" in delta:
                delta["content"] = None
        choice["delta"] = delta
        if choice.get("finish_reason") == "stop":
            choice["finish_reason"] = "tool_calls"
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def _tool(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and tool["function"].get("name") == name:
            return tool
    return None


def _names(body: dict[str, Any]) -> list[str]:
    return [str(t["function"].get("name")) for t in body.get("tools") or []
            if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
