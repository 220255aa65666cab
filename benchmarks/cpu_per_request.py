"""Our server's CPU per `max_tokens=1` chat request, for one or more source trees, in alternating rounds.

Why: on a 2-core machine the proxy's added latency is mostly its CPU per request, and the latency of
a small request is too noisy to compare two versions of the code by (the engine's own time varies by
several ms between requests). CPU time of the server process over a few hundred sequential requests
is steadier. Give it the `src` folders of two checkouts (e.g. a `git worktree` of the commit before a
change, and this one) and it starts a server from each in turn, A/B then B/A, each with the real
Gemma 3 270M and the installed cpu llama.cpp (as bench_serving.py does), and prints CPU per request
and the median latency for each round and tree.

    .venv/bin/python benchmarks/cpu_per_request.py /path/to/old/src,src [--rounds 3] [-n 300]

It includes the server's background work while the requests run (timers, the engine output pump),
so it is a cost per request at this request rate, not the critical path alone. Every server it
starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_serving import (  # noqa: E402
    GEMMA_NAME,
    backend_dir,
    chat_body,
    free_port,
    gemma_dir,
    lemonade_env,
    new_cache,
    serve_argv,
    wait_ok,
)


def one_round(tree: Path, n: int, root: Path) -> tuple[float, float]:
    """(CPU ms per request, median latency ms) of `n` sequential requests to a server run from `tree`."""
    cache = new_cache(root, f"cache-{time.monotonic_ns()}", backend_dir())
    port = free_port()
    env = {**lemonade_env(cache, gemma_dir()), "LEMONADE_AUTO_TUNE": "false", "PYTHONPATH": str(tree)}
    with open(cache / "server.log", "w") as log:
        proc = subprocess.Popen(serve_argv(port), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/live", proc, 60)
        with httpx.Client(base_url=url, timeout=120) as client:
            if client.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code != 200:
                raise RuntimeError(f"{tree}: the model did not load; see {cache / 'server.log'}")
            body = chat_body("Hi", 1)
            for _ in range(30):  # warm-up: connections, caches, the engine's prompt cache
                client.post("/v1/chat/completions", json=body)
            server = psutil.Process(proc.pid)
            before = server.cpu_times()
            latencies = []
            for _ in range(n):
                start = time.perf_counter()
                resp = client.post("/v1/chat/completions", json=body)
                latencies.append((time.perf_counter() - start) * 1000)
                if resp.status_code != 200:
                    raise RuntimeError(f"{tree}: HTTP {resp.status_code}: {resp.text[:300]}")
            after = server.cpu_times()
        cpu = (after.user + after.system - before.user - before.system) * 1000 / n
        return cpu, statistics.median(latencies)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", help="comma-separated `src` folders to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=300, help="requests per round")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    cpu: dict[Path, list[float]] = {t: [] for t in trees}
    p50: dict[Path, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="lemonade-cpu-") as tmp:
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                c, lat = one_round(tree, args.n, Path(tmp))
                cpu[tree].append(c)
                p50[tree].append(lat)
                print(f"round {r + 1} {tree}: {c:.3f} ms CPU per request, latency p50 {lat:.2f} ms", flush=True)
    for tree in trees:
        print(f"{tree}: CPU per request median {statistics.median(cpu[tree]):.3f} ms "
              f"(rounds {', '.join(f'{x:.3f}' for x in cpu[tree])}); latency p50 per round "
              f"{', '.join(f'{x:.1f}' for x in p50[tree])} ms")


if __name__ == "__main__":
    main()
