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
"""

from __future__ import annotations

import logging
import os

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


def thread_args(user_args: list[str], engine: str) -> list[str]:
    """`-t N` for an engine about to start on a busy machine, unless the user chose a thread count."""
    if any(a in THREAD_FLAGS or a.startswith("--threads=") for a in user_args):
        return []
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform (Windows): keep the engine's default
        return []
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    threads = threads_for_load(cores, load)
    if threads is None:
        return []
    log.info("The CPU is busy (load average %.1f on %d cores): %s runs %d compute thread%s instead of %d, so "
             "that its threads do not stall waiting for each other; `-t N` in llamacpp.args sets the count",
             load, cores, engine, threads, "" if threads == 1 else "s", cores)
    return ["-t", str(threads)]
