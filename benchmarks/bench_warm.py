"""Warm swaps: what a conversation keeps across a swap and a restart, and what slot routing saves.

Why: a swap used to throw away every token a model had read (0 cached after one request to another
model; 0 after a restart). Four figures, each against a reference measured in the same run:

1. swap: `max_loaded_models` 1, conversation A with a ~2,000-token system prompt, one request to
   model B, then A's next turn: the share of A's earlier prompt served from cache
   (`usage.prompt_tokens_details.cached_tokens`) and A's prefill time (llama-server's `prompt_ms`)
   against the cold prefill of its first turn; and swap-to-first-token latency (unload, load, restore,
   first token) p50/p99 with the model file in the page cache and evicted from it;
2. the same after the server is stopped and started again;
3. 8 conversations sharing a 1,500-token system prompt with growing histories, all at once and taking
   turns one request at a time (`--conversations-only`: this figure alone; `--swaps-only`: all but it
   and the window layers), on the shipped slot layout
   (8 slots, one shared cache): prompt tokens the engine computed and mean time to first token,
   through this server against llama-server started with the launch command of before
   (the same model, context and slots; llama-server's own slot choice and idle-slot caching);
4. 16 simultaneous requests for a model that is not loaded: loads and answers;
and, for the choice of how a sliding-window model keeps its window layers (Gemma 3: five layers in
six), llama-server alone both ways: context checkpoints (its default) and the full window cache
(`--swa-full`), what each costs in memory and how much of a conversation a saved and restored slot
gives back.

    .venv/bin/python benchmarks/bench_warm.py [--swaps 6] [--turns 4]

Results: docs/performance.md ("Warm swaps"). It prints figures and never asserts. Every process it
starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import (  # noqa: E402 - sibling module, not a package
    Processes,
    backend_dir,
    free_port,
    gemma_dir,
    load_avg,
    new_cache,
    pct,
    start_server,
    wait_for_load,
    wait_ok,
)

A, B = "warm-a", "warm-b"
# Figure 3's shared system prompt: 663 words of `system_prompt` are about 1,500 tokens of Gemma 3's
# tokenizer (6.8 a "lemonN riverN stoneN" triple); a first turn's `prompt_n` is printed (it adds the
# first question, about 155 tokens)
SYSTEM_WORDS = 663


def system_prompt(words: int, seed: int = 0) -> str:
    return " ".join(f"lemon{(i + seed) % 37} river{i % 11} stone{i % 7}" for i in range(words // 3))


async def chat(c: httpx.AsyncClient, model: str | None, messages: list[dict], path: str = "/v1/chat/completions",
               max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    if model:
        body["model"] = model
    started = time.perf_counter()
    resp = await c.post(path, json=body)
    resp.raise_for_status()
    out = resp.json()
    out["_seconds"] = time.perf_counter() - started
    return out


async def streamed(c: httpx.AsyncClient, model: str | None, messages: list[dict], max_tokens: int = 16
                   ) -> tuple[float, dict[str, Any], str]:
    """(seconds to the first token, the engine's timings, the text) of a streamed chat request."""
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if model:
        body["model"] = model
    started = time.perf_counter()
    first, timings, text = None, {}, []
    async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter() - started
                    text.append(piece)
            timings = event.get("timings") or timings
    return first if first is not None else time.perf_counter() - started, timings, "".join(text)


def cached(answer: dict[str, Any]) -> int:
    details = answer.get("usage", {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or answer.get("timings", {}).get("cache_n") or 0)


def evict_page_cache(path: Path) -> None:
    """Drop a file's pages from the page cache (the kernel keeps pages that are mapped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def swap_figures(url: str, gguf: Path, swaps: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=1800) as c:
        convo = [{"role": "system", "content": system_prompt(2000)}, {"role": "user", "content": "Name a fruit."}]
        first = await chat(c, A, convo)
        prefix = first["usage"]["prompt_tokens"]
        cold_ms = first["timings"]["prompt_ms"]
        latencies: dict[str, list[float]] = {"page cache warm": [], "page cache evicted": []}
        share, prefill = [], []
        for i in range(swaps):
            await chat(c, B, [{"role": "user", "content": f"Hello {i}"}])
            kind = "page cache evicted" if i % 2 else "page cache warm"
            if i % 2:
                evict_page_cache(gguf)
            convo = convo + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"Another {i}."}]
            answer = await chat(c, A, convo, max_tokens=1)
            latencies[kind].append(answer["_seconds"])
            share.append(cached(answer) / prefix)
            prefill.append(answer["timings"]["prompt_ms"] / cold_ms)
        return {"prefix_tokens": prefix, "cold_prefill_ms": cold_ms, "cached_share": share, "prefill_ratio": prefill,
                "latencies": latencies, "convo": convo}


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
EVICTING = re.compile(r"Evicting (\S+) .* to make room for (\S+) ")
LOADING = re.compile(r"\(lemonade\.router\) Loading (\S+) ")
LOADED = re.compile(r"\(lemonade\.router\) Loaded (\S+) in ([0-9.]+)s")


def swap_steps(log: Path) -> dict[str, list[float]]:
    """From the server's own log, each swap's steps: seconds from the eviction to the next model's load
    starting (a wait for the evicted engine's exit showed here), and the load itself (engine start and
    restore)."""
    out: dict[str, list[float]] = {"eviction to the next load's start": [], "load (engine start, restore)": []}
    evicted_for: dict[str, datetime] = {}
    swapping_in: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        stamp = LOG_TIME.match(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if (m := EVICTING.search(line)) is not None:
            evicted_for[m.group(2)] = at
        elif (m := LOADING.search(line)) is not None and m.group(1) in evicted_for:
            out["eviction to the next load's start"].append((at - evicted_for.pop(m.group(1))).total_seconds())
            swapping_in.add(m.group(1))
        elif (m := LOADED.search(line)) is not None and m.group(1) in swapping_in:
            swapping_in.discard(m.group(1))
            out["load (engine start, restore)"].append(float(m.group(2)))
    return out


async def restart_figure(url: str, convo: list[dict], prefix: int, cold_ms: float) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=1800) as c:
        answer = await chat(c, A, convo + [{"role": "assistant", "content": "ok"},
                                           {"role": "user", "content": "After the restart."}], max_tokens=1)
        return {"cached_share": cached(answer) / prefix, "prefill_ratio": answer["timings"]["prompt_ms"] / cold_ms}


async def conversations(url: str, model: str | None, turns: int, together: bool, n: int = 8) -> dict[str, float]:
    """`n` conversations sharing a 1,500-token system prompt, `turns` turns each: all at once
    (`together`), or taking turns one request at a time (each conversation's turn t, then the next
    one's: users of one app at different moments)."""
    system = {"role": "system", "content": system_prompt(SYSTEM_WORDS)}
    computed, ttft, first_turns = [], [], []
    histories = [[system] for _ in range(n)]
    # a connection per request: llama-server closes an idle kept-alive one after 5 s, and a request sent
    # on it just then is lost ("Server disconnected without sending a response")
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        async def turn(k: int, t: int) -> None:
            messages = histories[k]
            messages.append({"role": "user", "content": f"Conversation {k}, question {t}: "
                                                        + system_prompt(60, seed=k * 10 + t)})
            seconds, timings, text = await streamed(c, model, messages)
            computed.append(int(timings.get("prompt_n") or 0))
            ttft.append(seconds)
            if t == 0:
                first_turns.append(computed[-1])
            messages.append({"role": "assistant", "content": text})

        async def one(k: int) -> None:
            for t in range(turns):
                await turn(k, t)
        if together:
            await asyncio.gather(*(one(k) for k in range(n)))
        else:
            for t in range(turns):
                for k in range(n):
                    await turn(k, t)
    return {"prompt_tokens_computed": sum(computed), "mean_ttft_s": statistics.mean(ttft), "requests": len(ttft),
            "first_read": max(first_turns)}  # a first turn read in full: the system prompt and one question


def conversation_figures(procs: Processes, root: Path, models: Path, gguf: Path, turns: int,
                         max_load: float | None = None) -> dict[bool, tuple[dict[str, float], dict[str, float]]]:
    """Figure 3 both ways: (through this server, stock llama-server) for together and in turns, each
    on a fresh engine and a cache dir of its own (a server started on `cache` would restore the
    conversations the last one saved there, filling its slots and its KV cache before the first turn).
    With `max_load`, each side starts once the load average is below it: the server gives an engine
    started on a busy CPU one compute thread (backends/cpu_share.py), and the load the previous side
    left would otherwise halve this server's engine against stock llama-server's two."""
    out = {}
    for together in (True, False):
        port = free_port()
        wait_for_load(max_load, 300)
        server = start_server(procs, new_cache(root, f"cache-conv-{together}", backend_dir()), models, port,
                              root / f"server-{port}.log")
        ours = asyncio.run(conversations(f"http://127.0.0.1:{port}", A, turns, together))
        procs.stop(server)
        stock_port = free_port()
        wait_for_load(max_load, 300)
        stock = stock_llama_server(procs, root, gguf, stock_port)
        theirs = asyncio.run(conversations(f"http://127.0.0.1:{stock_port}", None, turns, together))
        procs.stop(stock)
        out[together] = (ours, theirs)
    return out


def print_conversations(figures: dict[bool, tuple[dict[str, float], dict[str, float]]], turns: int) -> None:
    first = max(ours["first_read"] for ours, _ in figures.values())
    print(f"3. 8 conversations x {turns} turns, a shared system prompt of about 1,500 tokens (a first turn "
          f"read {first} tokens):")
    for together, (ours, theirs) in figures.items():
        mine, stock = ours["prompt_tokens_computed"], theirs["prompt_tokens_computed"]
        mine_s, stock_s = ours["mean_ttft_s"], theirs["mean_ttft_s"]
        print(f"   {'all at once' if together else 'taking turns'}: prompt tokens computed {mine} through this "
              f"server, {stock} stock ({mine / stock:.3f}x); mean time to first token {mine_s:.2f} s against "
              f"{stock_s:.2f} s ({mine_s / stock_s:.3f}x)")


async def sixteen_at_once(url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=url, timeout=1800) as c:
        await c.post("/v1/unload", json={})
        before = (await c.get("/v1/health")).json()["queue"]["loads_total"]
        answers = await asyncio.gather(*(chat(c, A, [{"role": "user", "content": f"Hi {i}"}], max_tokens=2)
                                         for i in range(16)), return_exceptions=True)
        after = (await c.get("/v1/health")).json()["queue"]["loads_total"]
    return {"loads": after - before, "answers": sum(1 for a in answers if isinstance(a, dict))}


async def window_cache_way(procs: Processes, root: Path, gguf: Path, swa_full: bool) -> dict[str, Any]:
    """One way of keeping the window layers: engine memory after a conversation, and what its next turn
    reads again after the slot was saved, the engine restarted and the slot restored."""
    import psutil

    slots = root / ("slots-full" if swa_full else "slots-ckpt")
    slots.mkdir(exist_ok=True)
    binary = backend_dir() / "llama-server"
    port = free_port()
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "32768",
            "--jinja", "--no-webui", "-ngl", "0", "-np", "8", "-kvu", "--no-cache-idle-slots",
            "--slot-save-path", str(slots)] + (["--swa-full"] if swa_full else ["--ctx-checkpoints", "2"])
    convo = [{"role": "system", "content": system_prompt(2000)}, {"role": "user", "content": "Name a fruit."}]
    out: dict[str, Any] = {}
    for phase in ("first", "restored"):
        proc = procs.start(argv, log=root / f"window-{swa_full}.log")
        wait_ok(f"http://127.0.0.1:{port}/health", proc, 300)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=1800) as c:
            if phase == "first":
                first = await chat(c, None, convo, id_slot=0)  # the slot saved below
                out["prompt"] = first["usage"]["prompt_tokens"]
                out["rss_mib"] = psutil.Process(proc.pid).memory_info().rss / 2**20
                await c.post("/slots/0?action=save", json={"filename": "bench.bin"})
                convo = convo + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                                 {"role": "user", "content": "Another."}]
            else:
                await c.post("/slots/0?action=restore", json={"filename": "bench.bin"})
                body = {"messages": convo, "max_tokens": 1, "temperature": 0, "id_slot": 0}
                answer = (await c.post("/v1/chat/completions", json=body)).json()
                out["read_again"] = answer["timings"]["prompt_n"]
                out["cached"] = answer["timings"]["cache_n"]
        procs.stop(proc)
    return out


