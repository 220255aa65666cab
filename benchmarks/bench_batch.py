"""llama-server's batch size (`-b`, n_batch) on a CPU: what a smaller one costs and what it gives.

Why: llama-server reads a prompt `n_batch` tokens at a time (2,048 by default) and does nothing else
meanwhile: it checks whether the prompt's client is still there, and gives the other slots their next
token, only between batches. On 2 cores a batch of 2,048 tokens of Gemma 3 270M takes many seconds,
so every stream beside a long prompt stalls that long, and a client that hangs up keeps the engine
busy until the batch ends (docs/performance.md, "Long prompts"). A batch of one ubatch (512, the
default `-ub`) is the same computation in smaller steps; this measures what it costs.

Through our server (the shipped defaults; the model loaded with `llamacpp_args` `-b 2048`, llama-server's
default, then `-b 512`, alternately, `--rounds` times each), on the real Gemma 3 270M:

1. **Prompt reading**: a prompt of `--prompt-tokens` tokens (new text each time), one token answered:
   the engine's own `prompt_per_second`.
2. **A stream beside a long prompt**: a stream of 120 tokens starts; a second later that prompt
   arrives on another slot. The stream's longest gap between two tokens, and the prompt's time to its
   first token.

It prints medians and the ratio of the two settings; it never asserts.

    .venv/bin/python benchmarks/bench_batch.py [--rounds 3] [--prompt-tokens 4000]

Every process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    long_text,
    new_cache,
    start_server,
)

MODEL = "gemma"
# Both with the machine's 2 threads: the server's own choice follows the load average, which this
# benchmark itself raises, so it would give one setting's rounds fewer threads than the other's.
SETTINGS = {"stock (-b 2048)": "-t 2 -b 2048", "-b 512": "-t 2 -b 512"}


async def read_prompt(c: httpx.AsyncClient, words: int, seed: int) -> float:
    """The engine's prompt reading speed (tokens/s) for a new prompt of about `words` tokens."""
    r = await c.post("/v1/completions", json={"model": MODEL, "prompt": long_text(words, seed), "max_tokens": 1})
    r.raise_for_status()
    return float(r.json()["timings"]["prompt_per_second"])


async def beside(c: httpx.AsyncClient, words: int, seed: int) -> tuple[float, float]:
    """(the stream's longest gap between tokens, the long prompt's time to first token), in seconds."""
    gaps: list[float] = []

    async def stream() -> None:
        body = {"model": MODEL, "prompt": f"Count slowly {seed}: one two", "max_tokens": 120, "stream": True,
                "temperature": 0}
        last = None
        async with c.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                text = json.loads(line[6:])["choices"][0].get("text")
                if text:
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now

    async def prompt() -> float:
        await asyncio.sleep(1.0)
        started = time.perf_counter()
        body = {"model": MODEL, "prompt": long_text(words, seed), "max_tokens": 1, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return time.perf_counter() - started
        return time.perf_counter() - started

    _, ttft = await asyncio.gather(stream(), prompt())
    return max(gaps, default=0.0), ttft


async def one_round(url: str, args: str, words: int, seed: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=3600) as c:
        r = await c.post("/v1/load", json={"model_name": MODEL, "llamacpp_args": args})
        r.raise_for_status()
        speed = await read_prompt(c, words, seed)
        gap, ttft = await beside(c, words, seed + 1)
        await c.post("/v1/unload", json={"model_name": MODEL})
    return {"prompt_tokens_per_s": speed, "longest_gap_s": gap, "long_prompt_ttft_s": ttft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="at most 5 (every prompt a text of its own)")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    args = parser.parse_args()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        root = Path(tmp)
        models = root / "models"
        gemma_copies(models, (MODEL,))
        port = free_port()
        server = start_server(procs, new_cache(root, "cache", backend_dir()), models, port, root / "server.log")
        results: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
        try:
            print(f"load average {load_avg()} before", flush=True)
            for r in range(args.rounds):
                order = list(SETTINGS.items()) if r % 2 == 0 else list(reversed(SETTINGS.items()))
                for i, (name, engine_args) in enumerate(order):
                    # a text of its own for every prompt (long_text has 20: the seed modulo 20), so that no
                    # slot restored by the warm swaps of the previous load holds it
                    seed = (2 * (2 * r + i)) % 20
                    got = asyncio.run(one_round(f"http://127.0.0.1:{port}", engine_args, args.prompt_tokens, seed))
                    results[name].append(got)
                    print(f"  round {r + 1} {name}: {got}", flush=True)
            print(f"load average {load_avg()} after\n")
        finally:
            procs.stop(server)
    medians: dict[str, dict[str, Any]] = {
        name: {key: statistics.median(row[key] for row in rows) for key in rows[0]} for name, rows in results.items()}
    stock, small = medians["stock (-b 2048)"], medians["-b 512"]
    print("| figure (median) | stock (-b 2048) | -b 512 | ratio |")
    print("|---|---|---|---|")
    for key in stock:
        print(f"| {key} | {stock[key]:.2f} | {small[key]:.2f} | {small[key] / stock[key]:.3f} |")


if __name__ == "__main__":
    main()
