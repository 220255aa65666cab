"""Model swapping benchmark: two chat models competing for one slot, as two apps would.

Why: with `max_loaded_models=1`, requests alternating between two models once livelocked the
server (1,196 loads for 48 requests). This measures the scenario of that report and the same run
with `max_loaded_models=2` as the reference: 24 concurrent clients send 48 small chat requests
(a third streamed), each client alternating between Gemma 3 270M under two names. It prints
completions, loads and swaps against the minimum, and latency p50/p99; it never asserts.

    .venv/bin/python benchmarks/bench_swapping.py [--clients 24] [--requests 48]

Results: docs/performance.md ("Model swapping"). Every process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
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
    lemonade_env,
    load_avg,
    new_cache,
    pct,
    serve_argv,
    wait_ok,
)

MODELS = ("swap-a", "swap-b")


async def one_client(c: httpx.AsyncClient, index: int, numbers: range, latencies: list[float],
                     failures: list[str]) -> None:
    """Requests `numbers` one after another, alternating between the two models."""
    for j, n in enumerate(numbers):
        body: dict[str, Any] = {"model": MODELS[(index + j) % 2], "max_tokens": 8,
                                "messages": [{"role": "user", "content": f"Say hello #{n}"}]}
        started = time.perf_counter()
        outcome = "ok"
        try:
            if n % 3 == 0:
                async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    text = "".join([chunk async for chunk in r.aiter_text()])
                    if r.status_code != 200 or "[DONE]" not in text:
                        outcome = f"stream {r.status_code}"
            else:
                r = await c.post("/v1/chat/completions", json=body)
                if r.status_code != 200 or not r.json().get("choices"):
                    outcome = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        if outcome == "ok":
            latencies.append(time.perf_counter() - started)
        else:
            failures.append(f"request {n}: {outcome}")


async def sample_load(samples: list[float], every: float = 1.0) -> None:
    """The 1-minute load average every `every` s until cancelled: how busy the machine was meanwhile."""
    while True:
        samples.append(os.getloadavg()[0])
        await asyncio.sleep(every)


async def scenario(url: str, clients: int, requests: int, timeout: float) -> dict[str, Any]:
    latencies: list[float] = []
    failures: list[str] = []
    loads: list[float] = []
    sampler = asyncio.ensure_future(sample_load(loads))
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as c:
        # Client i sends requests i, i + clients, ...: exactly `requests` in all, also when uneven.
        await asyncio.gather(*(one_client(c, i, range(i, requests, clients), latencies, failures)
                               for i in range(clients)))
        wall = time.perf_counter() - started
        sampler.cancel()
        queue = (await c.get("/v1/health")).json()["queue"]
    return {"completed": len(latencies), "sent": requests, "failures": failures,
            "wall_s": wall, "latencies": latencies, "queue": queue,
            "load": (loads[0], max(loads), os.getloadavg()[0])}


def run_one(limit: int, args: argparse.Namespace, procs: Processes, root: Path, models: Path) -> dict[str, Any]:
    cache = new_cache(root, f"cache-{limit}", backend_dir())
    (cache / "config.json").write_text(json.dumps({"max_loaded_models": limit, "auto_check_model_updates": False}))
    port = free_port()
    proc = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=root / f"server-{limit}.log")
    url = f"http://127.0.0.1:{port}"
    wait_ok(url + "/live", proc, 60)
    result = asyncio.run(scenario(url, args.clients, args.requests, args.timeout))
    procs.stop(proc)
    return result


def report(limit: int, r: dict[str, Any]) -> None:
    q = r["queue"]
    lat = r["latencies"] or [float("nan")]
    start, high, end = r["load"]
    print(f"max_loaded_models={limit}: {r['completed']}/{r['sent']} completed in {r['wall_s']:.1f} s; "
          f"loads {q['loads_total']} (minimum 2), swaps {q['swaps_total']}, waits {q['waits_total']}, "
          f"p50 {pct(lat, 50):.2f} s, p99 {pct(lat, 99):.2f} s, max {max(lat):.2f} s; "
          f"1-min load average at start / highest / end: {start:.2f} / {high:.2f} / {end:.2f}")
    if r["failures"]:
        print("  failures: " + ", ".join(r["failures"][:10]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=24, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=48, help="requests in all, shared out among the clients")
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    args = parser.parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally block stops every process we started

    signal.signal(signal.SIGTERM, on_term)
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-swap-") as tmp:
        root = Path(tmp)
        models = root / "models"
        gemma_copies(models, MODELS)
        print(f"{args.clients} clients, {args.requests} requests alternating between two models; load {load_avg()}")
        try:
            for limit in (1, 2):
                report(limit, run_one(limit, args, procs, root, models))
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
