"""Memory estimate against measurement: how close the server's estimate is to what an engine holds.

Why: a load is admitted only when its estimate fits the memory budget (docs/memory.md), so an
estimate below the truth is what lets the kernel kill an engine, and one far above it refuses
loads that would fit. For each configuration this loads the model through the server (the shipped
defaults: the engine flags the server adds, --cache-ram and --ctx-checkpoints included), reads the
estimate from `/v1/health` (`memory_estimate_bytes`), then fills every slot: first, where the engine
speculates, every slot at once generates with n-gram drafts (the output buffer grows to hold all their
logits, a part of the estimate prompts alone never reach); then rounds of long, distinct prompts, one
per slot at once, so the KV cache is full, idle slots' states go to the prompt cache and the
sliding-window checkpoints are made. Meanwhile it samples the engine's resident memory (RSS and PSS,
every 50 ms). A chat model is loaded with speculation on: the estimate counts its drafts. It prints
estimate, peak and error; it never asserts.

    .venv/bin/python benchmarks/bench_memory.py [--quick] [--model gemma|minilm] [--config '2048 -np 8']
        [--fill-cache] [--whole-context]

The goal (issue 39): the llama.cpp estimate within 10 % of the measured peak, and never below what
is measured at any moment by more than 5 %. Results: docs/memory.md. Every process it starts is
stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from lemonade.backends.llamacpp.context import layer_rows
from lemonade.backends.llamacpp.memory import MiB as _MiB
from lemonade.backends.llamacpp.memory import engine_flags
from lemonade.catalog.gguf_meta import gguf_layout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from bench_serving import (  # noqa: E402 - sibling module, not a package
    Processes,
    backend_dir,
    free_port,
    gemma_dir,
    lemonade_env,
    load_avg,
    new_cache,
    serve_argv,
    wait_ok,
)

MiB = 1 << 20
PROMPT_CAP = 4096  # tokens a fill prompt has at most (prefill time on 2 cores; far past Gemma 3's 512-token window)
VOCAB = ("lemon tree garden river stone cloud market window yellow quiet morning story bridge paper candle "
         "winter orange harbor valley music north signal copper forest engine silver planet harvest").split()
# (model, ctx_size, llamacpp_args): the slot layouts of the shipped profile (-np 8 -kvu), one slot, and
# four slots with a cache of their own each
FULL = [(m, ctx, args) for m in ("gemma",) for ctx in (2048, 8192, 32768)
        for args in ("-np 1", "-np 4", "-np 8 -kvu")] + [("minilm", 512, "-np 1"), ("minilm", 512, "-np 8 -kvu")]
QUICK = [("gemma", 2048, "-np 8 -kvu"), ("gemma", 8192, "-np 1"), ("minilm", 512, "-np 8 -kvu")]


@dataclass
class Peak:
    """The engine's memory, sampled in a thread while the prompts run."""

    pid: int
    rss: int = 0
    pss: int = 0
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        proc = psutil.Process(self.pid)
        while not self.stop.is_set():
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                return
            self.rss, self.pss = max(self.rss, info.rss), max(self.pss, info.pss)
            self.samples += 1
            time.sleep(0.05)


def launch_cache_bytes(command: Any) -> int:
    """The `--cache-ram` the server gave the engine (its launch command, as /v1/health shows it)."""
    words = command.split() if isinstance(command, str) else [str(w) for w in command or []]
    for flag, value in zip(words, words[1:], strict=False):
        if flag in ("--cache-ram", "-cram"):
            return max(0, int(value)) * _MiB
    return 0


