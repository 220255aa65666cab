"""Ollama <-> OpenAI translation: requests to llama-server's OpenAI endpoints, answers back.

Kept free of HTTP and routing so each rule (options, messages, tool calls, durations, NDJSON
streaming) reads on its own. Durations are nanoseconds, as Ollama clients expect; generation
figures come from llama-server's own `timings`, not from wall clocks.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from lemonade.api.errors import APIError
from lemonade.api.ollama.protocol import Format, Message, Options, Think
from lemonade.api.sse import error_message, sse_events

log = logging.getLogger("lemonade.ollama")

# Ollama option -> llama-server (OpenAI-compatible) body field, where the meaning is the same.
SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "repeat_penalty",
                    "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau",
                    "mirostat_eta")
HANDLED_OPTIONS = set(SAMPLING_OPTIONS) | {"num_predict", "num_ctx", "stop"}
IMAGE_SIGNATURES = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
                    (b"RIFF", "image/webp"), (b"BM", "image/bmp"))


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def sampling_params(options: Options | None) -> dict[str, Any]:
    """Ollama `options` as OpenAI/llama-server body fields (num_ctx is a load option, handled apart)."""
    if options is None:
        return {}
    out: dict[str, Any] = {}
    values = options.model_dump(exclude_none=True)
    for key in SAMPLING_OPTIONS:
        if key in values:
            out[key] = values[key]
    if options.num_predict is not None and options.num_predict > 0:
        out["max_tokens"] = options.num_predict  # -1 (no limit) and -2 (fill context) = llama-server's default
    if options.stop is not None:
        out["stop"] = [options.stop] if isinstance(options.stop, str) else list(options.stop)
    ignored = sorted(set(values) - HANDLED_OPTIONS)
    if ignored:
        log.debug("Ignoring Ollama options with no llama-server equivalent: %s", ", ".join(ignored))
    return out


def format_params(fmt: Format) -> dict[str, Any]:
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}}
    return {}


def think_params(think: Think) -> dict[str, Any]:
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"chat_template_kwargs": {"enable_thinking": think}}
    return {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": think}}


def image_part(b64: str, where: str) -> dict[str, Any]:
    """One Ollama base64 image as an OpenAI `image_url` content part (data URI with a sniffed type)."""
    text = b64.split(",", 1)[1] if b64.startswith("data:") else b64
    try:
        head = base64.b64decode(text[:64] + "=" * (-len(text[:64]) % 4), validate=False)
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"Invalid value for '{where}': not valid base64 image data",
                       code="invalid_argument") from None
    mime = next((m for sig, m in IMAGE_SIGNATURES if head.startswith(sig)), "image/png")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{text}"}}


def user_content(text: str, images: list[str] | None, where: str) -> str | list[dict[str, Any]]:
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts += [image_part(img, f"{where}[{i}]") for i, img in enumerate(images)]
    return parts


def openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama chat messages as OpenAI ones. Tool calls get ids; tool results are matched to them by name."""
    out: list[dict[str, Any]] = []
    pending: dict[str, list[str]] = {}  # tool name -> ids of calls not yet answered
    last_ids: list[str] = []
    counter = 0
    for i, msg in enumerate(messages):
        item: dict[str, Any] = {"role": msg.role,
                                "content": user_content(msg.content or "", msg.images, f"messages.{i}.images")}
        if msg.role == "assistant" and msg.tool_calls:
            calls: list[dict[str, Any]] = []
            for call in msg.tool_calls:
                counter += 1
                call_id = call.id or f"call_{counter}"
                args = call.function.arguments
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": call.function.name,
                                           "arguments": args if isinstance(args, str) else json.dumps(args)}})
                pending.setdefault(call.function.name, []).append(call_id)
            item["tool_calls"] = calls
            last_ids = [c["id"] for c in calls]
        if msg.role == "assistant" and msg.thinking:
            item["reasoning_content"] = msg.thinking
        if msg.role == "tool":
            answered = msg.tool_call_id
            if answered is None and msg.tool_name and pending.get(msg.tool_name):
                answered = pending[msg.tool_name].pop(0)
            if answered is None and last_ids:
                answered = last_ids[0]
            if answered is not None:
                item["tool_call_id"] = answered
            if msg.tool_name:
                item["name"] = msg.tool_name
        out.append(item)
    return out


def ollama_tool_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as a JSON string) as Ollama's (arguments as an object)."""
    out = []
    for index, call in enumerate(calls or []):
        fn = call.get("function") or {}
        args: Any = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                log.warning("Tool call %s has arguments that are not JSON; passing {}: %r", fn.get("name"), args)
                args = {}
        if not isinstance(args, dict):
            args = {"value": args}
        entry: dict[str, Any] = {"function": {"index": index, "name": fn.get("name", ""), "arguments": args}}
        if call.get("id"):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def done_reason(finish_reason: str | None) -> str:
    return "length" if finish_reason == "length" else "stop"


