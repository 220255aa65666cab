"""The scheduler: requests wait here for their model, loads start here, models leave from here.

The router is three rooms (docs/architecture.md): the rules (rules.py: pure decisions), this
scheduler (waiters, dispatch, making room, loads, unloads, crashes) and housekeeping
(housekeeping.py: idle trimming and eviction, memory pressure, the watchdog). Other packages ask
the router questions through its queries (`resident`, `models`, `most_recent`, `describe`, ...);
`loaded` itself is for `runtime/` only.

Lemonade's multi-model behaviour (guide-configuration-multi-model.md), carried out here:
- a limit per model type (`max_loaded_models`: one number for every type, or a map per type);
  when every slot of the type is pinned the load fails with 409 `slots_pinned_error`;
- a model serving requests is never stopped under them: an eviction waits for it to go idle;
- concurrent requests for an unloaded model share one load; a missing backend is installed and
  missing files are downloaded first (shared too: prepare.py), before the request takes a slot;
- an engine that dies is reported in health and started again by the next request.

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
makes room for it. Pins count per pool (`pinned_counts`, `pinned_helper_counts`); the implicit
"most recent model" prefers a standard one; a helper no registered policy calls any more is unloaded
(`prune_helpers`) unless pinned. Cloud models take neither pool (`slot_pool: unmetered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import lemonade.runtime.router.rules as rules
from lemonade.backends.base import BackendStartError
from lemonade.backends.cpu_share import OWN_LOAD
from lemonade.backends.engine import Engine, EngineUnavailable, MemoryNeed
from lemonade.backends.registry import Engines
from lemonade.config import Config
from lemonade.errors import APIError
from lemonade.labels import MODEL_TYPES
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_client import EngineClient
from lemonade.runtime.exclusive import ExclusiveGate
from lemonade.runtime.request_context import ClientGone, load_progress, routing_dependency, until_gone_or
from lemonade.runtime.router.housekeeping import Housekeeping
from lemonade.runtime.router.prepare import Preparation
from lemonade.runtime.router.state import HELPER, STANDARD, LoadedModel, ModelState, Options, QueueStats, Waiter
from lemonade.system.devices import MemoryUse, memory_use
from lemonade.system.memory import MemoryBudget, cgroup_memory, process_tree_memory, read_budget
from lemonade.util.ports import free_port

log = logging.getLogger("lemonade.router")
FRESH_MEASURE_SECONDS = 0.25  # how old the engines' memory figures may be when a load is decided
EXPLAIN_SECONDS = 2.0  # what an engine may take to say why it ended (Engine.exit_cause), which clients wait for

FilesProvider = Callable[[ModelInfo], Awaitable[dict[str, list[Path]]]]


class Router:
    def __init__(self, *, engines: Engines, config: Config, files_for: FilesProvider,
                 client: EngineClient | None = None, on_change: Callable[[], None] | None = None,
                 memory: Callable[[], MemoryUse] = memory_use) -> None:
        self.engines = engines
        self.config = config
        self._files_for = files_for
        self.client = client  # to local engines, for downsizing
        self._on_change = on_change or (lambda: None)
        self.loaded: dict[str, LoadedModel] = {}  # runtime/ only: other packages use the queries below
        self.crashed: dict[str, dict[str, Any]] = {}
        self.stats = QueueStats()
        self._queue: list[Waiter] = []
        self._loading: dict[str, str] = {}  # model name -> the slot type it counts in: loads under way
        self._loading_bytes: dict[str, int] = {}  # model name -> the memory its load is counted for
        self._measured_at = 0.0  # monotonic time the engines' memory was last measured (measure)
        self._retiring: list[LoadedModel] = []  # leaving; still hold their slot until stopped
        self._preparation = Preparation(config, files_for)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.housekeeping = Housekeeping(self, memory)
        self.closed = False
        self._oom_kills = self._oom_count()  # the cgroup's OOM kill counter, to tell an OOM kill from other deaths
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

    def resident(self, name: str, *, usable: bool = True) -> LoadedModel | None:
        """The live process of model `name` (canonical name), or None when it is not loaded or leaving;
        `usable=False` also gives one whose process just died and is not yet reported as crashed."""
        lm = self.loaded.get(name)
        return lm if lm is not None and (lm.usable or not usable) else None

    def models(self, mode: str | None = None, *, usable: bool = True) -> list[LoadedModel]:
        """Loaded models (of a deployment `mode`), most recently used first; `usable=False` includes
        one whose process just died and is not yet reported as crashed."""
        found = [lm for lm in self.loaded.values()
                 if (not usable or lm.usable) and (mode is None or lm.model.mode == mode)]
        return sorted(found, key=lambda lm: lm.last_use, reverse=True)

    def most_recent(self, recipe: str | None = None, mode: str | None = None) -> LoadedModel | None:
        """The most recently used live model (of `recipe`, of `mode`): a standard one if there is any,
        so a helper that just chose a candidate never becomes the implicit user-facing model."""
        live = [lm for lm in self.models(mode) if recipe is None or lm.model.recipe == recipe]
        return next((lm for lm in live if lm.residency == STANDARD), live[0] if live else None)

    def processes(self) -> list[LoadedModel]:
        """Every engine process of ours: loaded models and those still stopping."""
        return [*self.loaded.values(), *self._retiring]

    def describe(self) -> list[dict[str, Any]]:
        return [lm.describe() for lm in self.models(usable=False)]

    def pinned_counts(self, residency: str = STANDARD) -> dict[str, int]:
        """Pinned models by type in one residency class (`pinned_models` of health: the standard pool)."""
        counts = dict.fromkeys(MODEL_TYPES, 0)
        for lm in self.loaded.values():
            if lm.pinned and lm.residency == residency:
                counts[lm.model.type] = counts.get(lm.model.type, 0) + 1
        return counts

    def pinned_helper_counts(self) -> dict[str, int]:
        return self.pinned_counts(HELPER)

    def pinned_states(self) -> dict[str, bool]:
        """Every loaded model's pin, by canonical name (a job restores them after it interrupts)."""
        return {name: lm.pinned for name, lm in self.loaded.items()}

    def queue_info(self) -> dict[str, Any]:
        waiting: dict[str, int] = {}
        for w in self._queue:
            waiting[w.model.name] = waiting.get(w.model.name, 0) + 1
        s = self.stats
        return {"depth": len(self._queue), "max_depth": self.config.get("max_queue_depth"), "waiting": waiting,
                "loading": sorted(self._loading),
                "installing": [f"{r}:{b}" for r, b in sorted(self._preparation.installing)],
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

    def auto_evict(self, lm: LoadedModel) -> bool:
        own = lm.options.get("auto_evict")
        return bool(self.config.get("auto_evict") if own is None else own)

    def drained(self) -> bool:
        """Nothing admitted is still running: no request in flight, none waiting, no load under way
        (what an exclusive job waits for before it starts, runtime/exclusive.py)."""
        return not self._queue and not self._loading and all(lm.active == 0 for lm in self.loaded.values())

    def _queue_view(self, memory: bool = False) -> rules.Queue:
        """What the rules read; `memory`: with the memory budget read now (only a decision that may
        start a load needs it, never the fast path)."""
        return rules.Queue(self._queue, self.loaded, self._loading, self._retiring, self.limit_for,
                           int(self.config.get("swap_batch")), time.time(), public=lambda x: x.model.public,
                           memory=self._memory_view() if memory else None)

    # ----- memory (docs/memory.md) ------------------------------------------------------------------
    def budget(self) -> MemoryBudget:
        """The memory budget now, with what our engines hold as last measured."""
        procs = self.processes()
        return read_budget(sum(lm.memory_bytes or 0 for lm in procs), sum(lm.anon_bytes for lm in procs))

    def measure(self) -> None:
        """Each engine process tree's memory now (PSS, else RSS), its anonymous part and its peak: what
        the memory budget counts as ours, and what replaces an estimate that fell short (docs/memory.md).
        Blocking (it reads /proc): housekeeping runs it in a thread each second, a load decision inline."""
        self._measured_at = time.monotonic()
        for lm in self.processes():
            if lm.remote or lm.server.pid is None:
                continue
            size = process_tree_memory(lm.server.pid)
            if size is not None:
                lm.memory_bytes, lm.anon_bytes = size
                lm.peak_bytes = max(lm.peak_bytes, size[0])

    def _memory_view(self) -> rules.Memory:
        # Measured now, not at housekeeping's last tick: the cgroup's figure is read now, and an engine
        # that started or grew since that tick would otherwise count twice, once in the cgroup as not
        # ours and once in its own estimate (tests/test_memory.py once saw a load in a 700 MiB cgroup
        # refused with 130 MiB more counted as not ours than the server itself held). At most every
        # FRESH_MEASURE_SECONDS while a load waits: a dispatch runs at each request's end.
        procs = self.processes()
        if any(lm.memory_bytes is None for lm in procs if not lm.remote and lm.server.pid is not None) or \
                time.monotonic() - self._measured_at > FRESH_MEASURE_SECONDS:
            self.measure()
        budget = self.budget()
        source = {"cgroup": f"the memory cgroup's limit of {budget.cap_bytes / 2**30:.2f} GiB",
                  "ram": "the machine's RAM", "available": "the memory the system has available"}[budget.source]
        return rules.Memory(budget.admissible_bytes, source, dict(self._loading_bytes))

    async def _estimate(self, model: ModelInfo, engine: Engine, options: dict[str, Any]) -> MemoryNeed | None:
        """What a load of `model` would hold at most (None: the engine cannot tell; no memory check)."""
        try:
            files = await self._files_for(model)
            backend = engine.ready_backend(engine.requested_backend(options))
            cap = self.budget().cap_bytes
            return await asyncio.to_thread(engine.memory_need, model, files, options, backend, cap)
        except APIError:  # the engine refuses the load before anything starts (llama.cpp: RPC workers missing or full)
            raise
        except Exception as exc:  # an estimate that fails must not stop the load (it is then not admitted by memory)
            log.warning("No memory estimate for %s: %s", model.name, exc)
            return None

    @staticmethod
    def _oom_count() -> int | None:
        cgroup = cgroup_memory()
        return cgroup.oom_kills if cgroup is not None else None

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
        if lm is not None and lm.usable and rules.admits(lm, self._queue_view(), helper=helper):
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
        if lm.residency == want or lm.remote:
            return
        victims: list[Any] = []
        if want == STANDARD:
            others = [x for x in self.loaded.values() if x is not lm and x.usable and x.in_standard_pool(lm.type)]
            victims = rules.standard_room(lm, others, self.limit_for(lm.type), lambda x: x.model.public)
        self._move(lm, want, victims)

    def _move(self, lm: LoadedModel, pool: str, victims: list[Any] | tuple[Any, ...]) -> None:
        for victim in victims:
            log.info("Evicting %s (least recently used %s) to make room for %s, a routing helper now used directly",
                     victim.name, lm.type, lm.name)
            self._evict(victim)
        log.info("%s moves from the %s pool to the %s pool (same process, pid %s)", lm.name, lm.residency, pool,
                 lm.server.pid)
        lm.residency = pool
        self._on_change()

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
        self.housekeeping.start()
        engine = self.engine_for(model)
        await self._preparation.prepare(model, engine, options)
        need = None
        if not engine.remote and self.resident(model.name) is None and model.name not in self._loading:
            options = options() if callable(options) else options  # the options its load will use
            need = await self._estimate(model, engine, options)
        if len(self._queue) >= self.config.get("max_queue_depth"):
            self.stats.rejected += 1
            raise APIError(503, f"The server is busy: {len(self._queue)} requests are already waiting for a model "
                           "slot. Retry shortly, or raise max_loaded_models so fewer models have to take turns.",
                           code="queue_full", headers={"Retry-After": "5"})
        waiter = Waiter(model, options, pinned, asyncio.get_running_loop().create_future(), helper, engine.remote,
                        need)
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

    def _take(self, lm: LoadedModel, pinned: bool | None = None) -> None:
        lm.active += 1
        lm.served += 1
        lm.idle.clear()
        lm.last_use = time.time()
        if lm.state is ModelState.DOWNSIZED:
            lm.state = ModelState.READY
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
        """Load (or keep) `model` without holding it: `/v1/load`, Ollama keep-alive and the like.
        `reload`: start it again even when it runs with the same options."""
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        current = self.loaded.get(model.name)
        if current is not None and (reload or (not callable(options) and not self._runs_with(current, options))):
            pinned = current.pinned if pinned is None else pinned
            await self.retire(current)
        raced = model.name in self._loading  # a load (maybe with other options) is already under way
        lm = await self.acquire(model, options, pinned)
        self.release(lm)
        if raced and not callable(options) and not self._runs_with(lm, options):
            # a load with other options was under way and won: this one starts once it has finished
            await self.retire(lm)
            lm = await self.acquire(model, options, pinned)
            self.release(lm)
        return lm

    def _runs_with(self, lm: LoadedModel, wanted: dict[str, Any]) -> bool:
        """Would a load with `wanted` run the engine `lm` is? An `auto` backend matches the backend it
        chose, and what the router decided for the load (`resolved_ctx_size`, `resolved_speculation`)
        is not an option of its own."""
        shown = {k: v for k, v in lm.options.items() if not k.startswith("resolved_")}  # the router's own decisions
        wanted = {k: v for k, v in wanted.items() if not k.startswith("resolved_")}  # (a running model's options)
        key = lm.engine.backend_option
        if key is not None and wanted.get(key) == "auto":
            wanted[key] = shown.get(key)
        return shown == wanted

    # ----- the scheduler -------------------------------------------------------------------------
    def _drop(self, waiter: Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
        self._dispatch()

    def _dispatch(self) -> None:
        """Carry out what the rules decide for the waiting requests. Synchronous: decisions never
        interleave. The rules make one decision per slot type a pass, so after an eviction the plan is
        made again at once: the model evicted gave its slot up, and the next one starts while it saves its
        conversations and exits (rules._occupied), not once its process is gone."""
        while self._dispatch_once():
            pass

    def _dispatch_once(self) -> bool:
        """One pass of the rules; True when it evicted a model (the next pass sees its slot free)."""
        if self.closed:
            return False
        evicted = False
        self._queue = [w for w in self._queue if not w.future.done()]
        needs_memory = any(w.need is not None and w.name not in self._loading and w.name not in self.loaded
                           for w in self._queue)
        for decision in rules.plan(self._queue_view(memory=needs_memory)):
            if isinstance(decision, rules.Undrain):
                decision.model.state = ModelState.READY
            elif isinstance(decision, rules.Admit):
                lm, w = decision.model, decision.waiter
                self._queue.remove(w)
                if decision.move_to is not None:
                    self._move(lm, decision.move_to, decision.evict)
                self._take(lm, w.pinned)
                w.future.set_result(lm)
            elif isinstance(decision, rules.Load):
                self._begin_load(decision.waiter, decision.ctx, decision.bytes, decision.fallback)
            elif isinstance(decision, rules.Evict):
                victim = decision.model
                waiting = sum(1 for x in self._queue if x.model.name == decision.for_name)
                if decision.memory:
                    self.stats.memory_evictions += 1
                    log.info("Evicting %s (%.0f MiB, the most disposable idle model) to make memory room for %s "
                             "(%d request(s) waiting)", victim.name, victim.held_bytes / 2**20, decision.for_name,
                             waiting)
                else:
                    log.info("Evicting %s (least recently used %s) to make room for %s (%d request(s) waiting)",
                             victim.name, victim.type, decision.for_name, waiting)
                self._evict(victim)
                evicted = True
            elif isinstance(decision, rules.Drain):
                decision.model.state = ModelState.DRAINING  # evicted once its requests finish, if still needed
            elif isinstance(decision, rules.Refuse):
                if decision.error.code == "insufficient_memory":
                    self.stats.memory_refusals += 1
                    log.warning("%s", decision.error.message)
                if decision.all_of_model:
                    self._fail_waiters(decision.waiter.model.name, decision.error)
                else:
                    self._queue.remove(decision.waiter)
                    decision.waiter.future.set_exception(decision.error)
        return evicted

    def _evict(self, victim: LoadedModel) -> None:
        self.stats.evictions += 1
        self._take_out_of_service(victim)
        self._spawn(self._finish_retiring(victim))

    def _fail_waiters(self, name: str, exc: BaseException) -> None:
        for x in [x for x in self._queue if x.model.name == name]:
            self._queue.remove(x)
            if not x.future.done():
                x.future.set_exception(exc)

    # ----- loading ---------------------------------------------------------------------------------
    def _begin_load(self, w: Waiter, ctx: int | None = None, held: int = 0, fallback: bool = False) -> None:
        # A remote model's load, and a helper's, is counted under no standard slot type (they take none).
        self._loading[w.model.name] = "remote" if w.remote else HELPER if w.helper else w.model.type
        self._loading_bytes[w.model.name] = held
        pinned = w.pinned if w.pinned is not None else self.crashed.get(w.model.name, {}).get("pinned")
        self.prune_helpers()  # as Lemonade does before every load: stale helpers leave first
        need = w.need.fallback if fallback and w.need is not None else w.need
        self._spawn(self._load(w.model, w.options, pinned, HELPER if w.helper else STANDARD,  # a pin survives a crash
                               need, ctx, fallback))

    async def _load(self, model: ModelInfo, options: Options, pinned: bool | None, residency: str = STANDARD,
                    need: MemoryNeed | None = None, ctx: int | None = None, fallback: bool = False) -> None:
        opts = options() if callable(options) else options
        if need is not None and need.auto and ctx:
            opts = {**opts, "resolved_ctx_size": ctx}  # ctx_size -1: the context the memory budget leaves
        if fallback:  # memory was short: without what the engine may leave out (speculative decoding)
            log.info("Loading %s without speculative decoding: with it, it would not fit the memory free", model.name)
            opts = {**opts, "resolved_speculation": "off"}
        try:
            try:
                lm = await self._start(model, opts, bool(pinned), residency)
            except APIError as exc:
                if not await self._unload_all_for_retry(model, exc):
                    raise
                lm = await self._start(model, opts, bool(pinned), residency)
        except BaseException as exc:
            self._loading.pop(model.name, None)
            self._loading_bytes.pop(model.name, None)
            err = exc if isinstance(exc, APIError) else APIError(500, f"Failed to load model {model.public}: {exc}",
                                                                  type="server_error", code="model_load_error")
            self._fail_waiters(model.name, err)
            self._dispatch()
            if not isinstance(exc, Exception):
                raise
            return
        self._loading.pop(model.name, None)
        self._loading_bytes.pop(model.name, None)
        lm.need, lm.ctx = need, ctx or lm.context_length
        if self.closed:
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
        files = await self._files_for(model)  # normally on disk already (downloaded in prepare.py)
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
        lm = LoadedModel(model=model, engine=engine, launch=launch, pinned=pinned, residency=residency)
        launch.server.on_exit = lambda srv, code, lm=lm: self._crashed(lm, code)
        await self._restore_warm(lm)  # before its first request: the conversations it held before
        lm.load_seconds = elapsed = time.perf_counter() - started
        log.info("Loaded %s in %.2fs (pid %s)", model.name, elapsed, launch.server.pid)
        return lm

    # ----- warm swaps (docs/warm-swaps.md): what a model had read outlives its process --------------
    async def _restore_warm(self, lm: LoadedModel) -> None:
        if self.client is None:
            return
        try:
            keys, tokens = await lm.engine.restore_warm(lm.launch, self.client)
        except Exception as exc:  # a state that cannot be restored costs its prefill, nothing else
            log.warning("Restoring the saved conversations of %s failed: %s", lm.name, exc)
            return
        if tokens:
            log.info("Restored %d saved conversation(s) of %s (%d tokens)", len(keys), lm.name, tokens)
            if lm.affinity is not None:
                lm.affinity.restored(keys)

    async def _save_warm(self, lm: LoadedModel) -> None:
        """Before an idle engine stops (evicted, idle, under pressure, unloaded, at shutdown)."""
        if self.client is None or not lm.server.alive or lm.remote:
            return
        try:
            tokens = await lm.engine.save_warm(lm.launch, self.client, dict(lm.affinity.held) if lm.affinity else {},
                                               lm.affinity.used_at() if lm.affinity else None)
        except Exception as exc:  # saving must never keep a model from leaving
            log.warning("Saving the conversations of %s failed: %s", lm.name, exc)
            return
        if tokens:
            log.info("Saved the conversations of %s (%d tokens) for its next load", lm.name, tokens)

    async def _unload_all_for_retry(self, model: ModelInfo, exc: APIError) -> bool:
        """Lemonade's failed-load rule (multi-model guide, Eviction Policy 3): a load that failed for any
        reason but a missing file unloads every model and is tried once more. A pin outranks the rule:
        pinned models stay. False (nothing done) when the rule does not apply."""
        missing = "no such file" in exc.message.lower() or "not found" in exc.message.lower()
        if exc.code != "model_load_error" or missing or self.closed:
            return False
        others = [lm for lm in self.loaded.values() if not lm.pinned]
        log.warning("Loading %s failed (%s); unloading %s and trying once more", model.public,
                    exc.message.splitlines()[0][:300], ", ".join(lm.name for lm in others) or "no other model")
        await asyncio.gather(*(self.retire(lm) for lm in others))
        return True

    # ----- leaving ----------------------------------------------------------------------------------
    def _crashed(self, lm: LoadedModel, code: int) -> None:
        if self.loaded.get(lm.name) is lm:
            del self.loaded[lm.name]
            oom = self._oom_killed(code)
            how = (f"was killed by the kernel's out-of-memory killer (holding {(lm.peak_bytes or 0) / 2**20:.0f} MiB)"
                   if oom else f"exited with code {code}")
            self.crashed[lm.name] = {"model_name": lm.model.public, "pid": lm.server.pid, "exit_code": code,
                                     "time": time.time(), "pinned": lm.pinned, "oom_killed": oom,
                                     "message": f"{lm.engine.process} for {lm.model.public} {how}; it is started "
                                                "again on the next request"}
            lm.exit_reason = self.crashed[lm.name]["message"]
            if not oom:
                lm.exit_explained = asyncio.get_running_loop().create_future()
                self._spawn(self._explain_exit(lm))
            self._on_change()
            self._dispatch()

    async def _explain_exit(self, lm: LoadedModel) -> None:
        """Add what the engine knows of an exit (an RPC worker gone) to the crash report and the error its
        clients get (they wait for this, EXPLAIN_SECONDS at most)."""
        try:
            cause = await asyncio.wait_for(lm.engine.exit_cause(lm.launch), EXPLAIN_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the crash is reported either way
            log.debug("No exit cause for %s: %s", lm.name, exc)
            cause = None
        if cause:
            entry = self.crashed.get(lm.name)
            message = f"{lm.engine.process} for {lm.model.public} {cause}; it is started again on the next request"
            if entry is not None and entry.get("pid") == lm.server.pid:
                entry["message"] = message
            lm.exit_reason = message
            log.warning("%s", message)
        if lm.exit_explained is not None and not lm.exit_explained.done():
            lm.exit_explained.set_result(None)

    async def explained(self, lm: LoadedModel) -> None:
        """Wait until the router has added what the engine knows of `lm`'s exit (a moment at most)."""
        if lm.exit_explained is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(lm.exit_explained), EXPLAIN_SECONDS + 0.5)

    def _oom_killed(self, code: int) -> bool:
        """Was an engine that exited with `code` killed by the OOM killer? A SIGKILL while the cgroup's
        OOM kill counter went up."""
        count = self._oom_count()
        went_up = count is not None and self._oom_kills is not None and count > self._oom_kills
        self._oom_kills = count
        if code == -9 and went_up:
            self.stats.oom_kills += 1
            return True
        return False

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
        lm.state = ModelState.RETIRING
        OWN_LOAD.leaving(lm.server.pid)  # the next engine may start before it has exited: not cores it shares
        if self.loaded.get(lm.name) is lm:
            del self.loaded[lm.name]
            self._on_change()
        self._retiring.append(lm)
        return True

    async def retire(self, lm: LoadedModel) -> None:
        """Stop taking requests for `lm`, let in-flight ones finish, then stop the process."""
        if not self._take_out_of_service(lm) and lm not in self._retiring:
            return
        await self._finish_retiring(lm)

    async def _finish_retiring(self, lm: LoadedModel) -> None:
        try:
            await lm.idle.wait()
            await self._save_warm(lm)
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
        """Unload model `name` (canonical), or every loaded model; the names unloaded."""
        if name is None:
            return await self.unload_where(lambda lm: True)
        return await self.unload_where(lambda lm: lm.name == name)

    async def unload_where(self, predicate: Callable[[LoadedModel], bool]) -> list[str]:
        if self.gate.blocks_caller():
            await self.gate.pass_through()
        targets = [lm for lm in self.loaded.values() if predicate(lm)]
        await asyncio.gather(*(self.retire(lm) for lm in targets))
        return [lm.name for lm in targets]

    def pin(self, name: str, pinned: bool) -> bool:
        lm = self.loaded.get(name)
        if lm is None:
            return False
        lm.pinned = pinned
        self._on_change()
        return True

    async def evaluate_now(self, reading: float | None) -> None:
        """One pass of the eviction engine at once (housekeeping.py)."""
        await self.housekeeping.evaluate_now(reading)

    # ----- shutdown -------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        self.closed = True
        self.housekeeping.stop()
        for w in self._queue:
            if not w.future.done():
                w.future.set_exception(APIError(503, "The server is shutting down", code="shutting_down"))
        self._queue.clear()
        for task in list(self._tasks):
            task.cancel()
        for lm in list(self.loaded.values()) + list(self._retiring):
            lm.state = ModelState.RETIRING
            if lm.active == 0:
                await self._save_warm(lm)
            await lm.server.stop(grace=3.0)
        self.loaded.clear()

    def kill_all_now(self) -> None:
        for lm in list(self.loaded.values()) + list(self._retiring):
            lm.server.kill_now()
