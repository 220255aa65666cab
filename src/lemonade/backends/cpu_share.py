"""How many compute threads an engine asks for when other processes already hold the CPU.

llama-server runs one compute thread per physical core by default, and its threads meet at a
barrier after every operation of the graph (hundreds per token). When other processes keep the
cores busy, one of those threads is often waiting for a core, and the others spin at the barrier
until it gets one: each token then costs many scheduler ticks instead of a few milliseconds. On the
2-core test machine, with the load average at 17 from other work, Gemma 3 270M generated 0.7
tokens/s with the default 2 threads and 8.7 with 1 (docs/performance.md, "Threads"); a 40-token
reply took over 100 s, which is how a chat test on a busy new machine ran out of time. stable-diffusion.cpp
has the same lockstep threads: a 64x64 Flux.2 Klein picture took 66 s with 2 threads and 28 s with 1 there.

So when the machine is already busy as an engine starts, the engine asks for the cores left free, at
least half of them (one on a 2-core machine), instead of all of them. A quiet machine keeps the
engine's default. The user's own thread count (`-t` in `llamacpp.args`, a model's options or a
profile) always wins. Busy means both: the 1-minute load average is at least 1, and so are the cores
kept busy over a tenth of a second as the engine starts. The load average alone still counts, for a
minute, work that has just ended: an engine started right after a build, a benchmark's previous
phase or another model's long answer got half the cores on a machine that was by then idle
(docs/warm-swaps.md: Gemma 3 270M read a 3,434-token prompt in 12.7 s on one thread, 6.4 s on two).
The load is read once, at start: an engine started on a busy machine keeps its smaller count after
the machine quiets down (a reload picks the count again).
"""

from __future__ import annotations

import asyncio
import logging
import os

import psutil

log = logging.getLogger("lemonade.backends")
THREAD_FLAGS = ("-t", "--threads")
SAMPLE_SECONDS = 0.1  # how long the cores' use is sampled as an engine starts on a machine whose load average is high


def threads_for_load(physical_cores: int, load: float) -> int | None:
    """Compute threads for an engine (llama-server, sd-server) when `load` (1-minute load average) of
    other work is on a machine with `physical_cores`; None for the engine's default (one per core)."""
    if physical_cores <= 1 or load < 1.0:
        return None
    free = int(physical_cores - load)
    # Never below half the cores: the load is read once, and a machine busy for a moment (a build that
    # just ended) must not leave a large machine's engine on one thread until it is reloaded.
    return max(1, physical_cores // 2, min(free, physical_cores - 1))


async def busy_cores(physical_cores: int, seconds: float = SAMPLE_SECONDS) -> float | None:
    """How many of the machine's cores other processes kept busy over the last `seconds` (None:
    unreadable). This server's own process is left out: it is busy itself as a load starts (a request
    arriving, the server just started), which takes no core from the engine once it runs."""
    own = psutil.Process()
    before, mine = psutil.cpu_times(), own.cpu_times()
    await asyncio.sleep(seconds)
    after, mine_after = psutil.cpu_times(), own.cpu_times()
    total = sum(after) - sum(before)
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
    ours = (mine_after.user + mine_after.system) - (mine.user + mine.system)
    if total <= 0:
        return None
    return max(0.0, total - idle - ours) / total * physical_cores


async def thread_args(user_args: list[str], engine: str) -> list[str]:
    """`-t N` for an engine about to start on a busy machine, unless the user chose a thread count."""
    if any(a in THREAD_FLAGS or a.startswith("--threads=") for a in user_args):
        return []
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform (Windows): keep the engine's default
        return []
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if threads_for_load(cores, load) is None:
        return []
    now = await busy_cores(cores)
    if now is not None and now < load:  # the load average still counts work that has just ended
        load = now
    threads = threads_for_load(cores, load)
    if threads is None:
        log.info("The 1-minute load average is %.1f on %d cores, but only %.1f are busy now: %s runs its "
                 "default compute threads", os.getloadavg()[0], cores, load, engine)
        return []
    log.info("The CPU is busy (load %.1f on %d cores): %s runs %d compute thread%s instead of %d, so "
             "that its threads do not stall waiting for each other; `-t N` in llamacpp.args sets the count",
             load, cores, engine, threads, "" if threads == 1 else "s", cores)
    return ["-t", str(threads)]