def words(n: int, seed: int) -> str:
    return " ".join(VOCAB[(i * 7 + seed * 13 + i // 11) % len(VOCAB)] + str((i * seed) % 97) for i in range(n))


async def tokens_per_word(c: httpx.AsyncClient, model: str) -> float:
    r = await c.post("/v1/tokenize", json={"model": model, "content": words(500, 1)})
    r.raise_for_status()
    return len(r.json()["tokens"]) / 500


def fill_plan(ctx: int, slots: int, unified: bool, window: int, embeddings: bool = False) -> tuple[int, int]:
    """(prompts at once, tokens each) that make the engine hold the most: as many slots as can each hold
    more than a sliding window at the same time (so each makes its context checkpoints), with prompts
    that share the cache between them (a unified cache) or fill each slot's part, so they all run at once.
    An embedding model keeps nothing between requests: every slot at once with the longest input a
    slot takes (a unified cache lets one slot have the whole context) is its worst case."""
    if embeddings and unified:
        return slots, min(int(ctx * 0.9), PROMPT_CAP)
    if unified:
        busy = min(slots, max(1, ctx // (window + 64))) if window else slots
        tokens = ctx // busy
    else:
        busy, tokens = slots, ctx // slots
    return busy, min(int(tokens * 0.9), PROMPT_CAP)


async def fill(c: httpx.AsyncClient, model: str, busy: int, tokens: int, per_word: float, embeddings: bool,
               rounds: int) -> None:
    """`rounds` rounds of `busy` distinct prompts of about `tokens` tokens, each round's all at once, each
    prompt on a slot of its own (`id_slot`). Later rounds push the earlier states into the prompt cache."""
    n_words = max(8, int(tokens / per_word))
    for r in range(rounds):
        async def one(i: int, r: int = r) -> None:
            text = words(n_words, seed=100 * r + i + 1)
            if embeddings:
                resp = await c.post("/v1/embeddings", json={"model": model, "input": [text] * 4})
            else:
                body = {"model": model, "prompt": text, "max_tokens": 4, "id_slot": i}
                resp = await c.post("/v1/completions", json=body)
            if resp.status_code != 200:
                print(f"    request failed: {resp.status_code} {resp.text[:200]}", flush=True)
        await asyncio.gather(*(one(i) for i in range(busy)))


async def draft_everywhere(c: httpx.AsyncClient, model: str, slots: int, ctx: int, per_word: float) -> None:
    """Every slot at once generates a copy of a text it was given twice, so n-gram speculation drafts on
    all of them in the same batches: the engine's output buffer then holds the logits of every slot's
    drafted tokens, the one part of the estimate that prompts alone never reach (llama-server grows
    that buffer only when a batch asks for that many outputs)."""
    per_slot = int(ctx * 0.8 / slots)  # a unified cache is shared: all of them must fit at once
    generate = min(64, per_slot // 3)
    n_words = max(8, int((per_slot - generate) / per_word / 2))

    async def one(i: int) -> None:
        text = words(n_words, seed=7000 + i)
        body = {"model": model, "prompt": f"{text}\n{text}\n", "max_tokens": generate, "temperature": 0,
                "id_slot": i}
        resp = await c.post("/v1/completions", json=body)
        if resp.status_code != 200:
            print(f"    draft request failed: {resp.status_code} {resp.text[:200]}", flush=True)
    await asyncio.gather(*(one(i) for i in range(slots)))


async def whole_context(c: httpx.AsyncClient, model: str, ctx: int, per_word: float) -> None:
    """One prompt of almost the whole context on slot 0, after the rounds: it touches every KV cell and
    the largest compute buffers, and taking it saves slot 0's previous prompt into a cache the rounds
    filled (llama-server adds the new state before it evicts the oldest): the most an engine holds."""
    n_words = max(8, int(ctx * 0.95 / per_word))
    body = {"model": model, "prompt": words(n_words, seed=9001), "max_tokens": 4, "id_slot": 0}
    resp = await c.post("/v1/completions", json=body)
    if resp.status_code != 200:
        print(f"    whole-context request failed: {resp.status_code} {resp.text[:200]}", flush=True)
    else:
        print(f"    whole-context prompt: {resp.json()['usage']['prompt_tokens']} tokens", flush=True)


async def measure(url: str, name: str, path: Path, ctx: int, args: str, rounds: int,
                  max_rounds: int = 8, whole: bool = False) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=3600) as c:
        # Speculation on (not the shipped `auto`): the estimate is of the most an engine may hold, which
        # includes its drafted tokens' logits, and with `auto` the controller would restart an engine
        # whose fill prompts (4 tokens each) earned nothing from it, mid-measurement, without drafting.
        load = {"model_name": name, "ctx_size": ctx, "llamacpp_args": args}
        if name != "minilm":
            load["speculation"] = "on"
        r = await c.post("/v1/load", json=load)
        if r.status_code != 200:
            return {"error": f"load {r.status_code}: {r.text[:300]}"}
        (entry,) = [m for m in (await c.get("/v1/health")).json()["all_models_loaded"] if m["model_name"] == name]
        pid, estimate = entry["pid"], entry["memory_estimate_bytes"]
        embeddings = entry["type"] == "embedding"
        loaded = psutil.Process(pid).memory_full_info()
        peak = Peak(pid)
        watcher = threading.Thread(target=peak.run, daemon=True)
        watcher.start()
        flags = engine_flags(args)
        rows = layer_rows(gguf_layout(path).meta)
        busy, tokens = fill_plan(ctx, flags.slots, flags.unified, rows[2] if rows else 0, embeddings)
        cache = filled = 0
        command = entry.get("launch_command")
        command = command if isinstance(command, str) else " ".join(map(str, command or []))
        if rows is not None and not embeddings:  # enough rounds to fill the prompt cache (its size: the KV cache's)
            # a saved prompt holds its full-attention layers' cache and the last window of the others, with
            # the full window cache (--swa-full) too: measured on llama-server alone, 18.4 MiB per 3,475-token
            # prompt, the rule 17.7 (a whole window cache would be 61 MiB); its log at 32,768 tokens: 84.564 MiB
            # for the 26,200 tokens of the drafting text, the rule 84.3
            state = tokens * rows[0] + min(tokens, rows[2] or tokens) * rows[1]
            cache = launch_cache_bytes(command)
            rounds = max(rounds, min(max_rounds, 2 + math.ceil(cache / max(1, busy * state))))
            filled = int((rounds - 1) * busy * state)  # every prompt but the last round's goes to it
            if "--spec-type" in command:  # ... and the drafting texts before them, each slot's as its first round
                drafted = int(ctx * 0.8 / flags.slots)  # draft_everywhere's prompt and answer
                filled += busy * int(drafted * rows[0] + min(drafted, rows[2] or drafted) * rows[1])
            filled = min(cache, filled)
        per_word = await tokens_per_word(c, name)
        started = time.perf_counter()
        speculates = "--spec-type" in command
        if speculates:  # first: the output buffer grows once, before the prompts fill the caches around it
            await draft_everywhere(c, name, flags.slots, ctx, per_word)
        await fill(c, name, busy, tokens, per_word, embeddings, rounds)
        if whole and not embeddings:
            await whole_context(c, name, ctx, per_word)
        seconds = time.perf_counter() - started
        peak.stop.set()
        watcher.join()
        now = [m for m in (await c.get("/v1/health")).json()["all_models_loaded"] if m["model_name"] == name]
        if not now or now[0]["pid"] != pid:
            print("    the engine was restarted during the fill: its peak is not the whole story", flush=True)
        await c.post("/v1/unload", json={"model_name": name})
    return {"estimate": estimate, "loaded_rss": loaded.rss, "peak_rss": peak.rss, "peak_pss": peak.pss,
            "prompt_cache": cache, "prompt_cache_filled": filled,
            "samples": peak.samples, "seconds": seconds, "prompts": f"{rounds} x {busy} x {tokens} tokens",
            "drafted_on_every_slot": speculates}


def print_table(rows: list[tuple[str, int, str, dict[str, Any]]]) -> None:
    """The estimate against the peak, and against the peak plus the part of the prompt cache (`--cache-ram`)
    the rounds could not fill: a cache of a long context holds dozens of prompts, which the engine
    reads at a few hundred tokens a second here, so the rounds stop at 8 (the cache's part per prompt is
    the benchmark's own arithmetic, `state`)."""
    print("| model | ctx_size | engine flags | estimate MiB | after load (RSS) | peak RSS | peak PSS | "
          "estimate / peak RSS | prompt cache: cap / filled MiB | estimate / (peak RSS + unfilled cache) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, ctx, llama_args, r in rows:
        if "error" in r:
            print(f"| {name} | {ctx} | `{llama_args}` | {r['error']} |")
            continue
        ratio = r["estimate"] / r["peak_rss"]
        cap, filled = r.get("prompt_cache", 0), r.get("prompt_cache_filled", 0)
        whole = r["estimate"] / (r["peak_rss"] + cap - filled)
        print(f"| {name} | {ctx} | `{llama_args}` | {r['estimate'] / MiB:.0f} | {r['loaded_rss'] / MiB:.0f} | "
              f"{r['peak_rss'] / MiB:.0f} | {r['peak_pss'] / MiB:.0f} | {ratio:.3f} ({(ratio - 1) * 100:+.1f} %) | "
              f"{cap / MiB:.0f} / {filled / MiB:.0f} | {whole:.3f} ({(whole - 1) * 100:+.1f} %) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="three configurations instead of eleven")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of prompts per configuration")
    parser.add_argument("--model", choices=("gemma", "minilm"), help="only this model's configurations")
    parser.add_argument("--fill-cache", action="store_true",
                        help="as many rounds as fill the prompt cache (up to 40; at 32k tokens of context, "
                             "several minutes a configuration) instead of at most 8")
    parser.add_argument("--whole-context", action="store_true",
                        help="after the rounds, one prompt of almost the whole context (minutes at 32k tokens)")
    parser.add_argument("--config", help="only the configurations whose 'model ctx_size flags' contain this, "
                                         "e.g. '2048 -np 8'")
    args = parser.parse_args()
    from tests.models import minilm_gguf

    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        root = Path(tmp)
        models = root / "models"
        models.mkdir()
        (models / "gemma.gguf").symlink_to(next(gemma_dir().glob("*.gguf")))
        (models / "minilm.gguf").symlink_to(minilm_gguf())
        cache = new_cache(root, "cache", backend_dir())
        port = free_port()
        server = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=root / "server.log")
        try:
            wait_ok(f"http://127.0.0.1:{port}/live", server, 60)
            print(f"load average {load_avg()} before; {psutil.cpu_count()} CPUs", flush=True)
            rows = []
            for name, ctx, llama_args in QUICK if args.quick else FULL:
                chosen = f"{name} {ctx} {llama_args}"
                if (args.model and name != args.model) or (args.config and args.config not in chosen):
                    continue
                print(f"  {name} ctx {ctx} {llama_args} ...", flush=True)
                result = asyncio.run(measure(f"http://127.0.0.1:{port}", name, models / f"{name}.gguf", ctx, llama_args,
                                             args.rounds, 40 if args.fill_cache else 8, args.whole_context))
                rows.append((name, ctx, llama_args, result))
                print(f"    {result}", flush=True)
            print(f"load average {load_avg()} after\n")
            print_table(rows)
        finally:
            procs.stop(server)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
