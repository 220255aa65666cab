"""Before a request takes a slot: its engine's backend installed and its model's files on disk.

Both are shared: concurrent requests for the same backend or model wait for one install or one
download, and a caller that leaves does not cancel it for the others. A missing backend is
installed on first use, as Lemonade does, never over a working install.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from lemonade.backends.engine import Engine, EngineUnavailable, InstallError, fetch_refusal, install_action
from lemonade.config import Config
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.request_context import load_progress, until_gone_or
from lemonade.runtime.router.state import Options

log = logging.getLogger("lemonade.router")
FilesProvider = Callable[[ModelInfo], Awaitable[Any]]


class Preparation:
    def __init__(self, config: Config, files_for: FilesProvider) -> None:
        self.config = config
        self._files_for = files_for
        self._shared_work: dict[tuple[str, ...], asyncio.Future[Any]] = {}
        self.installing: set[tuple[str, str]] = set()  # (recipe, backend) installs under way

    async def prepare(self, model: ModelInfo, engine: Engine, options: Options) -> None:
        opts = options() if callable(options) else options
        try:
            backend = engine.ready_backend(engine.requested_backend(opts))
            engine.check_model(model, backend)
        except EngineUnavailable as exc:
            raise APIError(400, str(exc), code=exc.code) from None
        if engine.needs_install(backend):
            await self._shared(("install", engine.recipe, backend), lambda: self._install(engine, backend))
        await self._shared(("files", model.name), lambda: self._files_for(model))

    async def _shared(self, key: tuple[str, ...], start: Callable[[], Awaitable[Any]]) -> Any:
        """One run of `start` for every concurrent caller with the same key; a caller that leaves does
        not cancel it for the others."""
        fut = self._shared_work.get(key)
        if fut is None:
            fut = asyncio.ensure_future(start())
            self._shared_work[key] = fut
            fut.add_done_callback(
                lambda f: self._shared_work.pop(key, None) if self._shared_work.get(key) is f else None)
        return await until_gone_or(asyncio.shield(fut))

    async def _install(self, engine: Engine, backend: str) -> None:
        """A backend installed on first use, as Lemonade does; never over a working install."""
        spec = f"{engine.recipe}:{backend}"
        if self.config.get("offline"):
            raise APIError(400, f"The {spec} backend is not installed and the server is offline (offline: true). "
                           f"Connect, then run: {install_action(engine.recipe, backend)}", code="backend_not_installed")
        refusal = fetch_refusal(self.config, engine.recipe, backend)
        if refusal:
            raise APIError(400, refusal, code="backend_not_installed")
        listener = load_progress.get()
        loop = asyncio.get_running_loop()
        last = [0.0]

        def progress(event: dict[str, Any]) -> None:
            now = time.monotonic()
            if now - last[0] > 2.0 or event.get("phase") == "done":
                last[0] = now
                log.info("Installing %s: %s", spec, event.get("message", ""))
            if listener is not None:
                loop.call_soon_threadsafe(listener, {"phase": "install", "backend": spec, **event})

        log.info("Backend %s is not installed; installing it now (first use)", spec)
        self.installing.add((engine.recipe, backend))
        try:
            await asyncio.to_thread(engine.install, backend, progress, False)
        except InstallError as exc:
            raise APIError(500, f"Installing the {spec} backend failed: {exc}\nRetry with: "
                           f"{install_action(engine.recipe, backend)}", type="server_error",
                           code="backend_install_failed") from None
        finally:
            self.installing.discard((engine.recipe, backend))
        log.info("Backend %s installed", spec)
