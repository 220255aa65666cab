"""Residency: which models are loaded, for every engine alike.

Rules (Lemonade's multi-model behaviour, guide-configuration-multi-model.md):
- a limit per model type (`max_loaded_models`: one number for every type, or a map per type);
  the least recently used unpinned model of the type is evicted to make room; when every slot
  of the type is pinned the load fails with 409 `slots_pinned_error`;
- a model serving requests is never stopped under them: an eviction waits for it to go idle;
- concurrent requests for an unloaded model share one load; a missing backend is installed and
  missing files are downloaded first (shared too), before the request takes a slot;
- an engine that dies is reported in health and started again by the next request; one that is
  busy but makes no progress (hung, stopped) is killed by a watchdog and reported the same way;
- idle models are trimmed (`downsize_idle_timeout`) and unloaded (`evict_idle_timeout`) when
  `auto_evict` is on for them; pinned models never are;
- memory pressure: while a loaded model has `auto_evict` on, device memory use is sampled every
  `PRESSURE_SAMPLE_SECONDS` (GPU memory, else RAM: lemonade.system.devices.memory_use); at or above
  `auto_evict_threshold_pct` the most disposable idle, unpinned such model (highest eviction
  score) is unloaded, one per sample, so the next sample sees what that freed.

Swapping under contention (two models, one slot) is a queue, not a free-for-all: requests that
need a slot wait in one FIFO queue; a resident model first serves the requests waiting for it
(at most `swap_batch` once another model waits, so none starves), then goes idle and yields its
slot to the model of the oldest waiting request. A request that waits is admitted only when its
model is loaded, so it is never evicted from under itself and never loads a model twice; a
request whose client left leaves the queue and causes no load. More than `max_queue_depth`
waiting requests → 503 with Retry-After.

Residency classes (the guide's "Router and Classifier Dependencies", Lemonade's router): every live
process is either `standard` (a user-facing model, counted under `max_loaded_models` by type) or a
`routing_helper` (a model a registered routing policy calls to choose a candidate: its router LLM,
classifiers, embedders). Helpers are counted per distinct model, so they never take or evict a
standard slot, and several of one type stay warm together; a model has one process whatever its
class. Residency follows the current use of the process: a standard model that a policy calls is
promoted in place, a helper called directly by a user is demoted in place, after the standard pool
makes room for it (its least recently used unpinned model leaves; 409 `slots_pinned_error` when
every one is pinned). Pins count per pool (`pinned_counts`, `pinned_helper_counts`); the implicit
"most recent model" prefers a standard one; a helper no registered policy calls any more is unloaded
(`prune_helpers`) unless pinned. Cloud models take neither pool (`slot_pool: unmetered`).
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

import psutil

from lemonade.backends.base import BackendStartError
from lemonade.backends.engine import Engine, EngineUnavailable, InstallError, Launch, fetch_refusal, install_action
from lemonade.backends.registry import Engines
from lemonade.config import Config
from lemonade.errors import APIError
from lemonade.labels import MODEL_TYPES
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_client import EngineClient
from lemonade.runtime.exclusive import ExclusiveGate
from lemonade.runtime.kv_pool import KvPool
from lemonade.runtime.options import RESIDENCY_OPTIONS
from lemonade.runtime.request_context import ClientGone, load_progress, routing_dependency, until_gone_or
from lemonade.system.devices import MemoryUse, memory_use
from lemonade.util.ports import free_port

log = logging.getLogger("lemonade.router")

Options = dict[str, Any] | Callable[[], dict[str, Any]]  # a callable is only evaluated when a load happens
FilesProvider = Callable[[ModelInfo], Awaitable[dict[str, list[Path]]]]
HOUSEKEEPING_SECONDS = 1.0
PRESSURE_SAMPLE_SECONDS = 5.0  # memory use is read this often while some model may be pressure-evicted
STANDARD, HELPER = "standard", "routing_helper"  # residency classes (module docstring)


@dataclass
class LoadedModel:
    model: ModelInfo
    engine: Engine
    launch: Launch
    pinned: bool = False
    last_use: float = field(default_factory=time.time)
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    active: int = 0
    streaming: int = 0
    served: int = 0  # requests admitted since it was loaded
    retiring: bool = False  # taken out of service: being unloaded
    draining: bool = False  # yields its slot: admits no new requests
    downsized: bool = False
    last_progress: float = field(default_factory=time.monotonic)  # last byte relayed from the engine
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    kv: KvPool | None = None  # the engine's shared KV cache, when its slots share one (runtime/kv_pool.py)
    residency: str = STANDARD  # STANDARD or HELPER: which slot pool the process counts in
    _cpu_seen: float = -1.0
    _cpu_changed_at: float = field(default_factory=time.monotonic)
    _ps: psutil.Process | None = None  # the engine process, for the watchdog

    def __post_init__(self) -> None:
        self.idle.set()
        if self.kv is None and self.launch.shared_kv:
            self.kv = KvPool(*self.launch.shared_kv)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def server(self) -> Any:
        return self.launch.server

    @property
    def options(self) -> dict[str, Any]:
        return self.launch.options

    @property
    def backend(self) -> str:
        return self.launch.backend

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def context_length(self) -> int | None:
        """Tokens one request may use: the running engine's own figure where it reports one, else the
        context it was started with; None when neither is known (an engine without a context)."""
        if self.launch.context_length:
            return self.launch.context_length
        ctx = self.options.get("ctx_size")
        return ctx if isinstance(ctx, int) and ctx > 0 else None

    @property
    def usable(self) -> bool:
        return not self.retiring and self.server.alive

    @property
    def slot_pool(self) -> str:
        """The pool the process counts in: `<class>/<type>`, or `unmetered` for a cloud model."""
        return "unmetered" if self.engine.remote else f"{self.residency}/{self.model.type}"

    def in_standard_pool(self, model_type: str) -> bool:
        return self.model.type == model_type and self.residency == STANDARD and not self.engine.remote

    def describe(self) -> dict[str, Any]:
        return {
            "model_name": self.model.public,
            "checkpoint": self.model.checkpoint,
            "last_use": self.last_use,
            "type": self.model.type,
            "device": self.launch.device,
            "pinned": self.pinned,
            "status": "in_use" if self.active > 0 else "downsized" if self.downsized else "ready",
            "residency_class": self.residency,
            "slot_pool": self.slot_pool,
            "is_busy": self.active > 0,
            "is_streaming": self.streaming > 0,
            "recipe": self.model.recipe,
            "pid": self.server.pid,
            "recipe_options": {k: v for k, v in self.options.items() if k not in RESIDENCY_OPTIONS},
            "backend_url": self.server.base_url + "/v1",
            "backend": self.backend,
            "launch_command": self.engine.launch_command(self.launch),
            "load_seconds": round(self.load_seconds, 3),
            "downsized": self.downsized,
            **({"context_length": self.context_length} if self.context_length is not None else {}),
            **({"kv_cache": self.kv.describe()} if self.kv is not None else {}),
        }


@dataclass
class Waiter:
    model: ModelInfo
    options: Options
    pinned: bool | None
    future: asyncio.Future[LoadedModel]
    helper: bool = False  # a routing policy's call: loads into the routing-helper pool
    since: float = field(default_factory=time.monotonic)


@dataclass
class QueueStats:
    waits: int = 0  # requests that had to wait for a slot
    wait_seconds: float = 0.0
    loads: int = 0
    evictions: int = 0  # unloads to make room for another model
    idle_evictions: int = 0
    downsizes: int = 0
    rejected: int = 0  # 503: queue full
    abandoned: int = 0  # clients that left while waiting
    watchdog_kills: int = 0
    pressure_samples: int = 0  # device memory readings taken for pressure eviction
    pressure_evictions: int = 0  # unloads because memory use passed auto_evict_threshold_pct


class Router:
    def __init__(self, *, engines: Engines, config: Config, files_for: FilesProvider,
                 client: EngineClient | None = None, on_change: Callable[[], None] | None = None,
                 memory: Callable[[], MemoryUse] = memory_use) -> None:
        self.engines = engines
        self._memory = memory  # the live device memory reading (lemonade.system.devices)
        self._sampled_at = 0.0  # monotonic time of the last pressure reading
        self.last_memory: MemoryUse | None = None
        self.config = config
        self._files_for = files_for
        self._client = client  # to local engines, for downsizing
        self._on_change = on_change or (lambda: None)
        self.loaded: dict[str, LoadedModel] = {}
        self.crashed: dict[str, dict[str, Any]] = {}
        self.stats = QueueStats()
        self._queue: list[Waiter] = []
        self._loading: dict[str, str] = {}  # model name -> its type: loads under way, each holding a slot
        self._retiring: list[LoadedModel] = []  # leaving; still hold their slot until stopped
        self._prepares: dict[tuple[str, ...], asyncio.Future[Any]] = {}  # shared installs and downloads
        self._installing: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._housekeeper: asyncio.Task[None] | None = None
        self._closed = False
        self.gate = ExclusiveGate()  # a running job's hold on every model (runtime/exclusive.py)
        # Names of the models registered routing policies call (Services sets it): only those become helpers.
        self.needed_helpers: Callable[[], set[str]] = set

    # ----- queries -----------------------------------------------------------------------------
    def limit_for(self, model_type: str) -> int:
        value = self.config.get("max_loaded_models")
        if isinstance(value, dict):
            return int(value.get(model_type, 1))
        return int(value)

    def limits(self) -> dict[str, int]:
        return {t: self.limit_for(t) for t in MODEL_TYPES}

    def describe(self) -> list[dict[str, Any]]:
        return [lm.describe() for lm in sorted(self.loaded.values(), key=lambda m: m.last_use, reverse=True)]

    def pinned_counts(self, residency: str = STANDARD) -> dict[str, int]:
        """Pinned models by type in one residency class (`pinned_models` of health: the standard pool)."""
        counts = dict.fromkeys(MODEL_TYPES, 0)
        for lm in self.loaded.values():
            if lm.pinned and lm.residency == residency:
                counts[lm.model.type] = counts.get(lm.model.type, 0) + 1
        return counts

    def pinned_helper_counts(self) -> dict[str, int]:
        return self.pinned_counts(HELPER)

    def most_recent(self, recipe: str | None = None) -> LoadedModel | None:
        """The most recently used live model (of `recipe`): a standard one if there is any, so a helper
        that just chose a candidate never becomes the implicit user-facing model."""
        live = [lm for lm in self.loaded.values() if lm.usable and (recipe is None or lm.model.recipe == recipe)]
        pool = [lm for lm in live if lm.residency == STANDARD] or live
        return max(pool, key=lambda m: m.last_use) if pool else None

    def queue_info(self) -> dict[str, Any]:
        waiting: dict[str, int] = {}
        for w in self._queue:
            waiting[w.model.name] = waiting.get(w.model.name, 0) + 1
        s = self.stats
        return {"depth": len(self._queue), "max_depth": self.config.get("max_queue_depth"), "waiting": waiting,
                "loading": sorted(self._loading), "installing": [f"{r}:{b}" for r, b in sorted(self._installing)],
                "waits_total": s.waits, "wait_seconds_total": round(s.wait_seconds, 3), "loads_total": s.loads,
                "swaps_total": s.evictions, "idle_evictions_total": s.idle_evictions,
                "downsizes_total": s.downsizes, "rejected_total": s.rejected, "abandoned_total": s.abandoned,
                "watchdog_kills_total": s.watchdog_kills, "pressure_samples_total": s.pressure_samples,
                "pressure_evictions_total": s.pressure_evictions}

    def engine_for(self, model: ModelInfo) -> Engine:
        engine = self.engines.get(model.recipe)
        if engine is None or not engine.available:
            raise APIError(400, f"Model {model.public} uses recipe '{model.recipe}', whose engine is not available in "
                           "this server yet.", code="model_load_refused")
        return engine

    # ----- acquiring a model for one request ---------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, model: ModelInfo, options: Options) -> AsyncIterator[LoadedModel]:
        """Hold a loaded model for one request; it cannot be stopped until the block exits."""
        lm = await self.acquire(model, options)
        try:
            yield lm
        finally:
            self.release(lm)

    async def acquire(self, model: ModelInfo, options: Options, pinned: bool | None = None) -> LoadedModel:
        """A loaded model, taken for one request (`release` gives it back)."""
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        lm = self.loaded.get(model.name)
        helper = self._as_helper(model, lm)
        if lm is not None and lm.usable and self._admits(lm, extra=True, helper=helper):
            self._settle(lm, helper)
            self._take(lm, pinned)
            return lm
        return await self._acquire_waiting(model, options, pinned, helper)

    def _as_helper(self, model: ModelInfo, lm: LoadedModel | None) -> bool:
        """Is this request a routing dependency that keeps (or puts) the model in the helper pool? Only
        for a model a registered policy calls, or one already a helper: a policy's stale copy never
        turns a user's standard model into a helper."""
        if not routing_dependency.get():
            return False
        return (lm is not None and lm.residency == HELPER) or model.name in self.needed_helpers()

    def _settle(self, lm: LoadedModel, helper: bool) -> None:
        """Move a live process to the pool of its current use (promotion or demotion in place). A
        demotion is admitted into the standard pool first: its least recently used unpinned model of
        the type leaves (409 when every one is pinned, and nothing changes)."""
        want = HELPER if helper else STANDARD
        if lm.residency == want or lm.engine.remote:
            return
        if want == STANDARD:
            self._admit_standard(lm)
        log.info("%s moves from the %s pool to the %s pool (same process, pid %s)", lm.name, lm.residency, want,
                 lm.server.pid)
        lm.residency = want
        self._on_change()

    def _admit_standard(self, lm: LoadedModel) -> None:
        mtype = lm.model.type
        limit = self.limit_for(mtype)
        if limit == -1:
            return
        others = [x for x in self.loaded.values() if x is not lm and x.usable and x.in_standard_pool(mtype)]
        while len(others) >= limit:
            movable = [x for x in others if not x.pinned]
            if not movable:
                raise APIError(409, f"Cannot use {lm.model.public} directly: all {limit} {mtype} slot(s) are held by "
                               f"pinned models ({', '.join(x.model.public for x in others)}). Unload one, or raise "
                               "max_loaded_models.", type="conflict", code="slots_pinned_error")
            victim = min(movable, key=lambda x: x.last_use)
            others.remove(victim)
            log.info("Evicting %s (least recently used %s) to make room for %s, a routing helper now used directly",
                     victim.name, mtype, lm.name)
            self.stats.evictions += 1
            self._take_out_of_service(victim)
            self._spawn(self._finish_retiring(victim))

    def prune_helpers(self) -> list[str]:
        """Unload the routing helpers no registered policy calls any more (its router model deleted or
        changed); a pinned helper stays, a pin outranks policy churn. A busy one finishes first."""
        helpers = [lm for lm in self.loaded.values() if lm.residency == HELPER and not lm.pinned and lm.usable]
        if not helpers:
            return []
        needed = self.needed_helpers()
        stale = [lm for lm in helpers if lm.name not in needed]
        for lm in stale:
            log.info("Unloading routing helper %s: no registered routing policy calls it any more", lm.name)
            self._take_out_of_service(lm)
            self._spawn(self._finish_retiring(lm))
        return [lm.name for lm in stale]

    async def _acquire_waiting(self, model: ModelInfo, options: Options, pinned: bool | None,
                               helper: bool = False) -> LoadedModel:
        """`acquire` for a model that is not resident (or not admitting now): install, download, queue, load."""
        self._start_housekeeping()
        engine = self.engine_for(model)
        await self._prepare(model, engine, options)
        if len(self._queue) >= self.config.get("max_queue_depth"):
            self.stats.rejected += 1
            raise APIError(503, f"The server is busy: {len(self._queue)} requests are already waiting for a model "
                           "slot. Retry shortly, or raise max_loaded_models so fewer models have to take turns.",
                           code="queue_full", headers={"Retry-After": "5"})
        waiter = Waiter(model, options, pinned, asyncio.get_running_loop().create_future(), helper)
        self._queue.append(waiter)
        self.stats.waits += 1
        self._dispatch()
        try:
            return await until_gone_or(waiter.future)
        except (ClientGone, asyncio.CancelledError):
            self.stats.abandoned += 1
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.release(waiter.future.result())  # admitted just as the client left
            else:
                waiter.future.cancel()
            self._drop(waiter)
            raise
        finally:
            self.stats.wait_seconds += time.monotonic() - waiter.since

    def release(self, lm: LoadedModel) -> None:
        lm.active -= 1
        lm.last_use = time.time()
        if lm.active == 0:
            lm.idle.set()
            if self._queue:
                self._dispatch()

    def drained(self) -> bool:
        """Nothing admitted is still running: no request in flight, none waiting, no load under way
        (what an exclusive job waits for before it starts, runtime/exclusive.py)."""
        return not self._queue and not self._loading and all(lm.active == 0 for lm in self.loaded.values())

    def _take(self, lm: LoadedModel, pinned: bool | None = None) -> None:
        lm.active += 1
        lm.served += 1
        lm.idle.clear()
        lm.last_use = time.time()
        lm.downsized = False
        if pinned is not None:
            lm.pinned = pinned

    @contextlib.asynccontextmanager
    async def hold(self, lm: LoadedModel) -> AsyncIterator[LoadedModel]:
        """Like `use` for a model already picked (e.g. the most recently used one)."""
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        if not lm.usable:
            raise APIError(404, f"Model {lm.model.public} was unloaded while the request waited for it")
        self._take(lm)
        try:
            yield lm
        finally:
            self.release(lm)

    async def ensure_loaded(self, model: ModelInfo, options: Options, *, pinned: bool | None = None,
                            reload: bool = False) -> LoadedModel:
        """Load (or keep) `model` without holding it: `/v1/load`, Ollama keep-alive and the like."""
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        current = self.loaded.get(model.name)
        if reload and current is not None:
            pinned = current.pinned if pinned is None else pinned
            await self._retire(current)
        lm = await self.acquire(model, options, pinned)
        self.release(lm)
        return lm

    # ----- preparing: backend install and model files, before a slot is taken ------------------
    async def _prepare(self, model: ModelInfo, engine: Engine, options: Options) -> None:
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
        fut = self._prepares.get(key)
        if fut is None:
            fut = asyncio.ensure_future(start())
            self._prepares[key] = fut
            fut.add_done_callback(lambda f, k=key: self._prepares.pop(k, None) if self._prepares.get(k) is f else None)
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
        self._installing.add((engine.recipe, backend))
        try:
            await asyncio.to_thread(engine.install, backend, progress, False)
        except InstallError as exc:
            raise APIError(500, f"Installing the {spec} backend failed: {exc}\nRetry with: "
                           f"{install_action(engine.recipe, backend)}", type="server_error",
                           code="backend_install_failed") from None
        finally:
            self._installing.discard((engine.recipe, backend))
        log.info("Backend %s installed", spec)

    # ----- the scheduler -------------------------------------------------------------------------
    def _admits(self, lm: LoadedModel, extra: bool = False, helper: bool = False) -> bool:
        """May `lm` take one more request now? Not when it is leaving, nor past its batch while
        another model waits for its standard slot type (a helper's use takes no such slot)."""
        if lm.draining or lm.retiring:
            return False
        if extra and self._queue and not (helper and lm.residency == HELPER) and self._contended(lm.model.type):
            return lm.served < self.config.get("swap_batch")
        return True

    def _contended(self, model_type: str) -> bool:
        """Does a request wait for a standard model of this type that is neither resident nor loading?"""
        return any(w.model.type == model_type and not w.helper and not self._resident(w.model.name)
                   and w.model.name not in self._loading for w in self._queue)

    def _resident(self, name: str) -> bool:
        lm = self.loaded.get(name)
        return lm is not None and lm.usable and not lm.draining

    def _occupied(self, model_type: str) -> int:
        """Standard slots of the type taken: resident, loading and still stopping (helpers take none)."""
        names = {n for n, lm in self.loaded.items() if lm.in_standard_pool(model_type)}
        names |= {n for n, t in self._loading.items() if t == model_type}
        return len(names) + sum(1 for lm in self._retiring if lm.in_standard_pool(model_type))

    def _remote(self, model: ModelInfo) -> bool:
        """A model served elsewhere (a cloud provider): it takes no slot and never evicts a local one."""
        engine = self.engines.get(model.recipe)
        return engine is not None and engine.remote

    def _drop(self, waiter: Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
        self._dispatch()

    def _dispatch(self) -> None:
        """Decide what happens next for the waiting requests. Synchronous: decisions never interleave."""
        if self._closed:
            return
        self._queue = [w for w in self._queue if not w.future.done()]
        batch = self.config.get("swap_batch")
        for lm in self.loaded.values():
            if lm.draining and not self._contended(lm.model.type):
                lm.draining = False  # whoever needed its slot left (or got one): back in service
        # 1. Admit waiters whose model is resident, FIFO; bounded by the batch when others wait.
        for w in list(self._queue):
            lm = self.loaded.get(w.model.name)
            if lm is None or not lm.usable or lm.draining:
                continue
            if lm.residency == STANDARD and self._contended(lm.model.type) and lm.served >= batch:
                continue  # its batch is served; the slot goes to the model waiting longest
            self._queue.remove(w)
            try:
                self._settle(lm, w.helper)
            except APIError as exc:
                w.future.set_exception(exc)
                continue
            self._take(lm, w.pinned)
            w.future.set_result(lm)
        # 2. Models that need a slot, in order of their oldest waiter; one decision per type per pass.
        decided: set[str] = set()
        seen: set[str] = set()
        for w in self._queue:
            name, mtype = w.model.name, w.model.type
            if name in seen or (mtype in decided and not w.helper):
                continue
            seen.add(name)
            if name in self._loading or self._resident(name):
                continue
            if any(lm.name == name for lm in self._retiring):
                if not w.helper:
                    decided.add(mtype)  # its old process is still stopping; load again once it is gone
                continue
            limit = self.limit_for(mtype)
            if limit == -1 or self._remote(w.model) or w.helper or self._occupied(mtype) < limit:
                self._begin_load(w)
                continue
            decided.add(mtype)
            self._make_room(w, batch)

    def _make_room(self, w: Waiter, batch: int) -> None:
        mtype = w.model.type
        same = [lm for lm in self.loaded.values() if lm.in_standard_pool(mtype)]
        candidates = [lm for lm in same if not lm.pinned]
        leaving = any(lm.in_standard_pool(mtype) for lm in self._retiring)
        if not candidates:
            if mtype not in self._loading.values() and not leaving:
                err = APIError(409, f"Cannot load {w.model.public}: all {self.limit_for(mtype)} {mtype} slot(s) are "
                               f"held by pinned models ({', '.join(lm.model.public for lm in same)}). Unload one, "
                               "or raise "
                               "max_loaded_models.", type="conflict", code="slots_pinned_error")
                self._fail_waiters(w.model.name, err)
            return
        if leaving:
            return  # one eviction at a time per type: wait for the one under way
        draining = [lm for lm in candidates if lm.draining]
        if draining and draining[0].active > 0:
            return  # it is finishing its requests; this runs again when it goes idle
        waiting = {x.model.name for x in self._queue}
        # Prefer a model nobody is waiting for, then by eviction score (idle longest, cheap to reload).
        victim = draining[0] if draining else \
            min(candidates, key=lambda lm: (lm.name in waiting, -self._eviction_score(lm)))
        if victim.active == 0:
            log.info("Evicting %s (least recently used %s) to make room for %s (%d request(s) waiting)",
                     victim.name, mtype, w.model.name, sum(1 for x in self._queue if x.model.name == w.model.name))
            self.stats.evictions += 1
            self._take_out_of_service(victim)
            self._spawn(self._finish_retiring(victim))
        elif victim.served >= batch or victim.name not in waiting:
            # Stop admitting; evicted once its requests finish, if someone still waits by then.
            victim.draining = True

    def _eviction_score(self, lm: LoadedModel) -> float:
        """guide-configuration-multi-model.md: idle time over load cost; higher = more disposable."""
        idle_ms = max(0.0, time.time() - lm.last_use) * 1000 + 1.0
        weight = float(lm.options.get("evict_weight_factor") or 1.0)
        return idle_ms / (max(lm.load_seconds * 1000, 1.0) * max(weight, 1e-6))

    def _fail_waiters(self, name: str, exc: BaseException) -> None:
        for x in [x for x in self._queue if x.model.name == name]:
            self._queue.remove(x)
            if not x.future.done():
                x.future.set_exception(exc)

    def _begin_load(self, w: Waiter) -> None:
        # A remote model's load, and a helper's, is counted under no standard slot type (they take none).
        self._loading[w.model.name] = "remote" if self._remote(w.model) else HELPER if w.helper else w.model.type
        pinned = w.pinned if w.pinned is not None else self.crashed.get(w.model.name, {}).get("pinned")
        self.prune_helpers()  # as Lemonade does before every load: stale helpers leave first
        self._spawn(self._load(w.model, w.options, pinned, HELPER if w.helper else STANDARD))  # a pin survives a crash

    async def _load(self, model: ModelInfo, options: Options, pinned: bool | None, residency: str = STANDARD) -> None:
        try:
            lm = await self._start(model, options() if callable(options) else options, bool(pinned), residency)
        except BaseException as exc:
            self._loading.pop(model.name, None)
            err = exc if isinstance(exc, APIError) else APIError(500, f"Failed to load model {model.public}: {exc}",
                                                                  type="server_error", code="model_load_error")
            self._fail_waiters(model.name, err)
            self._dispatch()
            if not isinstance(exc, Exception):
                raise
            return
        self._loading.pop(model.name, None)
        if self._closed:
            await lm.server.stop()
            return
        self.loaded[model.name] = lm
        self.crashed.pop(model.name, None)
        self.stats.loads += 1
        self._on_change()
        self._dispatch()

    async def _start(self, model: ModelInfo, options: dict[str, Any], pinned: bool,
                     residency: str = STANDARD) -> LoadedModel:
        engine = self.engine_for(model)
        files = await self._files_for(model)  # normally on disk already (downloaded in _prepare)
        try:
            backend = engine.ready_backend(engine.requested_backend(options))
        except EngineUnavailable as exc:
            raise APIError(400, str(exc), code=exc.code) from None
        log.info("Loading %s (%s, %s backend %s, %s pool)", model.name, model.type, engine.recipe, backend, residency)
        listener = load_progress.get()
        if listener is not None:
            listener({"phase": "load", "message": f"Starting {engine.process} for {model.public}", "percent": None})
        started = time.perf_counter()
        try:
            launch = await engine.launch(model, files, options, backend, free_port())
        except EngineUnavailable as exc:
            raise APIError(400, str(exc), code=exc.code) from None
        except BackendStartError as exc:
            raise APIError(500, f"Failed to load model {model.public}: {exc}", type="server_error",
                           code="model_load_error") from None
        elapsed = time.perf_counter() - started
        lm = LoadedModel(model=model, engine=engine, launch=launch, pinned=pinned, load_seconds=elapsed,
                         residency=residency)
        launch.server.on_exit = lambda srv, code, lm=lm: self._crashed(lm, code)
        log.info("Loaded %s in %.2fs (pid %s)", model.name, elapsed, launch.server.pid)
        return lm

    # ----- leaving ----------------------------------------------------------------------------------
    def _crashed(self, lm: LoadedModel, code: int) -> None:
        if self.loaded.get(lm.name) is lm:
            del self.loaded[lm.name]
            self.crashed[lm.name] = {"model_name": lm.model.public, "pid": lm.server.pid, "exit_code": code,
                                     "time": time.time(), "pinned": lm.pinned,
                                     "message": f"{lm.engine.process} for {lm.model.public} exited with code "
                                                f"{code}; it is started again on the next request"}
            self._on_change()
            self._dispatch()

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

    def _take_out_of_service(self, lm: LoadedModel) -> bool:
        """The synchronous half of retiring: no new requests, not resident. False if already leaving."""
        if lm.retiring:
            return False
        lm.retiring = True
        if self.loaded.get(lm.name) is lm:
            del self.loaded[lm.name]
            self._on_change()
        self._retiring.append(lm)
        return True

    async def _retire(self, lm: LoadedModel) -> None:
        """Stop taking requests for `lm`, let in-flight ones finish, then stop the process."""
        if not self._take_out_of_service(lm) and lm not in self._retiring:
            return
        await self._finish_retiring(lm)

    async def _finish_retiring(self, lm: LoadedModel) -> None:
        try:
            await lm.idle.wait()
            await lm.server.stop()
        finally:
            with contextlib.suppress(ValueError):
                self._retiring.remove(lm)
            self._dispatch()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def unload(self, name: str | None = None) -> list[str]:
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        targets = [self.loaded[name]] if name is not None and name in self.loaded else \
            list(self.loaded.values()) if name is None else []
        await asyncio.gather(*(self._retire(lm) for lm in targets))
        return [lm.name for lm in targets]

    async def unload_where(self, predicate: Callable[[LoadedModel], bool]) -> list[str]:
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        targets = [lm for lm in self.loaded.values() if predicate(lm)]
        await asyncio.gather(*(self._retire(lm) for lm in targets))
        return [lm.name for lm in targets]

    def pin(self, name: str, pinned: bool) -> bool:
        lm = self.loaded.get(name)
        if lm is None:
            return False
        lm.pinned = pinned
        self._on_change()
        return True

    # ----- housekeeping: idle trimming and eviction, the watchdog ---------------------------------
    def _start_housekeeping(self) -> None:
        if self._housekeeper is None or self._housekeeper.done():
            self._housekeeper = asyncio.ensure_future(self._housekeeping())

    async def _housekeeping(self) -> None:
        while not self._closed:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            for lm in list(self.loaded.values()):
                try:
                    if lm.active > 0:
                        self._watch(lm)
                    else:
                        await self._trim_if_idle(lm)
                except Exception:  # one model's trouble must not stop housekeeping for the rest
                    log.exception("Housekeeping failed for %s", lm.name)
            try:
                await self._relieve_pressure()
            except Exception:
                log.exception("Memory pressure check failed")

    async def evaluate_now(self, reading: float | None) -> None:
        """One pass of the eviction engine at once (`POST /internal/simulate-vram-pressure`, Lemonade's
        admin and test hook): the idle rules for every idle model, then, for a `reading` of 0 or more,
        pressure eviction as if device memory were that full. A negative or missing reading runs the
        idle rules only."""
        for lm in list(self.loaded.values()):
            if lm.active == 0:
                await self._trim_if_idle(lm)
        if reading is not None and reading >= 0:
            total = 1 << 30
            await self._relieve_pressure(MemoryUse(int(reading * total), total, "vram"))

    async def _relieve_pressure(self, reading: MemoryUse | None = None) -> None:
        """One pressure sample when due and some model could be evicted; evict one if over the threshold.
        No reading at all while no loaded model has auto_evict on (the guide: no polling then).
        `reading`: a given figure instead of a sample (evaluate_now)."""
        if self.gate.held or not any(self._auto_evict(lm) for lm in self.loaded.values()):
            return
        if reading is None:
            now = time.monotonic()
            if now - self._sampled_at < PRESSURE_SAMPLE_SECONDS:
                return
            self._sampled_at = now
            use = await asyncio.to_thread(self._memory)
            self.last_memory = use
            self.stats.pressure_samples += 1
        else:
            use = reading
        threshold = float(self.config.get("auto_evict_threshold_pct"))
        if use.fraction < threshold:
            return
        candidates = [lm for lm in self.loaded.values() if self._auto_evict(lm) and not lm.pinned and lm.usable
                      and lm.active == 0 and not lm.engine.remote]
        if not candidates:
            return
        victim = max(candidates, key=self._eviction_score)
        log.info("Memory pressure: %s use %.0f %% >= auto_evict_threshold_pct %.0f %%; unloading %s (the most "
                 "disposable idle model)", use.source.upper(), use.fraction * 100, threshold * 100, victim.name)
        self.stats.pressure_evictions += 1
        await self._retire(victim)

    def _auto_evict(self, lm: LoadedModel) -> bool:
        own = lm.options.get("auto_evict")
        return bool(self.config.get("auto_evict") if own is None else own)

    async def _trim_if_idle(self, lm: LoadedModel) -> None:
        if lm.pinned or not lm.usable or not self._auto_evict(lm) or self.gate.held:
            return  # a job holding the gate keeps the models it relies on
        idle = time.time() - lm.last_use
        evict_after = float(lm.options.get("evict_idle_timeout", 300))
        downsize_after = float(lm.options.get("downsize_idle_timeout", 60))
        if idle >= evict_after:
            log.info("Unloading %s: idle for %.0f s (evict_idle_timeout %s s)", lm.name, idle, evict_after)
            self.stats.idle_evictions += 1
            await self._retire(lm)
        elif idle >= downsize_after and not lm.downsized and self._client is not None:
            lm.downsized = True
            if await lm.engine.downsize(lm.base_url, self._client):
                self.stats.downsizes += 1
                log.info("Downsized %s: idle for %.0f s (downsize_idle_timeout %s s); its KV cache was cleared",
                         lm.name, idle, downsize_after)

    def _watch(self, lm: LoadedModel) -> None:
        """A busy engine that neither uses CPU nor sends anything for too long is hung: kill it."""
        pid = lm.server.pid
        if pid is None or not lm.server.alive:
            return
        try:
            proc = lm._ps if lm._ps is not None and lm._ps.pid == pid else psutil.Process(pid)
            lm._ps = proc  # kept: psutil.Process() reads /proc each time it is built (every second here)
            cpu = sum(proc.cpu_times()[:2])
            stopped = proc.status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return
        now = time.monotonic()
        if cpu != lm._cpu_seen:
            lm._cpu_seen, lm._cpu_changed_at = cpu, now
        limit = float(self.config.get("engine_watchdog_seconds"))
        quiet = now - max(lm._cpu_changed_at, lm.last_progress)
        if quiet >= limit:
            state = "stopped (SIGSTOP)" if stopped else "making no progress"
            log.error("Watchdog: %s for %s (pid %s) has been busy but %s for %.0f s; killing it", lm.engine.process,
                      lm.name, pid, state, quiet)
            self.stats.watchdog_kills += 1
            lm.server.kill_now(report=True)

    # ----- shutdown -------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        self._closed = True
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        for w in self._queue:
            if not w.future.done():
                w.future.set_exception(APIError(503, "The server is shutting down", code="shutting_down"))
        self._queue.clear()
        for task in list(self._tasks):
            task.cancel()
        for lm in list(self.loaded.values()) + list(self._retiring):
            lm.retiring = True
            await lm.server.stop(grace=3.0)
        self.loaded.clear()

    def kill_all_now(self) -> None:
        for lm in list(self.loaded.values()) + list(self._retiring):
            lm.server.kill_now()
