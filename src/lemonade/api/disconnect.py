"""Noticing a client that hangs up while its request waits or runs.

Once the request body has been read, the only message the server can still receive is
`http.disconnect`. `DisconnectWatch` waits for it in the background and sets the request's
`client_gone` event (runtime/request_context.py), so the router drops a request that waits for a
model slot and the proxy cancels a non-streamed engine request. Later `receive()` calls of the
app (Starlette's own disconnect listener for streamed responses) get the same message.
api/guard.py uses it for every POST.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from lemonade.runtime.request_context import Departure

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]


class DisconnectWatch:
    """The `receive` an app gets for one request, watching for the client leaving."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.gone = Departure()
        self._watcher: asyncio.Future[Message] | None = None

    async def _wait_disconnect(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.gone.set()
        return message

    async def receive(self) -> Message:
        if self._watcher is not None:
            return await asyncio.shield(self._watcher)
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self._watcher = asyncio.ensure_future(self._wait_disconnect())
        elif message["type"] == "http.disconnect":
            self.gone.set()
        return message

    def close(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
