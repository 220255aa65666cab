"""Swaps on a quiet CPU: does the engine loaded after a swap get the cores its predecessor had?

Why: the server gives a CPU engine fewer compute threads when the machine is busy as it starts
(backends/cpu_share.py), judged by the 1-minute load average. That average still holds a minute of the
engine just unloaded: after a minute of work by model A, model B (loaded in A's place, one model at a
time) used to start with one thread on a 2-core machine that nothing else used, and read prompts at
about half the speed for as long as it stayed loaded. Since the server counts its own processes'
share of the load (`OwnLoad`), it should not.

One server with the shipped defaults (`max_loaded_models` 1) and Gemma 3 270M under two names. Each
round loads the other model and keeps it busy for `--work` seconds with new ~2,000-token prompts (one
model's work, then the swap); printed per round: the thread count the engine was started with (`-t`
in its launch command; none means one per core), the load average before the round and what the
thread choice saw (`/v1/health` `cpu_load.last_engine_start`), and the prompt speed (llama-server's own
`timings`). The reference is the first round: a load on a quiet machine (the script waits for a load
average below `--max-load`).

    .venv/bin/python benchmarks/bench_swap_threads.py [--rounds 4] [--work 45]

Results: docs/performance.md ("Threads after a swap"). It prints figures and never asserts; every
process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import (  # noqa: E402 - sibling module, not a package
    Processes,
    backend_dir,
    free_port,
    gemma_copies,
    load_avg,
    new_cache,
    start_server,
    wait_for_load,
)

A, B = "swap-a", "swap-b"


def prompt(seed: int) -> str:
    """About 2,000 tokens no earlier prompt begins with, so nothing is read from cache."""
    return f"Text {seed}. " + " ".join(f"lemon{(i * 7 + seed) % 41} river{i % 13} stone{(i + seed) % 5}"
                                       for i in range(280))


def threads_of(launch: list[str]) -> str:
    """The `-t` value of a launch command, or the engine's default."""
    for flag, value in zip(launch, launch[1:], strict=False):
        if flag in ("-t", "--threads"):
            return value
    return "default (one per core)"


def work(http: httpx.Client, model: str, seconds: float, seed: int) -> dict[str, Any]:
    """Load `model` (the other one leaves) and keep it reading new prompts for `seconds`."""
    load = os.getloadavg()[0]
    speeds: list[float] = []
    started = time.monotonic()
    health: dict[str, Any] = {}
    while time.monotonic() - started < seconds:
        body = {"model": model, "messages": [{"role": "user", "content": prompt(seed + len(speeds))}],
                "max_tokens": 1, "temperature": 0}
        resp = http.post("/v1/chat/completions", json=body)
        resp.raise_for_status()
        timings = resp.json()["timings"]
        speeds.append(timings["prompt_n"] / timings["prompt_ms"] * 1000)
        if not health:
            health = http.get("/v1/health").json()
    launch = next(m["launch_command"] for m in health["all_models_loaded"] if m["model_name"] == model)
    start = (health.get("cpu_load") or {}).get("last_engine_start")  # None from a server without it
    return {"model": model, "load_at_load": load, "start": start, "threads": threads_of(launch),
            "first_speed": speeds[0], "mean_speed": statistics.mean(speeds), "prompts": len(speeds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--work", type=float, default=45.0, help="seconds of prompts per round")
    parser.add_argument("--max-load", type=float, default=1.0,
                        help="wait (at most 300 s) for a load average below this first; 0 starts at once")
    args = parser.parse_args()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-swap-threads-") as tmp:
        root = Path(tmp)
        models = root / "models"
        gemma_copies(models, (A, B))
        port = free_port()
        wait_for_load(args.max_load or None, 300)
        print(f"load average {load_avg()} before", flush=True)
        server = start_server(procs, new_cache(root, "cache", backend_dir()), models, port, root / "server.log")
        try:
            rounds = []
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1800) as http:
                for i in range(args.rounds):
                    rounds.append(work(http, (A, B)[i % 2], args.work, seed=1000 * i))
                    r = rounds[-1]
                    print(f"round {i} ({'first load' if i == 0 else 'after a swap'}, {r['model']}): load average "
                          f"{r['load_at_load']:.2f} before, {r['start']}; threads {r['threads']}; "
                          f"prompt speed first {r['first_speed']:.0f}, mean {r['mean_speed']:.0f} tokens/s over "
                          f"{r['prompts']} prompts", flush=True)
        finally:
            procs.stop(server)
        print(f"load average {load_avg()} after\n")
    reference = rounds[0]["mean_speed"]
    for i, r in enumerate(rounds[1:], 1):
        print(f"after swap {i}: threads {r['threads']}, mean prompt speed {r['mean_speed'] / reference:.2f}x "
              f"the first load's")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
