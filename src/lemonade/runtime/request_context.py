"""Per-request facts the router needs without every API family passing them along.

- `client_gone`: set by `DisconnectWatch` (api/disconnect.py, run by api/guard.py) when the client hangs up, so a
  request still waiting for a model slot leaves the queue (and causes no load), and a non-streamed
  request is cancelled at the engine.
- `load_progress`: a callback that receives install/download/load progress events for the
  request's load (the `/v1/load` stream sets it; everything else logs progress only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

client_gone: ContextVar[asyncio.Event | None] = ContextVar("client_gone", default=None)
load_progress: ContextVar[Callable[[dict[str, Any]], None] | None] = ContextVar("load_progress", default=None)


class ClientGone(Exception):
    """The client disconnected while its request waited or ran; nobody is left to answer."""


async def until_gone_or(awaitable: asyncio.Future[Any]) -> Any:
    """Await `awaitable` unless the client leaves first (then ClientGone; the awaitable is left as is)."""
    gone = client_gone.get()
    if gone is None:
        return await awaitable
    if gone.is_set():
        raise ClientGone()
    watcher = asyncio.ensure_future(gone.wait())
    try:
        done, _ = await asyncio.wait({awaitable, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if awaitable in done:
        return awaitable.result()
    raise ClientGone()
