"""The HTTP response of what the proxy relays (runtime/proxy.py `Relay`): the runtime hands over plain
values, and this is the one place that makes them a Starlette response, for every API family.

The relay's `after` runs as the response's background task: once the answer has been sent, and also
when the client left before the end of a stream (Starlette runs it however the response ends), so a
stream always gives its model and KV room back and a whole answer is counted after the client has it.
"""

from __future__ import annotations

from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from lemonade.runtime.proxy import Relay


def response(relay: Relay, headers: dict[str, str] | None = None) -> Response:
    """`relay` as a response, with `headers` besides its own (an API family's warnings, say)."""
    background = BackgroundTask(relay.after) if relay.after is not None else None
    all_headers = {**relay.headers, **(headers or {})}
    if isinstance(relay.body, bytes):
        return Response(relay.body, media_type=relay.media_type, headers=all_headers or None, background=background)
    return StreamingResponse(relay.body, media_type=relay.media_type, headers=all_headers or None,
                             background=background)
