"""How many compute threads an engine asks for when other processes already hold the CPU.

llama-server runs one compute thread per physical core by default, and its threads meet at a
barrier after every operation of the graph (hundreds per token). When other processes keep the
cores busy, one of those threads is often waiting for a core, and the others spin at the barrier
until it gets one: each token then costs many scheduler ticks instead of a few milliseconds. On the
2-core test machine, with the load average at 17 from other work, Gemma 3 270M generated 0.7
tokens/s with the default 2 threads and 8.7 with 1 (docs/performance.md, "Threads"); a 40-token
reply took over 100 s, which is how a chat test on a busy new machine ran out of time. stable-diffusion.cpp
has the same lockstep threads: a 64x64 Flux.2 Klein picture took 66 s with 2 threads and 28 s with 1 there.

So when the machine is already busy as an engine starts (the 1-minute load average is at least 1),
the engine asks for the cores left free, at least half of them (one on a 2-core machine), instead of
all of them. A quiet machine keeps
the engine's default. The user's own thread count (`-t` in `llamacpp.args`, a model's options or a
profile) always wins. The load is read once, at start: an engine started on a busy machine keeps its
smaller count after the machine quiets down (a reload picks the count again).

The load average remembers a minute of the past, our own included: right after a swap (model A
unloaded, B loaded in its place) the load A's work left behind made B start with one thread, half of
a quiet 2-core machine, for as long as B stays loaded. So the server follows the share of the load its
own processes make (`OwnLoad`, sampled by the router's housekeeping) and counts only what is not
theirs, plus what its processes still alive use now.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

log = logging.getLogger("lemonade.backends")
THREAD_FLAGS = ("-t", "--threads")


def threads_for_load(physical_cores: int, load: float) -> int | None:
    """Compute threads for an engine (llama-server, sd-server) when `load` (1-minute load average) of
    other work is on a machine with `physical_cores`; None for the engine's default (one per core)."""
    if physical_cores <= 1 or load < 1.0:
        return None
    free = int(physical_cores - load)
    # Never below half the cores: the load is read once, and a machine busy for a moment (a build that
    # just ended) must not leave a large machine's engine on one thread until it is reloaded.
    return max(1, physical_cores // 2, min(free, physical_cores - 1))


LOAD_WINDOW_SECONDS = 60.0  # the kernel's 1-minute load average: an exponential mean with this time constant
FRESH_SAMPLE_SECONDS = 1.0  # an engine start samples our CPU again unless the last sample is this recent


def _our_cpu_seconds() -> tuple[float, dict[int, float]]:
    """CPU seconds used so far by this server and everything it started: the total, ended processes
    included, and each running process's own."""
    me = psutil.Process()
    total, running = 0.0, {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # gone between the listing and the reading
            continue
        running[proc.pid] = times.user + times.system
        # an ended process's time moves to its parent's children_* once the parent reaps it (the server
        # waits for its engines), so an engine stopped between two samples still counts in the second
        total += times.user + times.system + times.children_user + times.children_system
    return total, running


class OwnLoad:
    """Our processes' share of the 1-minute load average, followed the way the kernel follows the load.

    Every sample folds the cores our processes used since the last one into an exponential mean with
    the load average's one-minute constant. The kernel counts runnable threads where this counts CPU
    used: a thread waiting for a core counts there and not here, so on a contended machine the share
    is underestimated and the load left to others overestimated, the cautious side."""

    def __init__(self, read: Callable[[], tuple[float, dict[int, float]]] = _our_cpu_seconds,
                 alive: Callable[[int], bool] = psutil.pid_exists, clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._alive, self._clock = read, alive, clock
        self._lock = threading.Lock()  # housekeeping's thread and an engine start may sample at once
        self._total = 0.0  # CPU seconds of all our processes at the last sample (never decreases)
        self._seen: dict[int, float] = {}  # running pid -> its CPU seconds at the last sample
        self._rates: dict[int, float] = {}  # running pid -> cores it used between the last two samples
        self._leaving: set[int] = set()  # pids being stopped (a model evicted): no new engine shares cores with them
        self._at: float | None = None
        self.smoothed = 0.0  # cores our processes used, as a one-minute exponential mean
        self.last_choice: dict[str, Any] | None = None  # what the last engine start saw and chose

    def due(self, min_span: float) -> bool:
        """Whether the last sample (housekeeping's or an engine start's) is `min_span` seconds old or more."""
        return self._at is None or self._clock() - self._at >= min_span

    def sample(self, min_span: float = 0.0) -> None:
        """Fold in what our processes used since the last sample, unless that was under `min_span` ago."""
        now = self._clock()
        if not self.due(min_span):
            return
        total, running = self._read()
        with self._lock:
            if self._at is not None and now <= self._at:
                return  # another thread sampled later while this one read
            if self._at is not None:
                span = now - self._at
                # a process started since the last sample used all its time within the span
                self._rates = {pid: max(0.0, cpu - self._seen.get(pid, 0.0)) / span for pid, cpu in running.items()}
                decay = math.exp(-span / LOAD_WINDOW_SECONDS)
                # the total dips while an ended process waits to be reaped: count from the highest seen
                self.smoothed = self.smoothed * decay + max(0.0, total - self._total) / span * (1.0 - decay)
            self._seen, self._at, self._total = running, now, max(self._total, total)
            self._leaving &= running.keys()

    def leaving(self, pid: int | None) -> None:
        """A process of ours is being stopped (its model evicted): the next engine often starts before it has
        exited (a swap), and what it used while it served is no work that engine will share the cores with."""
        if pid is not None:
            with self._lock:
                self._leaving.add(pid)

    def others(self, load: float) -> float:
        """The part of `load` that is not ours, plus what our processes still running (and not leaving)
        used lately: what a new engine would share the cores with. Before any sample, all of `load`."""
        with self._lock:
            rates = {pid: rate for pid, rate in self._rates.items() if pid not in self._leaving}
            smoothed = self.smoothed
        still_running = sum(rate for pid, rate in rates.items() if self._alive(pid))
        return max(0.0, load - smoothed + still_running)

    def describe(self) -> dict[str, Any] | None:
        """For /v1/health: the load average, our share of it, what a new engine would count as busy now,
        and what the last engine started saw and chose (`threads` null: one per core)."""
        try:
            load = os.getloadavg()[0]
        except OSError:
            return None
        return {"load_average": round(load, 2), "ours": round(self.smoothed, 3), "others": round(self.others(load), 2),
                "last_engine_start": self.last_choice}


OWN_LOAD = OwnLoad()


def thread_args(user_args: list[str], engine: str) -> list[str]:
    """`-t N` for an engine about to start on a busy machine, unless the user chose a thread count."""
    if any(a in THREAD_FLAGS or a.startswith("--threads=") for a in user_args):
        return []
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform (Windows): keep the engine's default
        return []
    try:  # what our processes used since housekeeping's last sample (an engine stopped for this one)
        OWN_LOAD.sample(min_span=FRESH_SAMPLE_SECONDS)
    except psutil.Error:
        log.debug("Could not read this server's CPU use", exc_info=True)
    others = OWN_LOAD.others(load)
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    threads = threads_for_load(cores, others)
    OWN_LOAD.last_choice = {"engine": engine, "load_average": round(load, 2), "others": round(others, 2),
                            "threads": threads}
    if threads is None:
        if load >= 1.0 > others:
            log.info("Load average %.1f, %.1f of it left by this server's own earlier work: %s keeps one compute "
                     "thread per core", load, load - others, engine)
        return []
    log.info("The CPU is busy (load average %.1f on %d cores, %.1f of it other work): %s runs %d compute "
             "thread%s instead of %d, so that its threads do not stall waiting for each other; `-t N` in "
             "llamacpp.args sets the count", load, cores, others, engine, threads, "" if threads == 1 else "s", cores)
    return ["-t", str(threads)]
