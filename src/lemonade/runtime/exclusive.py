"""The router's exclusive gate: while a job with model-touching steps runs, it alone uses models.

Upstream (docs/dev/job-system.md, "Exclusivity and queuing"): a job's `load`/`unload`/`chat` steps
hold the model slot, and every other request that would touch a model (inference, load, unload)
queues behind the job until it ends or pauses. The job's own requests pass: the holder is a
context variable, set in the job's task and inherited by everything it awaits, so they go through
the very same `Router.acquire` path as everyone else's. Closing the gate first drains work
already admitted (in-flight requests, loads under way), so nothing overlaps the job.

Read-only questions (health, model lists, stats) never look at the gate.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable

from lemonade.runtime.request_context import ClientGone, client_gone, until_gone_or

log = logging.getLogger("lemonade.router")
_holder: contextvars.ContextVar[object | None] = contextvars.ContextVar("exclusive_holder", default=None)
DRAIN_POLL_SECONDS = 0.05


class ExclusiveGate:
    def __init__(self) -> None:
        self._holder: object | None = None
        self._opened: asyncio.Future[None] | None = None

    @property
    def held(self) -> bool:
        return self._holder is not None

    def blocks_caller(self) -> bool:
        """True when someone else holds the gate (one attribute read when nobody does)."""
        return self._holder is not None and _holder.get() is not self._holder

    async def _wait_open(self) -> None:
        if self._opened is None or self._opened.done():
            self._opened = asyncio.get_running_loop().create_future()
        await until_gone_or(asyncio.shield(self._opened))

    async def pass_through(self) -> None:
        """Wait while another holder has the gate; a client that leaves meanwhile gets ClientGone."""
        while self.blocks_caller():
            await self._wait_open()

    async def close(self, holder: object, drained: Callable[[], bool]) -> None:
        """Take the gate for `holder` (in the calling task's context) once the work already admitted
        has drained. Cancelling the caller while it drains opens the gate again."""
        while self._holder is not None and self._holder is not holder:
            await self._wait_open()
        self._holder = holder
        _holder.set(holder)
        try:
            while not drained():
                gone = client_gone.get()
                if gone is not None and gone.is_set():
                    raise ClientGone()  # the job was interrupted while it waited
                await asyncio.sleep(DRAIN_POLL_SECONDS)
        except BaseException:
            self.open(holder)
            raise

    def open(self, holder: object) -> None:
        """Release the gate (if `holder` has it): queued requests go on."""
        if self._holder is not holder:
            return
        self._holder = None
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)
        self._opened = None
