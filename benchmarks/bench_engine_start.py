"""How long an engine takes to start: llama-server's own fitting on and off (issue 40, part 4).

Why: a swap's time to first token is mostly the next engine's start (docs/warm-swaps.md: 0.86 of
1.22 s). llama-server, since it has `--fit` (on by default), first measures whether the model and
context fit the devices' memory, loading the model's metadata and vocabulary once more before the real
load; on the cpu backend the context and placement are this server's own (`backends/llamacpp/engine.py`
`fit_args`), so the server now starts it with `--fit off`.

One server with the shipped defaults loads Gemma 3 270M `--loads` times (load, then unload: the
time of `POST /v1/load` through this server, warm-swap restore included) and gives its engine's
launch command (`/v1/health`). That command is then started `--runs` times each as shipped (with
`--fit off`) and without it (llama-server's default), alternating, each from spawn to the first 200
of its `/health` (asked every 5 ms). It prints the medians and minimums and their ratio; it never
asserts. Results: docs/performance.md ("Engine start").

    .venv/bin/python benchmarks/bench_engine_start.py [--runs 8] [--loads 4] [--max-load 1.0]

Every process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    wait_ok,
)

MODEL = "start-a"


def through_server(procs: Processes, root: Path, loads: int) -> tuple[list[str], list[float]]:
    """The engine's launch command as the server builds it, and the wall time of each `/v1/load`."""
    models = root / "models"
    gemma_copies(models, (MODEL,))
    port = free_port()
    server = start_server(procs, new_cache(root, "cache", backend_dir()), models, port, root / "server.log")
    try:
        seconds: list[float] = []
        launch: list[str] = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            for _ in range(loads):
                started = time.perf_counter()
                http.post("/v1/load", json={"model_name": MODEL}).raise_for_status()
                seconds.append(time.perf_counter() - started)
                health = http.get("/v1/health").json()
                launch = next(m["launch_command"] for m in health["all_models_loaded"] if m["model_name"] == MODEL)
                http.post("/v1/unload", json={"model_name": MODEL}).raise_for_status()
    finally:
        procs.stop(server)
    return launch, seconds


def without_fit_off(argv: list[str]) -> list[str]:
    """The command with llama-server's default fitting: its `--fit off` taken out."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--fit" and i + 1 < len(argv) and argv[i + 1] == "off":
            skip = True
            continue
        out.append(arg)
    return out


def with_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out


def start_once(procs: Processes, argv: list[str], log: Path) -> float:
    """Spawn to the first 200 of `/health`, in seconds; the engine is stopped after."""
    port = free_port()
    started = time.perf_counter()
    proc = procs.start(with_port(argv, port), log=log)
    try:
        wait_ok(f"http://127.0.0.1:{port}/health", proc, 120)
        return time.perf_counter() - started
    finally:
        procs.stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=8, help="engine starts per side")
    parser.add_argument("--loads", type=int, default=4, help="loads through the server")
    parser.add_argument("--max-load", type=float, default=1.0,
                        help="wait (at most 300 s) for a load average below this first; 0 starts at once")
    args = parser.parse_args()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-engine-start-") as tmp:
        root = Path(tmp)
        wait_for_load(args.max_load or None, 300)
        print(f"load average {load_avg()} before", flush=True)
        try:
            launch, loads = through_server(procs, root, args.loads)
            if "--fit" not in launch:
                print("note: this server's launch command has no --fit off (an older build, or a llama-server "
                      "without the flag): both sides below are the same command")
            sides = {"shipped (--fit off)": launch, "llama-server's default (fit on)": without_fit_off(launch)}
            times: dict[str, list[float]] = {name: [] for name in sides}
            for i in range(args.runs):
                order = list(sides.items()) if i % 2 == 0 else list(sides.items())[::-1]
                for name, argv in order:
                    times[name].append(start_once(procs, argv, root / "engine.log"))
        finally:
            procs.stop_all()
        print(f"load average {load_avg()} after\n")
    print(f"through this server: POST /v1/load of Gemma 3 270M (then unloaded), {len(loads)} loads: median "
          f"{statistics.median(loads):.3f} s, min {min(loads):.3f} s")
    for name, values in times.items():
        print(f"engine spawn to /health 200, {name}: median {statistics.median(values):.3f} s, "
              f"min {min(values):.3f} s ({', '.join(f'{v:.3f}' for v in values)})")
    shipped, default = (statistics.median(v) for v in times.values())
    print(f"shipped / default: {shipped / default:.2f}x (median)")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