class Timer:
    """Wall-clock figures of one request, in nanoseconds."""

    def __init__(self) -> None:
        self.start = time.perf_counter_ns()
        self.load_ns = 0

    def total(self) -> int:
        return time.perf_counter_ns() - self.start


def durations(timer: Timer, data: dict[str, Any] | None) -> dict[str, int]:
    """Ollama's duration and count fields from llama-server's `timings` (and `usage`) of a response."""
    data = data or {}
    timings, usage = data.get("timings"), data.get("usage")
    timings = timings if isinstance(timings, dict) else {}
    usage = usage if isinstance(usage, dict) else {}
    prompt_n = usage.get("prompt_tokens")
    if prompt_n is None:
        prompt_n = (timings.get("prompt_n") or 0) + (timings.get("cache_n") or 0)
    eval_n = timings.get("predicted_n", usage.get("completion_tokens", 0))
    return {
        "total_duration": timer.total(),
        "load_duration": timer.load_ns,
        "prompt_eval_count": int(prompt_n or 0),
        "prompt_eval_duration": int(float(timings.get("prompt_ms") or 0) * 1_000_000),
        "eval_count": int(eval_n or 0),
        "eval_duration": int(float(timings.get("predicted_ms") or 0) * 1_000_000),
    }


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI assistant message as Ollama's."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        out["thinking"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = ollama_tool_calls(message["tool_calls"])
    return out


def chat_response(model_name: str, data: dict[str, Any], timer: Timer) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    return {"model": model_name, "created_at": now_iso(), "message": chat_message(choice.get("message") or {}),
            "done": True, "done_reason": done_reason(choice.get("finish_reason")), **durations(timer, data)}


def generate_response(model_name: str, data: dict[str, Any], timer: Timer, chat: bool) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    out: dict[str, Any] = {"model": model_name, "created_at": now_iso()}
    if chat:
        message = choice.get("message") or {}
        out["response"] = message.get("content") or ""
        if message.get("reasoning_content"):
            out["thinking"] = message["reasoning_content"]
    else:
        out["response"] = choice.get("text") or ""
    out.update({"done": True, "done_reason": done_reason(choice.get("finish_reason")), **durations(timer, data)})
    return out


def ndjson_line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


async def ndjson_stream(source: AsyncIterator[bytes], model_name: str, timer: Timer, kind: str) -> AsyncIterator[bytes]:
    """llama-server's SSE stream as Ollama NDJSON, one line per delta, then the `done` line.

    `kind` is "chat" (Ollama /api/chat from chat completions), "generate-chat" (/api/generate
    from chat completions) or "generate-raw" (/api/generate from text completions). Tool calls
    arrive in fragments; Ollama clients expect whole calls, so they are sent once complete.
    """
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    last: dict[str, Any] = {}
    chat = kind == "chat"
    try:
        async for event in sse_events(source):
            message = error_message(event)
            if message is not None:
                yield ndjson_line({"error": message})
                return
            data = event.data if isinstance(event.data, dict) else {}
            if "timings" in data or "usage" in data:
                last = {**last, **{k: data[k] for k in ("timings", "usage") if data.get(k) is not None}}
            for choice in (data.get("choices") or [])[:1]:
                if kind == "generate-raw":
                    text, thinking = choice.get("text") or "", ""
                else:
                    delta = choice.get("delta") or {}
                    text, thinking = delta.get("content") or "", delta.get("reasoning_content") or ""
                    for frag in delta.get("tool_calls") or []:
                        slot = calls.setdefault(int(frag.get("index", len(calls))),
                                                {"id": None, "function": {"name": "", "arguments": ""}})
                        slot["id"] = frag.get("id") or slot["id"]
                        fn = frag.get("function") or {}
                        slot["function"]["name"] += fn.get("name") or ""
                        slot["function"]["arguments"] += fn.get("arguments") or ""
                if text or thinking:
                    chunk: dict[str, Any] = {"model": model_name, "created_at": now_iso()}
                    if chat:
                        chunk["message"] = {"role": "assistant", "content": text}
                        if thinking:
                            chunk["message"]["thinking"] = thinking
                    else:
                        chunk["response"] = text
                        if thinking:
                            chunk["thinking"] = thinking
                    chunk["done"] = False
                    yield ndjson_line(chunk)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
    if finish is None:
        yield ndjson_line({"error": "The engine ended the stream before the answer was complete"})
        return
    if calls and chat:
        ordered = [calls[i] for i in sorted(calls)]
        yield ndjson_line({"model": model_name, "created_at": now_iso(),
                     "message": {"role": "assistant", "content": "", "tool_calls": ollama_tool_calls(ordered)},
                     "done": False})
    final: dict[str, Any] = {"model": model_name, "created_at": now_iso()}
    if chat:
        final["message"] = {"role": "assistant", "content": ""}
    else:
        final["response"] = ""
    final.update({"done": True, "done_reason": done_reason(finish), **durations(timer, last)})
    yield ndjson_line(final)
