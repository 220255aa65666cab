"""Residency: which models are loaded, loading on demand, LRU eviction, pinning, crash recovery.

Rules (Lemonade's multi-model behaviour):
- per-type limit `max_loaded_models` (-1 = unlimited); the least recently used unpinned model of
  the same type is evicted to make room; if every slot of the type is pinned → 409;
- a model that is serving requests is not stopped until they finish, and once chosen for
  eviction it no longer takes new requests (they load it again instead);
- loads are serialized; concurrent requests for the same unloaded model share one load;
- an engine that dies is noticed, reported in health, and started again by the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemonade.api.errors import APIError
from lemonade.backends.base import BackendStartError, WrappedServer, free_port
from lemonade.backends.llamacpp import build_argv, resolved_ctx_size
from lemonade.catalog.labels import MODEL_TYPES
from lemonade.catalog.models import ModelInfo

log = logging.getLogger("lemonade.router")


@dataclass
class LoadedModel:
    model: ModelInfo
    server: WrappedServer
    options: dict[str, Any]
    backend: str
    pinned: bool = False
    last_use: float = field(default_factory=time.time)
    active: int = 0
    streaming: int = 0
    retiring: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def describe(self) -> dict[str, Any]:
        return {
            "model_name": self.model.name,
            "checkpoint": self.model.checkpoint,
            "last_use": self.last_use,
            "type": self.model.type,
            "device": "cpu",
            "pinned": self.pinned,
            "is_busy": self.active > 0,
            "is_streaming": self.streaming > 0,
            "recipe": self.model.recipe,
            "pid": self.server.pid,
            "recipe_options": self.options,
            "backend_url": self.server.base_url + "/v1",
            "backend": self.backend,
        }


Options = dict[str, Any] | Callable[[], dict[str, Any]]  # a callable is only evaluated when a load happens
FilesProvider = Callable[[ModelInfo], Awaitable[dict[str, list[Path]]]]
BinaryProvider = Callable[[str], tuple[str, Path]]  # requested backend -> (backend used, binary)


class Router:
    def __init__(self, *, max_models: Callable[[], int], files_for: FilesProvider,
                 binary_for: BinaryProvider, on_change: Callable[[], None] | None = None) -> None:
        self._max_models = max_models
        self._files_for = files_for
        self._binary_for = binary_for
        self._on_change = on_change or (lambda: None)
        self.loaded: dict[str, LoadedModel] = {}
        self.crashed: dict[str, dict[str, Any]] = {}
        self.last_used_name: str | None = None
        self._load_lock = asyncio.Lock()
        self._pending: dict[str, asyncio.Future[LoadedModel]] = {}
        self._retiring: list[LoadedModel] = []  # taken out of service, waiting for requests to finish

    # ----- queries -----------------------------------------------------------------------------
    def limit(self) -> int:
        return self._max_models()

    def describe(self) -> list[dict[str, Any]]:
        return [lm.describe() for lm in sorted(self.loaded.values(), key=lambda m: m.last_use, reverse=True)]

    def pinned_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(MODEL_TYPES, 0)
        for lm in self.loaded.values():
            if lm.pinned:
                counts[lm.model.type] = counts.get(lm.model.type, 0) + 1
        return counts

    def most_recent(self) -> LoadedModel | None:
        live = [lm for lm in self.loaded.values() if not lm.retiring]
        return max(live, key=lambda m: m.last_use) if live else None

    # ----- loading -----------------------------------------------------------------------------
    async def ensure_loaded(self, model: ModelInfo, options: Options, *, pinned: bool | None = None,
                            reload: bool = False) -> LoadedModel:
        """Loaded model handle; loads (once, shared by concurrent callers) when needed."""
        current = self.loaded.get(model.name)
        if current is not None and not current.retiring and current.server.alive and not reload:
            if pinned is not None:
                current.pinned = pinned
            return current
        pending = self._pending.get(model.name)
        if pending is None or reload:
            pending = asyncio.ensure_future(self._load(model, options, pinned, reload))
            self._pending[model.name] = pending
            pending.add_done_callback(lambda t, n=model.name: self._pending.pop(n, None)
                                      if self._pending.get(n) is t else None)
        # shield: a caller that goes away does not cancel a load other callers wait for
        return await asyncio.shield(pending)

    async def _load(self, model: ModelInfo, options: Options, pinned: bool | None,
                    reload: bool) -> LoadedModel:
        if model.recipe != "llamacpp":  # refused before anything is downloaded
            raise APIError(400, f"Model {model.name} uses recipe '{model.recipe}', whose engine is not available "
                           "in this server yet. Only llamacpp models can be loaded.", code="model_load_refused")
        # Outside the load lock: a download for this model must not hold up loads of other models.
        files = await self._files_for(model)
        async with self._load_lock:
            current = self.loaded.get(model.name)
            if current is not None and current.server.alive and not current.retiring and not reload:
                return current
            if current is not None:
                pinned = current.pinned if pinned is None else pinned
                await self._retire(current)
            await self._make_room(model)
            lm = await self._start(model, files, options() if callable(options) else options, bool(pinned))
            self.loaded[model.name] = lm
            self.crashed.pop(model.name, None)
            self.last_used_name = model.name
            self._on_change()
            return lm

    async def _start(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     pinned: bool) -> LoadedModel:
        backend, binary = self._binary_for(options.get("llamacpp_backend", "cpu"))
        port = free_port()
        argv = build_argv(binary, model, files, options, port)
        server = WrappedServer(f"llama-server:{model.name}", argv, port)
        resolved = dict(options)
        if resolved.get("ctx_size") == -1:
            resolved["resolved_ctx_size"] = resolved_ctx_size(-1, files["main"][0])
        lm = LoadedModel(model=model, server=server, options=resolved, backend=backend, pinned=pinned)
        server.on_exit = lambda srv, code, lm=lm: self._crashed(lm, code)
        log.info("Loading %s (%s, backend %s)", model.name, model.type, backend)
        started = time.perf_counter()
        try:
            await server.start()
        except BackendStartError as exc:
            raise APIError(500, f"Failed to load {model.name}: {exc}", type="server_error",
                           code="model_load_error") from None
        log.info("Loaded %s in %.2fs (pid %s)", model.name, time.perf_counter() - started, server.pid)
        return lm

    def _crashed(self, lm: LoadedModel, code: int) -> None:
        if self.loaded.get(lm.name) is lm:
            del self.loaded[lm.name]
            self.crashed[lm.name] = {"model_name": lm.name, "pid": lm.server.pid, "exit_code": code,
                                     "time": time.time(),
                                     "message": f"llama-server for {lm.name} exited with code {code}; it is "
                                                "started again on the next request"}
            self._on_change()

    async def confirm_crash(self, lm: LoadedModel, wait: float = 2.0) -> bool:
        """After a failed connection: True (and the model forgotten) when its process has exited."""
        proc = lm.server.proc
        if proc is None:
            return False
        try:
            code = await asyncio.wait_for(proc.wait(), wait)
        except TimeoutError:
            return False
        self._crashed(lm, code)
        return True

    async def _make_room(self, model: ModelInfo) -> None:
        limit = self.limit()
        if limit == -1:
            return
        while True:
            same = [lm for lm in self.loaded.values() if lm.model.type == model.type and lm.name != model.name
                    and not lm.retiring]
            if len(same) < limit:
                return
            candidates = [lm for lm in same if not lm.pinned]
            if not candidates:
                raise APIError(409, f"Cannot load {model.name}: all {limit} {model.type} slot(s) are held by pinned "
                               f"models ({', '.join(lm.name for lm in same)}). Unload one, or raise "
                               "max_loaded_models.", type="conflict", code="slots_pinned_error")
            victim = min(candidates, key=lambda lm: lm.last_use)
            log.info("Evicting %s (least recently used %s) to make room for %s", victim.name, model.type,
                     model.name)
            await self._retire(victim)

    async def _retire(self, lm: LoadedModel) -> None:
        """Stop taking requests for `lm`, let in-flight ones finish, then stop the process."""
        lm.retiring = True
        if self.loaded.get(lm.name) is lm:
            del self.loaded[lm.name]
            self._on_change()
        self._retiring.append(lm)
        try:
            await lm.idle.wait()
            await lm.server.stop()
        finally:
            self._retiring.remove(lm)

    # ----- use ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, model: ModelInfo, options: Options) -> AsyncIterator[LoadedModel]:
        """Hold a loaded model for one request; it cannot be stopped until the block exits."""
        while True:
            lm = await self.ensure_loaded(model, options)
            if not lm.retiring and lm.server.alive:
                break
        lm.active += 1
        lm.idle.clear()
        lm.last_use = time.time()
        self.last_used_name = lm.name
        try:
            yield lm
        finally:
            lm.active -= 1
            lm.last_use = time.time()
            if lm.active == 0:
                lm.idle.set()

    @contextlib.asynccontextmanager
    async def hold(self, lm: LoadedModel) -> AsyncIterator[LoadedModel]:
        """Like `use` for a model already picked (e.g. the most recently used one)."""
        if lm.retiring or not lm.server.alive:
            raise APIError(404, f"Model {lm.name} was unloaded while the request waited for it")
        lm.active += 1
        lm.idle.clear()
        lm.last_use = time.time()
        try:
            yield lm
        finally:
            lm.active -= 1
            if lm.active == 0:
                lm.idle.set()

    # ----- unloading ---------------------------------------------------------------------------
    async def unload(self, name: str | None = None) -> list[str]:
        async with self._load_lock:
            targets = [self.loaded[name]] if name is not None and name in self.loaded else \
                list(self.loaded.values()) if name is None else []
            for lm in targets:
                await self._retire(lm)
            return [lm.name for lm in targets]

    async def unload_where(self, predicate: Callable[[LoadedModel], bool]) -> list[str]:
        async with self._load_lock:
            targets = [lm for lm in self.loaded.values() if predicate(lm)]
            for lm in targets:
                await self._retire(lm)
            return [lm.name for lm in targets]

    async def shutdown(self) -> None:
        for lm in list(self.loaded.values()) + list(self._retiring):
            lm.retiring = True
            await lm.server.stop(grace=3.0)
        self.loaded.clear()

    def kill_all_now(self) -> None:
        for lm in list(self.loaded.values()) + list(self._retiring):
            lm.server.kill_now()
