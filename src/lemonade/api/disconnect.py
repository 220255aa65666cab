"""ASGI middleware that notices a client hanging up while its request waits or runs.

Once the request body has been read, the only message the server can still receive is
`http.disconnect`. This middleware waits for it in the background and sets the request's
`client_gone` event (runtime/request_context.py), so the router drops a request that waits for a
model slot and the proxy cancels a non-streamed engine request. Later `receive()` calls of the
app (Starlette's own disconnect listener for streamed responses) get the same message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from lemonade.runtime.request_context import client_gone

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]


class DisconnectWatch:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        gone = asyncio.Event()
        watcher: asyncio.Task[Message] | None = None

        async def wait_disconnect() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        async def app_receive() -> Message:
            nonlocal watcher
            if watcher is not None:
                return await asyncio.shield(watcher)
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = asyncio.ensure_future(wait_disconnect())
            elif message["type"] == "http.disconnect":
                gone.set()
            return message

        token = client_gone.set(gone)
        try:
            await self.app(scope, app_receive, send)
        finally:
            client_gone.reset(token)
            if watcher is not None and not watcher.done():
                watcher.cancel()
