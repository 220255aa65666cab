"""Anthropic Messages <-> OpenAI chat completions.

Requests become llama-server chat completions (system -> system message, `tool_use` blocks ->
assistant `tool_calls`, `tool_result` blocks -> `tool` messages, images -> `image_url` parts);
answers become Anthropic messages, and a streamed answer becomes Anthropic's event sequence:
message_start, (content_block_start, content_block_delta*, content_block_stop)*, message_delta
(stop_reason, usage), message_stop. Whatever cannot be honoured is dropped and named in
`Translation.warnings`, which the route returns in a header and logs.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from lemonade.api.anthropic.protocol import SUPPORTED_FIELDS, CountTokensRequest, MessagesRequest
from lemonade.api.errors import APIError
from lemonade.api.sse import COMMENT, SSEEvent, error_message, sse_events
from lemonade.util import jsonparse

log = logging.getLogger("lemonade.anthropic")

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
# Block types that are accepted but carry nothing a local model can use.
IGNORED_BLOCKS = {"redacted_thinking", "document", "search_result", "server_tool_use", "web_search_tool_result",
                  "web_fetch_tool_result", "code_execution_tool_result", "container_upload", "mcp_tool_use",
                  "mcp_tool_result"}


def bad(where: str, message: str) -> APIError:
    return APIError(400, f"{where}: {message}", code="invalid_argument")


@dataclass
class Translation:
    """An OpenAI chat body plus what had to be ignored on the way."""

    body: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    stop_sequences: list[str] = field(default_factory=list)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{where}.text", "Field required (a string)")
    return text


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise bad(f"{where}.source", "Field required (an object with 'type' base64 or url)")
    kind = source.get("type")
    if kind == "base64":
        media = source.get("media_type")
        if media not in IMAGE_TYPES:
            raise bad(f"{where}.source.media_type", f"must be one of {', '.join(IMAGE_TYPES)}, got {media!r}")
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise bad(f"{where}.source.data", "Field required (base64 image data)")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise bad(f"{where}.source.url", "Field required (a string)")
        return {"type": "image_url", "image_url": {"url": url}}
    raise bad(f"{where}.source.type", f"must be 'base64' or 'url', got {kind!r}")


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string (every chat template reads that); images keep the parts form."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_result(block: dict[str, Any], where: str, tr: Translation) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise bad(f"{where}.tool_use_id", "Field required (the id of the tool_use block it answers)")
    raw = block.get("content", "")
    parts: list[dict[str, Any]] = []
    if isinstance(raw, str):
        parts.append({"type": "text", "text": raw})
    elif isinstance(raw, list):
        for j, item in enumerate(raw):
            if not isinstance(item, dict):
                raise bad(f"{where}.content.{j}", "must be an object")
            kind = item.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": _text_of(item, f"{where}.content.{j}")})
            elif kind == "image":
                parts.append(_image_part(item, f"{where}.content.{j}"))
            else:
                tr.warn(f"Ignored unsupported block type in tool_result content: {kind}")
    else:
        raise bad(f"{where}.content", "must be a string or an array of content blocks")
    if block.get("is_error"):
        parts.insert(0, {"type": "text", "text": "[tool error]"})
    content = _content(parts) if parts else ""
    return {"role": "tool", "tool_call_id": tool_use_id, "content": content}


def _message(msg: Any, i: int, tr: Translation) -> list[dict[str, Any]]:
    """One Anthropic message as one or more OpenAI messages (tool results become `tool` messages)."""
    where = f"messages.{i}.content"
    if isinstance(msg.content, str):
        return [{"role": msg.role, "content": msg.content}]
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    tool_results: list[dict[str, Any]] = []
    thinking: list[str] = []
    for j, block in enumerate(msg.content):
        here = f"{where}.{j}"
        kind = block.get("type")
        if "cache_control" in block:
            tr.warn("Ignored cache_control (llama.cpp reuses its prompt cache automatically)")
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, here)})
        elif kind == "image":
            parts.append(_image_part(block, here))
        elif kind == "tool_use":
            if msg.role != "assistant":
                raise bad(f"{here}.type", "tool_use blocks belong in assistant messages")
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not name:
                raise bad(f"{here}.name", "Field required (a string)")
            if not isinstance(call_id, str) or not call_id:
                raise bad(f"{here}.id", "Field required (a string)")
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise bad(f"{here}.input", "must be an object")
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": json.dumps(args)}})
        elif kind == "tool_result":
            if msg.role != "user":
                raise bad(f"{here}.type", "tool_result blocks belong in user messages")
            tool_results.append(_tool_result(block, here, tr))
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif kind in IGNORED_BLOCKS:
            tr.warn(f"Ignored unsupported content block type: {kind}")
        else:
            tr.warn(f"Ignored unknown content block type: {kind}")
    out: list[dict[str, Any]] = list(tool_results)
    if msg.role == "assistant":
        if parts or tool_calls or thinking:
            item: dict[str, Any] = {"role": "assistant", "content": _content(parts) if parts else ""}
            if tool_calls:
                item["tool_calls"] = tool_calls
            if thinking:
                item["reasoning_content"] = "\n".join(thinking)
            out.append(item)
    elif parts or not tool_results:
        out.append({"role": "user", "content": _content(parts) if parts else ""})
    return out


def _system(system: Any, tr: Translation) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    texts = []
    for j, block in enumerate(system):
        if block.get("type") == "text":
            texts.append(_text_of(block, f"system.{j}"))
            if "cache_control" in block:
                tr.warn("Ignored cache_control (llama.cpp reuses its prompt cache automatically)")
        else:
            tr.warn(f"Ignored unsupported system block type: {block.get('type')}")
    return "\n".join(texts)


def _tools(tools: list[dict[str, Any]], tr: Translation) -> list[dict[str, Any]]:
    out = []
    for j, tool in enumerate(tools):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            tr.warn(f"Ignored server tool '{tool.get('name', kind)}' of type {kind} (only custom tools are supported)")
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"tools.{j}.name", "Field required (a string)")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad(f"tools.{j}.input_schema", "Field required (a JSON Schema object)")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        if "cache_control" in tool:
            tr.warn("Ignored cache_control (llama.cpp reuses its prompt cache automatically)")
        out.append({"type": "function", "function": fn})
    return out


def to_openai(req: CountTokensRequest, model_name: str) -> Translation:
    """Translate a validated request; raises a 400 naming the field for malformed content."""
    tr = Translation(body={"model": model_name})
    for key in sorted(set(req.model_extra or {}) - SUPPORTED_FIELDS):
        tr.warn(f"Ignored unsupported field '{key}'")
    messages: list[dict[str, Any]] = []
    system = _system(req.system, tr)
    if system:
        messages.append({"role": "system", "content": system})
    for i, msg in enumerate(req.messages):
        messages.extend(_message(msg, i, tr))
    tr.body["messages"] = messages
    if req.tools:
        tools = _tools(req.tools, tr)
        if tools:
            tr.body["tools"] = tools
    if req.tool_choice is not None:
        choice = req.tool_choice
        if "tools" not in tr.body and choice.type != "none":
            tr.warn("Ignored tool_choice: no tools were given")
        elif choice.type == "tool":
            # OpenAI's named choice, forced by runtime/forced_call.py (llama-server would read it as "auto");
            # the tool alone on offer, so that count_tokens counts the prompt that is sent.
            named = [t for t in tr.body.get("tools", []) if t["function"]["name"] == choice.name]
            if not named:
                raise bad("tool_choice.name", f"no tool named {choice.name!r} in 'tools'")
            tr.body["tools"] = named
            tr.body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            tr.body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use and "tools" in tr.body:
            tr.body["parallel_tool_calls"] = False
    if req.thinking is not None:
        if req.thinking.type == "enabled":
            tr.body["chat_template_kwargs"] = {"enable_thinking": True}
            if req.thinking.budget_tokens:
                tr.body["thinking_budget_tokens"] = req.thinking.budget_tokens
        elif req.thinking.type == "disabled":
            tr.body["chat_template_kwargs"] = {"enable_thinking": False}
    if isinstance(req, MessagesRequest):
        tr.body["max_tokens"] = req.max_tokens
        for key in ("temperature", "top_p", "top_k"):
            value = getattr(req, key)
            if value is not None:
                tr.body[key] = value
        if req.output_config:
            _output_config(req.output_config, tr)
        if req.stop_sequences:
            tr.stop_sequences = list(req.stop_sequences)
            tr.body["stop"] = tr.stop_sequences
            tr.body["verbose"] = True  # llama-server then says which stop word ended the answer
    return tr


def _output_config(config: dict[str, Any], tr: Translation) -> None:
    """Structured output: `output_config.format` of type json_schema becomes a response_format."""
    for key in sorted(set(config) - {"format"}):
        tr.warn(f"Ignored unsupported field 'output_config.{key}'")
    fmt = config.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad("output_config.format.type", "must be 'json_schema'")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise bad("output_config.format.schema", "Field required (a JSON Schema object)")
    tr.body["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}


# ----- answers ------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def tool_input(arguments: Any, name: str) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = jsonparse.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        log.warning("Tool call %s has arguments that are not JSON: %r", name, arguments)
        return {}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def stop_reason(finish_reason: str | None, verbose: dict[str, Any] | None, stop_sequences: list[str],
                has_tool_use: bool) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for an OpenAI finish_reason."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "tool_calls" or has_tool_use:
        return "tool_use", None
    word = (verbose or {}).get("stopping_word") or None
    if word and (word in stop_sequences or not stop_sequences):
        return "stop_sequence", word
    return "end_turn", None


def usage(data: dict[str, Any] | None) -> dict[str, int]:
    raw = (data or {}).get("usage") or {}
    cached = int(((raw.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    prompt = int(raw.get("prompt_tokens") or 0)
    return {"input_tokens": max(prompt - cached, 0), "output_tokens": int(raw.get("completion_tokens") or 0),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def to_anthropic(data: dict[str, Any], model: str, tr: Translation) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": call.get("id") or new_id("toolu"), "name": fn.get("name", ""),
                       "input": tool_input(fn.get("arguments"), fn.get("name", ""))})
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    reason, sequence = stop_reason(choice.get("finish_reason"), data.get("__verbose"), tr.stop_sequences,
                                   any(b["type"] == "tool_use" for b in blocks))
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(data)}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n".encode()


PING = _sse("ping", {})


class EventWriter:
    """Turns OpenAI stream deltas into Anthropic events, one content block open at a time.

    A tool call arrives from llama-server in fragments (id and name first, then pieces of the
    arguments). It is held until it is complete (the next call, text, or the end), then sent as one
    `tool_use` block: its start names the tool, its `input_json_delta`s are the engine's argument
    pieces in order, which concatenate to the call's JSON object (`{}` for a call without arguments,
    the non-streamed answer's input when the engine's text is not a whole object).
    Holding it means a block is never started without its name or left for text in between.
    """

    def __init__(self, model: str, tr: Translation) -> None:
        self.model = model
        self.tr = tr
        self.index = -1
        self.open: str | None = None          # "thinking", "text" or "tool:<n>"
        self.tool_blocks: dict[int, int] = {}  # OpenAI tool call index -> block index (sent calls)
        self.pending: dict[int, dict[str, Any]] = {}  # calls being received: id, name, argument pieces
        self.finish: str | None = None
        self.verbose: dict[str, Any] | None = None
        self.last: dict[str, Any] = {}

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": new_id("msg"), "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return _sse("message_start", {"message": message})

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_sse("content_block_stop", {"index": self.index})]

    def _open(self, key: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open = key
        return out + [_sse("content_block_start", {"index": self.index, "content_block": block})]

    def feed(self, data: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(data.get("__verbose"), dict):
            self.verbose = data["__verbose"]
        for key in ("usage", "timings"):
            if data.get(key) is not None:
                self.last[key] = data[key]
        for choice in (data.get("choices") or [])[:1]:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content") or delta.get("content"):
                out += self._flush_tools()
            if delta.get("reasoning_content"):
                if self.open != "thinking":
                    out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(_sse("content_block_delta", {"index": self.index, "delta": {
                    "type": "thinking_delta", "thinking": delta["reasoning_content"]}}))
            if delta.get("content"):
                if self.open != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(_sse("content_block_delta", {"index": self.index, "delta": {
                    "type": "text_delta", "text": delta["content"]}}))
            for frag in delta.get("tool_calls") or []:
                n = int(frag.get("index", len(self.tool_blocks) + len(self.pending)))
                if n not in self.pending:
                    out += self._flush_tools()  # calls come one after another: the previous one is complete
                call = self.pending.setdefault(n, {"id": None, "name": "", "args": []})
                fn = frag.get("function") or {}
                call["id"] = call["id"] or frag.get("id")
                call["name"] += fn.get("name") or ""
                if fn.get("arguments"):
                    call["args"].append(fn["arguments"])
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def _flush_tools(self) -> list[bytes]:
        out: list[bytes] = []
        for n in sorted(self.pending):
            call = self.pending[n]
            out += self._open(f"tool:{n}", {"type": "tool_use", "id": call["id"] or new_id("toolu"),
                                            "name": call["name"], "input": {}})
            self.tool_blocks[n] = self.index
            text = "".join(call["args"])
            try:
                whole = isinstance(jsonparse.loads(text), dict)
            except ValueError:
                whole = False
            # The engine's pieces when they add up to an object; else (cut off by max_tokens, no
            # arguments) the input the non-streamed answer would carry, in one piece.
            pieces = call["args"] if whole else [json.dumps(tool_input(text, call["name"]), ensure_ascii=False)]
            for piece in pieces:
                out.append(_sse("content_block_delta", {"index": self.index, "delta": {
                    "type": "input_json_delta", "partial_json": piece}}))
            out += self._close()
        self.pending.clear()
        return out

    def end(self) -> list[bytes]:
        out = self._flush_tools() + self._close()
        if self.index < 0:  # nothing was generated: still one (empty) text block, as Anthropic sends
            out += self._open("text", {"type": "text", "text": ""}) + self._close()
        reason, sequence = stop_reason(self.finish, self.verbose, self.tr.stop_sequences, bool(self.tool_blocks))
        out.append(_sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                          "usage": usage(self.last)}))
        out.append(_sse("message_stop", {}))
        return out


def error_event(message: str, kind: str = "api_error") -> bytes:
    return _sse("error", {"error": {"type": kind, "message": message}})


# An in-band error's OpenAI type -> Anthropic's, so a stream's error is typed as the same error
# answered unstreamed would be (a prompt longer than the context is the client's: invalid_request_error).
_STREAM_ERROR_TYPES = {"invalid_request_error": "invalid_request_error", "authentication_error": "authentication_error",
                       "permission_error": "permission_error", "not_found": "not_found_error",
                       "rate_limit_error": "rate_limit_error"}


def stream_error_type(event: SSEEvent) -> str:
    err = event.data.get("error") if isinstance(event.data, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    return _STREAM_ERROR_TYPES.get(kind, "api_error") if isinstance(kind, str) else "api_error"


async def anthropic_stream(source: AsyncIterator[bytes], model: str, tr: Translation) -> AsyncIterator[bytes]:
    """The event sequence of the module's docstring; a keep-alive of the proxy while the engine reads
    a long prompt becomes Anthropic's `ping` event (which its clients skip), after message_start."""
    writer = EventWriter(model, tr)
    yield writer.start()
    try:
        async for event in sse_events(source, comments=True):
            if event.name == COMMENT:
                yield PING
                continue
            message = error_message(event)
            if message is not None:
                yield error_event(message, stream_error_type(event))
                return
            if isinstance(event.data, dict):
                for chunk in writer.feed(event.data):
                    yield chunk
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
    if writer.finish is None:
        yield error_event("The engine ended the stream before the answer was complete")
        return
    for chunk in writer.end():
        yield chunk