def stock_llama_server(procs: Processes, root: Path, gguf: Path, port: int) -> subprocess.Popen[bytes]:
    """llama-server as this server started it before warm swaps: 8 slots sharing one cache, the context
    and prompt cache llama-server chooses, its own slot choice (the auto-tune profile's flags)."""
    binary = backend_dir() / "llama-server"
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "32768",
            "--jinja", "--no-webui", "-ngl", "0", "-np", "8", "-kvu"]
    proc = procs.start(argv, log=root / "stock.log")
    wait_ok(f"http://127.0.0.1:{port}/health", proc, 300)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--conversations-only", action="store_true", help="figure 3 alone")
    parser.add_argument("--swaps-only", action="store_true", help="figures 1, 2 and 4 alone")
    parser.add_argument("--max-load", type=float, default=1.0,
                        help="figure 3: start each side once the 1-minute load average is below this (at most "
                             "300 s of waiting); 0 starts at once")
    args = parser.parse_args()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        root = Path(tmp)
        models = root / "models"
        models.mkdir()
        gguf = next(gemma_dir().glob("*.gguf"))
        for name in (A, B):
            (models / f"{name}.gguf").symlink_to(gguf)
        cache = new_cache(root, "cache", backend_dir())
        port = free_port()
        print(f"load average {load_avg()} before", flush=True)
        if args.conversations_only:
            figures = conversation_figures(procs, root, models, gguf, args.turns, args.max_load or None)
            print(f"load average {load_avg()} after\n")
            print_conversations(figures, args.turns)
            return
        server = start_server(procs, cache, models, port, root / f"server-{port}.log")
        url = f"http://127.0.0.1:{port}"
        swaps = asyncio.run(swap_figures(url, gguf, args.swaps))
        procs.stop(server)
        steps = swap_steps(root / f"server-{port}.log")
        server = start_server(procs, cache, models, port, root / f"server-{port}.log")
        restart = asyncio.run(restart_figure(url, swaps["convo"], swaps["prefix_tokens"], swaps["cold_prefill_ms"]))
        # after the restart figure: 16 new conversations take over every slot, A's among them
        four = asyncio.run(sixteen_at_once(url))
        procs.stop(server)
        figures: dict[bool, tuple[dict[str, float], dict[str, float]]] = {}
        ways: dict[str, dict[str, Any]] = {}
        if not args.swaps_only:
            figures = conversation_figures(procs, root, models, gguf, args.turns, args.max_load or None)
            ways = {name: asyncio.run(window_cache_way(procs, root, gguf, full))
                    for name, full in (("context checkpoints", False), ("full window cache", True))}
        print(f"load average {load_avg()} after\n")

    lat = swaps["latencies"]
    print(f"1. swap, A's prefix {swaps['prefix_tokens']} tokens (cold prefill {swaps['cold_prefill_ms']:.0f} ms):")
    print(f"   cached share of the prefix after each swap: {', '.join(f'{s:.3f}' for s in swaps['cached_share'])}")
    print(f"   prefill after the swap / cold prefill: {', '.join(f'{r:.3f}' for r in swaps['prefill_ratio'])}")
    for kind, values in lat.items():
        if values:
            print(f"   swap-to-first-token, {kind}: p50 {pct(values, 50):.2f} s, p99 {pct(values, 99):.2f} s "
                  f"({len(values)} swaps)")
    for step, values in steps.items():
        if values:
            print(f"   {step} (the server's log): median {statistics.median(values) * 1000:.0f} ms, max "
                  f"{max(values) * 1000:.0f} ms ({len(values)})")
    print(f"2. after a restart: cached share {restart['cached_share']:.3f}, "
          f"prefill / cold {restart['prefill_ratio']:.3f}")
    if figures:
        print_conversations(figures, args.turns)
    print(f"4. 16 simultaneous requests for an unloaded model: {four['loads']} load(s), {four['answers']} answers")
    if ways:
        print("Window layers of Gemma 3 (ctx 32768, 8 slots), saved, restarted and restored:")
    for name, way in ways.items():
        print(f"   {name}: engine RSS {way['rss_mib']:.0f} MiB after a {way['prompt']}-token prompt; the next turn "
              f"read {way['read_again']} tokens again ({way['cached']} from the restored slot)")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
