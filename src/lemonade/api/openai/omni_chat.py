"""`POST /v1/chat/completions` naming a `collection.omni` model (openai.md "Server-side tools").

The loop (`omni/loop.py`) runs here and its outcome takes the Chat Completions shape: one
`chat.completion` whose `content` is the LLM's text followed by the media, or a stream of
`chat.completion.chunk`s in which each medium is a content delta sent the moment its tool finished,
then the LLM's text, the client-tool calls (if any), the finish reason and `[DONE]`. Everything that
can be refused (no LLM in the collection, a `tool_choice` naming a tool not offered, audio that is
not base64) is refused with a 4xx before a stream starts; an error after that is an SSE `error`
event, as for plain chats.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from lemonade.api.openai.protocol import ChatCompletionRequest
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.omni import loop, toolset
from lemonade.runtime.proxy import error_event
from lemonade.runtime.request_context import ClientGone
from lemonade.services import Services

log = logging.getLogger("lemonade.omni")
DELTA_CHARS = 16000  # a data URL is split over several deltas: SSE clients limit line lengths (aiohttp: 128 KiB)


def _message(answer: loop.Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content()}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return message


async def chat(svc: Services, collection: ModelInfo, body: ChatCompletionRequest) -> Response:
    payload = body.model_dump(exclude_unset=True)
    await svc.downloads.ready_collection(collection)
    tools = toolset.build(svc, collection, payload.get("tools"))
    loop.forced_tool(tools, payload.get("tool_choice"))  # a bad tool_choice is a 400 before anything runs
    events = loop.run(svc, tools, payload, loop.prepare(svc, tools, payload))  # so is bad audio
    if body.stream:
        return StreamingResponse(_stream(collection, events, payload), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    answer = None
    async for event in events:
        if isinstance(event, loop.Answer):
            answer = event
    assert answer is not None
    response: dict[str, Any] = {
        "id": answer.id, "object": "chat.completion", "created": answer.created, "model": collection.public,
        "choices": [{"index": 0, "message": _message(answer), "finish_reason": answer.finish_reason}]}
    if answer.usage:
        response["usage"] = answer.usage
    return JSONResponse(response)


async def _stream(collection: ModelInfo, events: AsyncIterator[loop.Media | loop.Answer],
                  payload: dict[str, Any]) -> AsyncIterator[bytes]:
    chunk_id, created = f"chatcmpl-omni-{uuid.uuid4().hex[:24]}", int(time.time())

    def frame(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        chunk = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": collection.public,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def content(text: str) -> list[bytes]:
        return [frame({"content": text[i:i + DELTA_CHARS]}) for i in range(0, len(text), DELTA_CHARS)]

    yield frame({"role": "assistant", "content": ""})
    sent_media = False
    try:
        async for event in events:
            if isinstance(event, loop.Media):
                for piece in content(("\n\n" if sent_media else "") + event.artifact.markdown()):
                    yield piece
                sent_media = True
                continue
            if event.text:
                for piece in content(("\n\n" if sent_media else "") + event.text):
                    yield piece
            if event.tool_calls:
                yield frame({"tool_calls": [{**call, "index": i} for i, call in enumerate(event.tool_calls)]})
            yield frame({}, event.finish_reason)
            if event.usage and (payload.get("stream_options") or {}).get("include_usage"):
                yield b"data: " + json.dumps({"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                                              "model": collection.public, "choices": [],
                                              "usage": event.usage}).encode() + b"\n\n"
    except ClientGone:
        log.info("omni %s: the client went away; the loop stopped", collection.public)
        return
    except APIError as exc:
        log.warning("omni %s: %s", collection.public, exc.message)
        yield error_event(exc)
    yield b"data: [DONE]\n\n"
