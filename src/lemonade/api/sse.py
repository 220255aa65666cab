"""Server-Sent Events: reading an engine's stream as parsed JSON events, and our own progress streams.

The Ollama and Anthropic surfaces re-shape llama-server's OpenAI-style SSE stream into their own
wire formats. They need the events one by one, as soon as each arrives, whatever the chunking of
the underlying bytes (an event may be split across chunks, or several may share one).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from lemonade.api.errors import APIError
from lemonade.runtime.request_context import load_progress

log = logging.getLogger("lemonade.proxy")


@dataclass
class SSEEvent:
    """One event: its `event:` name (None for plain data events) and its JSON `data:`."""

    name: str | None
    data: Any


# The name of the event `sse_events` makes of a comment line, when asked: the proxy's keep-alive while
# the engine reads a long prompt (runtime/keepalive.py), which a translator passes on in its own terms.
COMMENT = ":"


async def sse_events(chunks: AsyncIterator[bytes], comments: bool = False) -> AsyncIterator[SSEEvent]:
    """Parse SSE bytes into events; `data: [DONE]` ends the stream. Non-JSON data is skipped, and so
    are comment lines unless `comments` (then each is an event named COMMENT, without data)."""
    buffer = b""
    name: str | None = None
    data_lines: list[bytes] = []

    def take() -> SSEEvent | None:
        nonlocal name, data_lines
        event_name, payload = name, b"\n".join(data_lines)
        name, data_lines = None, []
        if not payload:
            return None
        if payload.strip() == b"[DONE]":
            return SSEEvent("done", None)
        try:
            return SSEEvent(event_name, json.loads(payload))
        except ValueError:
            log.debug("Skipping a non-JSON SSE event: %r", payload[:200])
            return None

    async for chunk in chunks:
        buffer += chunk
        while True:
            newline = buffer.find(b"\n")
            if newline < 0:
                break
            line, buffer = buffer[:newline].rstrip(b"\r"), buffer[newline + 1:]
            if not line:
                event = take()
                if event is not None:
                    if event.name == "done":
                        return
                    yield event
            elif line.startswith(b"data:"):
                data_lines.append(line[5:].lstrip(b" "))
            elif line.startswith(b"event:"):
                name = line[6:].strip().decode(errors="replace")
            elif comments and line.startswith(b":"):
                yield SSEEvent(COMMENT, None)
            # other fields (id, retry) are irrelevant here
    if buffer.strip().startswith(b"data:"):
        data_lines.append(buffer.strip()[5:].lstrip(b" "))
    event = take()
    if event is not None and event.name != "done":
        yield event


async def drop_null_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The engine's SSE bytes without `data: null` events, re-cut at event boundaries.

    Why: llama-server opens a streamed completion of several prompts with `data: null`, which is no
    OpenAI chunk (clients fail on it). Only those requests go through here, so single-prompt streams
    keep their byte-for-byte relay.
    """
    buffer = b""
    async for chunk in chunks:
        *events, buffer = (buffer + chunk).split(b"\n\n")
        kept = b"".join(event + b"\n\n" for event in events if event.strip() != b"data: null")
        if kept:
            yield kept
    if buffer.strip() and buffer.strip() != b"data: null":
        yield buffer


def error_message(event: SSEEvent) -> str | None:
    """The message of an error event (our proxy's `event: error`, or an engine's `{"error": ...}`)."""
    data = event.data
    if event.name != "error" and not (isinstance(data, dict) and "error" in data and "choices" not in data):
        return None
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def sse_event(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def progress_stream(run: Callable[[], Awaitable[dict[str, Any]]],
                    complete: Callable[[dict[str, Any]], dict[str, Any]]) -> StreamingResponse:
    """Run `run()` with `load_progress` pointed at this response: `progress` events while it works,
    then `complete` (its result through `complete`) or `error` ({"status", "error", "code"})."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def work() -> None:
        load_progress.set(lambda event: queue.put_nowait(sse_event("progress", event)))
        try:
            result = await run()
            await queue.put(sse_event("complete", complete(result)))
        except APIError as exc:
            await queue.put(sse_event("error", {"status": "error", "error": exc.message, "code": exc.code}))
        except Exception as exc:  # reported to the client, which is waiting for an outcome
            log.exception("Streamed operation failed")
            await queue.put(sse_event("error", {"status": "error", "error": f"{type(exc).__name__}: {exc}"}))
        finally:
            await queue.put(None)

    task = asyncio.ensure_future(work())  # runs in a copy of this context: load_progress stays its own

    async def events() -> AsyncIterator[bytes]:
        # The work goes on if the client leaves (an install or a load is the machine's, not the request's).
        while (item := await queue.get()) is not None:
            yield item
        await task

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
