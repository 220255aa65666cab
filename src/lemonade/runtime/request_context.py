"""Per-request facts the router needs without every API family passing them along.

- `client_gone`: set by `DisconnectWatch` (api/disconnect.py, run by api/guard.py) when the client hangs up, so a
  request still waiting for a model slot leaves the queue (and causes no load), and a non-streamed
  request is cancelled at the engine.
- `request_trace`: the inference request's span while telemetry or a `/spans/stream` listener is on (None
  otherwise); the proxy reports the engine, the answer and the stream to it.
- `load_progress`: a callback that receives install/download/load progress events for the
  request's load (the `/v1/load` stream sets it; everything else logs progress only).
- `routing_dependency`: True while a routing policy calls one of its helper models (a router LLM,
  a classifier, an embedder) for a `collection.router` request, so the router keeps that model in
  the routing-helper pool instead of a user-facing slot (runtime/router/scheduler.py, "Residency classes").
- `from_peer`: True for a request another server of the LAN forwarded here (api/guard.py checked its
  session): it is served by this server, never forwarded again (backends/peer/peers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from lemonade.observability.spans import InferenceSpan

T = TypeVar("T")


class Departure:
    """Set once, when the client hangs up. Waiting on it takes a callback, not a task: every
    non-streamed request waits on it (issue 17: a task and `asyncio.wait` per request cost more
    than the rest of the wait)."""

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def add(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)


client_gone: ContextVar[Departure | None] = ContextVar("client_gone", default=None)
# The request's span (observability/spans.py), set by api/guard.py for inference requests only while
# tracing is on: every site checks it for None and does nothing else when it is.
request_trace: ContextVar[InferenceSpan | None] = ContextVar("request_trace", default=None)
load_progress: ContextVar[Callable[[dict[str, Any]], None] | None] = ContextVar("load_progress", default=None)
routing_dependency: ContextVar[bool] = ContextVar("routing_dependency", default=False)
from_peer: ContextVar[bool] = ContextVar("from_peer", default=False)


class ClientGone(Exception):
    """The client disconnected while its request waited or ran; nobody is left to answer."""


async def until_gone_or(awaitable: asyncio.Future[Any]) -> Any:
    """Await `awaitable` unless the client leaves first (then ClientGone; the awaitable is left as is)."""
    gone = client_gone.get()
    if gone is None:
        return await awaitable
    if gone.is_set():
        raise ClientGone()
    if not awaitable.done():
        wake = asyncio.get_running_loop().create_future()

        def on_event(*_: Any) -> None:
            if not wake.done():
                wake.set_result(None)

        awaitable.add_done_callback(on_event)
        gone.add(on_event)
        try:
            await wake
        finally:
            awaitable.remove_done_callback(on_event)
            gone.discard(on_event)
    if awaitable.done():
        return awaitable.result()
    raise ClientGone()


async def cancelled_when_gone(work: Awaitable[T]) -> T:
    """Await `work` in the current task; the client leaving cancels it there and raises ClientGone.

    Why not a task of its own plus `until_gone_or`: every non-streamed engine request runs this, and
    a task per request (its creation, scheduling and completion callbacks) was the larger part of
    the wait's cost (issue 17). The departure cancels the request's own task instead; the
    cancellation is taken back (`uncancel`) once it has become ClientGone.
    """
    gone = client_gone.get()
    if gone is None:
        return await work
    if gone.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        raise ClientGone()
    task = asyncio.current_task()
    assert task is not None
    cancelled = False

    def cancel() -> None:
        nonlocal cancelled
        cancelled = True
        task.cancel()

    gone.add(cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if cancelled and task.uncancel() == 0:
            raise ClientGone() from None
        raise
    finally:
        gone.discard(cancel)
