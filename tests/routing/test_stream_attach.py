"""`x_lemonade_route` goes into the first JSON event of a stream, however the bytes are cut, and
every other byte of the stream is relayed as it came."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from lemonade.api.openai.routing import attach_to_first_event

ROUTE = {"route_to": "big", "matched_rule": "r"}
EVENTS = [b'data: {"id":"1","choices":[{"delta":{"role":"assistant"}}]}\n\n',
          b'data: {"id":"1","choices":[{"delta":{"content":"Hi"}}]}\n\n', b"data: [DONE]\n\n"]


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _run(parts: list[bytes]) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [c async for c in attach_to_first_event(_chunks(parts), ROUTE)]
    return asyncio.run(collect())


def _cut(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 7, 50, 10_000])
def test_first_event_carries_the_route_whatever_the_chunking(size: int) -> None:
    out = b"".join(_run(_cut(b"".join(EVENTS), size)))
    events = out.split(b"\n\n")
    first = json.loads(events[0].removeprefix(b"data: "))
    assert first["x_lemonade_route"] == ROUTE and first["choices"][0]["delta"] == {"role": "assistant"}
    assert b"\n\n".join(events[1:]) == b"".join(EVENTS[1:])  # the rest untouched


def test_named_and_non_json_events_before_the_first_json_one() -> None:
    parts = [b": keep-alive\n\n", b"event: error\ndata: {\"error\": {\"message\": \"x\"}}\n\n", EVENTS[2]]
    out = b"".join(_run(parts))
    assert out.startswith(b": keep-alive\n\nevent: error\ndata: ")
    assert b'"x_lemonade_route"' in out and out.endswith(b"data: [DONE]\n\n")


def test_after_the_first_event_chunks_pass_as_they_come() -> None:
    parts = [EVENTS[0] + EVENTS[1][:10], EVENTS[1][10:], EVENTS[2]]
    out = _run(parts)
    assert out[-2:] == parts[1:]  # not re-cut: relayed chunk for chunk
