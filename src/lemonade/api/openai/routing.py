"""The HTTP edge of routing: a chat or text completion naming a `collection.router` model is sent to
the member its policy picks (serving/routing.py), then runs like a request naming that member.

The decision is reported as the `x-lemonade-route` header (the rule id, or `default`) on every
answer, errors of the member included, and as `x_lemonade_route` in the body (a stream: in its first
event, the rest of the stream relayed untouched), as Lemonade's server does; `"route_trace": true`
adds the per-condition `trace` to it. The chosen member's known costs are added to the decision's
`outputs` as `estimated_cost` (routing/cost.py; reporting only).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response, StreamingResponse

from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.routing.evaluate import Decision
from lemonade.services import Services
from lemonade.serving.routing import ROUTE_HEADER, is_router
from lemonade.serving.routing import route as choose_member

TRACE_FIELD = "x_lemonade_route"


@dataclass
class Routed:
    """A routed request: the member that answers it and why."""

    member: ModelInfo
    decision: Decision

    def attach(self, response: Response) -> Response:
        """The member's answer with the decision on it."""
        response.headers[ROUTE_HEADER] = self.decision.header
        route = self.decision.to_json()  # its `trace` only when the request asked for it
        if isinstance(response, StreamingResponse):
            # Starlette allows str chunks; the streams routed here relay the engine's bytes.
            response.body_iterator = attach_to_first_event(response.body_iterator, route)  # type: ignore[arg-type]
            return response
        try:
            data = json.loads(bytes(response.body))  # typed bytes | memoryview; bytes() returns our bytes as is
        except ValueError:
            return response
        if isinstance(data, dict):
            data[TRACE_FIELD] = route
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return Response(json.dumps(data), status_code=response.status_code, headers=headers,
                        media_type="application/json")

    def on_error(self, exc: APIError) -> APIError:
        """A member's error keeps the route header, so the client sees which rule sent it there."""
        exc.headers = {**(exc.headers or {}), ROUTE_HEADER: self.decision.header}
        return exc


async def answered(svc: Services, target: ModelInfo, payload: dict[str, Any],
                   answer: Callable[[ModelInfo], Awaitable[Response]]) -> Response:
    """`answer(target)`, or for a router model `answer(member)` with the member its policy picks, the
    decision attached to the answer (and to the member's error)."""
    if not is_router(target):
        return await answer(target)
    routed = Routed(*await choose_member(svc, target, payload))
    try:
        return routed.attach(await answer(routed.member))
    except APIError as exc:
        raise routed.on_error(exc) from None


async def attach_to_first_event(chunks: AsyncIterator[bytes], route: dict[str, Any]) -> AsyncIterator[bytes]:
    """The SSE stream with `x_lemonade_route` added to its first JSON event; only that event is held
    back until complete, everything after it is relayed chunk by chunk as it comes."""
    buffer = b""
    attached = False
    async for chunk in chunks:
        if attached:
            yield chunk
            continue
        buffer += chunk
        while not attached:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            event, buffer = buffer[:end + 2], buffer[end + 2:]
            event, attached = _with_route(event, route)
            yield event
        if attached and buffer:
            yield buffer
            buffer = b""
    if buffer:
        yield buffer if attached else _with_route(buffer, route)[0]


def _with_route(event: bytes, route: dict[str, Any]) -> tuple[bytes, bool]:
    lines = event.split(b"\n")
    data_lines = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    if len(data_lines) != 1:
        return event, False
    i = data_lines[0]
    try:
        data = json.loads(lines[i][5:].strip())
    except ValueError:  # [DONE] or not JSON
        return event, False
    if not isinstance(data, dict):
        return event, False
    data[TRACE_FIELD] = route
    lines[i] = b"data: " + json.dumps(data, separators=(",", ":")).encode()
    return b"\n".join(lines), True
