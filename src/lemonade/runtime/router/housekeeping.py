"""Housekeeping: what happens to loaded models while nobody asks for anything.

Once a second, for every loaded model: a busy one is watched (an engine that neither uses CPU nor
sends a byte for `engine_watchdog_seconds` is hung or stopped, and killed); an idle one with
`auto_evict` has its KV cache cleared after `downsize_idle_timeout` and is unloaded after
`evict_idle_timeout`; pinned models are kept. While some loaded model has `auto_evict`, memory use is
sampled every `PRESSURE_SAMPLE_SECONDS`, and at `auto_evict_threshold_pct` or above the most
disposable idle, unpinned such model is unloaded, one per sample, so the next sample sees what that
freed. Every `OWN_LOAD_SAMPLE_SECONDS` the CPU our own processes used is sampled, so that an engine
started later is not given fewer threads for load that only our earlier work left (backends/cpu_share.py).
The decisions are rules.py's; this module reads the clock, the processes and the memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psutil

import lemonade.runtime.router.rules as rules
from lemonade.backends.cpu_share import OWN_LOAD
from lemonade.backends.engine import EngineHTTP
from lemonade.config import Config
from lemonade.runtime.exclusive import ExclusiveGate
from lemonade.runtime.router.state import LoadedModel, ModelState, QueueStats
from lemonade.system.devices import MemoryUse

log = logging.getLogger("lemonade.router")
HOUSEKEEPING_SECONDS = 1.0
PRESSURE_SAMPLE_SECONDS = 5.0  # memory use is read this often while some model may be pressure-evicted
OWN_LOAD_SAMPLE_SECONDS = 5.0  # the kernel folds the run queue into the load average this often


@dataclass
class _Watch:
    """What the watchdog saw of one engine process."""

    proc: psutil.Process  # kept: psutil.Process() reads /proc each time it is built (every second here)
    cpu_seen: float = -1.0
    cpu_changed_at: float = field(default_factory=time.monotonic)


class Scheduler(Protocol):
    """What housekeeping needs of the scheduler (scheduler.py's Router)."""

    config: Config
    stats: QueueStats
    gate: ExclusiveGate
    closed: bool

    @property
    def client(self) -> EngineHTTP | None: ...  # read-only here, so the Router's EngineClient fits

    def models(self, mode: str | None = None, *, usable: bool = True) -> list[LoadedModel]: ...
    def processes(self) -> list[LoadedModel]: ...
    def measure(self) -> None: ...
    def auto_evict(self, lm: LoadedModel) -> bool: ...
    async def retire(self, lm: LoadedModel) -> None: ...


class Housekeeping:
    def __init__(self, router: Scheduler, memory: Callable[[], MemoryUse]) -> None:
        self.router = router
        self._memory = memory  # the live device memory reading (lemonade.system.devices)
        self._sampled_at = 0.0  # monotonic time of the last pressure reading
        self.last_memory: MemoryUse | None = None
        self._watched: dict[int, _Watch] = {}  # pid -> what the watchdog saw
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        router = self.router
        while not router.closed:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            live: set[int] = set()
            for lm in router.models(usable=False):
                try:
                    if lm.active > 0:
                        self._watch(lm, live)
                    else:
                        await self.trim_if_idle(lm)
                except Exception:  # one model's trouble must not stop housekeeping for the rest
                    log.exception("Housekeeping failed for %s", lm.name)
            for pid in set(self._watched) - live:
                del self._watched[pid]
            if OWN_LOAD.due(OWN_LOAD_SAMPLE_SECONDS):
                try:
                    await asyncio.to_thread(OWN_LOAD.sample)
                except Exception:
                    log.exception("Sampling this server's CPU use failed")
            try:
                await asyncio.to_thread(self.router.measure)
            except Exception:
                log.exception("Measuring the engines' memory failed")
            try:
                await self.relieve_pressure()
            except Exception:
                log.exception("Memory pressure check failed")

    async def evaluate_now(self, reading: float | None) -> None:
        """One pass of the eviction engine at once (`POST /internal/simulate-vram-pressure`, Lemonade's
        admin and test hook): the idle rules for every idle model, then, for a `reading` of 0 or more,
        pressure eviction as if device memory were that full. A negative or missing reading runs the
        idle rules only."""
        for lm in self.router.models(usable=False):
            if lm.active == 0:
                await self.trim_if_idle(lm)
        if reading is not None and reading >= 0:
            total = 1 << 30
            await self.relieve_pressure(MemoryUse(int(reading * total), total, "vram"))

    async def relieve_pressure(self, reading: MemoryUse | None = None) -> None:
        """One pressure sample when due and some model could be evicted; evict one if over the threshold.
        No reading at all while no loaded model has auto_evict on (the guide: no polling then).
        `reading`: a given figure instead of a sample (evaluate_now)."""
        router = self.router
        loaded = router.models(usable=False)
        if router.gate.held or not any(router.auto_evict(lm) for lm in loaded):
            return
        if reading is None:
            now = time.monotonic()
            if now - self._sampled_at < PRESSURE_SAMPLE_SECONDS:
                return
            self._sampled_at = now
            use = await asyncio.to_thread(self._memory)
            self.last_memory = use
            router.stats.pressure_samples += 1
        else:
            use = reading
        threshold = float(router.config.get("auto_evict_threshold_pct"))
        if use.fraction < threshold:
            return
        victim = rules.pressure_victim((lm for lm in loaded if router.auto_evict(lm) and not lm.pinned
                                        and lm.usable and lm.active == 0 and not lm.remote), time.time())
        if victim is None:
            return
        log.info("Memory pressure: %s use %.0f %% >= auto_evict_threshold_pct %.0f %%; unloading %s (the most "
                 "disposable idle model)", use.source.upper(), use.fraction * 100, threshold * 100, victim.name)
        router.stats.pressure_evictions += 1
        await router.retire(victim)  # type: ignore[arg-type]  # the rules return what they were given

    async def trim_if_idle(self, lm: LoadedModel) -> None:
        router = self.router
        if lm.pinned or not lm.usable or not router.auto_evict(lm) or router.gate.held:
            return  # a job holding the gate keeps the models it relies on
        idle = time.time() - lm.last_use
        evict_after = float(lm.options.get("evict_idle_timeout", 300))
        downsize_after = float(lm.options.get("downsize_idle_timeout", 60))
        action = rules.idle_action(idle, evict_after, downsize_after, lm.downsized)
        if action == "evict":
            log.info("Unloading %s: idle for %.0f s (evict_idle_timeout %s s)", lm.name, idle, evict_after)
            router.stats.idle_evictions += 1
            await router.retire(lm)
        elif action == "downsize" and router.client is not None:
            lm.state = ModelState.DOWNSIZED
            if await lm.engine.downsize(lm.base_url, router.client):
                router.stats.downsizes += 1
                log.info("Downsized %s: idle for %.0f s (downsize_idle_timeout %s s); its KV cache was cleared",
                         lm.name, idle, downsize_after)

    def _watch(self, lm: LoadedModel, live: set[int]) -> None:
        """A busy engine that neither uses CPU nor sends anything for too long is hung: kill it."""
        pid = lm.server.pid
        if pid is None or not lm.server.alive:
            return
        live.add(pid)
        try:
            seen = self._watched.get(pid)
            if seen is None:
                seen = self._watched[pid] = _Watch(psutil.Process(pid))
            cpu = sum(seen.proc.cpu_times()[:2])
            stopped = seen.proc.status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return
        now = time.monotonic()
        if cpu != seen.cpu_seen:
            seen.cpu_seen, seen.cpu_changed_at = cpu, now
        limit = float(self.router.config.get("engine_watchdog_seconds"))
        quiet = now - max(seen.cpu_changed_at, lm.last_progress)
        if quiet >= limit:
            state = "stopped (SIGSTOP)" if stopped else "making no progress"
            log.error("Watchdog: %s for %s (pid %s) has been busy but %s for %.0f s; killing it", lm.engine.process,
                      lm.name, pid, state, quiet)
            self.router.stats.watchdog_kills += 1
            lm.server.kill_now(report=True)
