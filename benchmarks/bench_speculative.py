"""Speculative decoding benchmark: what a user gets (`speculation: auto`) against stock, side by side.

Why: speculation is the largest speed-up a local server can give, and on a small CPU the easiest way
to lose speed. This script measures both in one run, on one machine and one engine build: our
server serves Gemma 3 270M under two names, `spec` with the shipped default (`speculation: auto`:
draftless n-gram speculation while it earns, runtime/speculation.py) and `stock` with
`speculation: off`, each in an engine of its own (`max_loaded_models` 2). Every prompt is asked of
both at temperature 0, alternating which goes first, in two corpora:

- edit-style: repeat a document with one change, rewrite code with a rename, continue a JSON list
  (the output copies much of the prompt: what n-gram drafts are made of);
- open chat: questions answered in free text.

It prints generation tokens per second per corpus (the engine's own `timings`: tokens over the time
generating them, as /v1/stats reports it) and end to end (completion tokens over the request's wall
time), the spec/stock ratios with their spread over rounds, whether the outputs are the same, and
where one differs, the stock engine's own margin between its two best tokens at the first
difference (llama.cpp on CPU is not bit-identical across batch sizes, and a batch of drafted tokens
is one: outputs can part only where the model hesitates between two tokens), and as a reference how
often the stock engine gives its own answer again once the prompt is in its cache (the last prompt
token is then evaluated alone: the same kind of difference). Last, the controller's own view of
`spec` from /v1/stats. It never asserts (figures depend on the machine), and prints the
load average so a busy machine's figures are read as such. Results: docs/performance.md.

    .venv/bin/python benchmarks/bench_speculative.py [--rounds 3] [--max-tokens 256] [--quick] [--cold]
        [--spec-args "--spec-type ngram-mod"]   # another kind of speculation for `spec`, to compare

Every process it starts is stopped by pid at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    lemonade_env,
    load_avg,
    new_cache,
    serve_argv,
    wait_ok,
)

SIDES = ("spec", "stock")

REPORT = """The quarterly report shows that revenue grew by twelve percent compared to the same period last
year. Operating costs remained stable, while marketing expenses increased slightly because of the product
launch in March. The board approved a new budget for research and development, focusing on battery
technology and recycling. Customer satisfaction scores improved in every region except the north, where
delivery delays were reported. The company plans to open two new warehouses next year to shorten delivery
times and reduce shipping costs."""
LETTER = """Dear residents, the water supply on Elm Street will be interrupted on Tuesday from nine in the
morning until three in the afternoon while the old pipes are replaced. Please store enough water for
cooking and drinking before the work starts. Parking on the east side of the street will not be allowed
during the work. We apologise for the inconvenience and thank you for your patience."""
CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def apply_discount(items, percent):
    for item in items:
        item.price = item.price * (1 - percent / 100)
    return items
"""
FRUITS = """[{"id": 1, "name": "apple", "color": "red", "price": 1.2},
 {"id": 2, "name": "banana", "color": "yellow", "price": 0.5},
 {"id": 3, "name": "cherry", "color": "red", "price": 3.0},
 {"id": 4, "name": "grape", "color": "purple", "price": 2.1},"""
EDIT = [
    "Repeat this document exactly, but replace 'twelve' with 'fifteen':\n\n" + REPORT,
    "Repeat this letter exactly, but replace 'Tuesday' with 'Thursday':\n\n" + LETTER,
    "Rewrite this code, renaming the variable `subtotal` to `net`:\n\n" + CODE,
    "Continue this JSON list with five more fruits in the same format:\n\n" + FRUITS,
]
CHAT = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are three good ways to learn a new language? Explain each briefly.",
    "Describe your ideal weekend in a few sentences.",
    "Why is the sky blue? Answer for a ten-year-old.",
]
CORPORA = {"edit-style": EDIT, "open chat": CHAT}


def ask(c: httpx.Client, side: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    # No prompt cache: each answer starts from the same engine state on both sides (a prompt partly
    # found in the cache is evaluated in another batch shape, which alone can change a near tie).
    body = {"model": side, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "cache_prompt": False, **extra}
    started = time.perf_counter()
    resp = c.post("/v1/chat/completions", json=body)
    wall = time.perf_counter() - started
    resp.raise_for_status()
    data = resp.json()
    timings = data.get("timings") or {}
    return {"text": data["choices"][0]["message"]["content"] or "", "tokens": timings.get("predicted_n", 0),
            "gen_ms": timings.get("predicted_ms", 0.0), "wall_s": wall, "drafted": timings.get("draft_n", 0),
            "accepted": timings.get("draft_n_accepted", 0), "completion_tokens": data["usage"]["completion_tokens"],
            "logprobs": (data["choices"][0].get("logprobs") or {}).get("content")}


def warm_up(c: httpx.Client) -> None:
    """What a server that has run a while knows: the model's stock speed. A few answers asked of `spec`
    with `speculation: off` teach it to the controller (a workload whose every answer drafts would make
    it measure that itself once, with speculation off for a few answers: `--cold` shows that)."""
    for prompt in CHAT[:3]:
        ask(c, "spec", prompt, 48, speculation="off", ignore_eos=True)
    ask(c, "spec", "Hello", 8, speculation="on")  # started again with speculation, as `auto` has it
    view = c.get("/v1/stats").json()["speculation"]
    print(f"  warm-up: the controller's stock speed of spec: "
          f"{(view.get('extra.spec') or view.get('spec') or {}).get('stock_tokens_per_second')} tokens/s", flush=True)


def tps(records: list[dict[str, Any]]) -> float:
    """Generation tokens per second over a set of answers (tokens over the time generating them)."""
    ms = sum(r["gen_ms"] for r in records)
    return sum(r["tokens"] for r in records) / ms * 1000 if ms else float("nan")


def wall_tps(records: list[dict[str, Any]]) -> float:
    wall = sum(r["wall_s"] for r in records)
    return sum(r["completion_tokens"] for r in records) / wall if wall else float("nan")


def first_difference(a: str, b: str) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def margin_at(c: httpx.Client, prompt: str, max_tokens: int, char: int) -> float | None:
    """The stock engine's logprob margin between its two best tokens where its text reaches `char`."""
    content = ask(c, "stock", prompt, max_tokens, logprobs=True, top_logprobs=2)["logprobs"] or []
    seen = 0
    for token in content:
        seen += len(token["token"])
        if seen > char:
            top = [t["logprob"] for t in token.get("top_logprobs") or []]
            return round(top[0] - top[1], 3) if len(top) >= 2 else None
    return None


def run_corpus(c: httpx.Client, name: str, prompts: list[str], rounds: int, max_tokens: int) -> dict[str, Any]:
    records: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    per_round: list[float] = []
    texts: dict[str, list[str]] = {s: [] for s in SIDES}
    for r in range(rounds):
        this_round: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        for i, prompt in enumerate(prompts):
            order = SIDES if (r + i) % 2 == 0 else SIDES[::-1]
            for side in order:
                rec = ask(c, side, prompt, max_tokens)
                this_round[side].append(rec)
                if r == 0:
                    texts[side].append(rec["text"])
        for side in SIDES:
            records[side] += this_round[side]
        per_round.append(tps(this_round["spec"]) / tps(this_round["stock"]))
        print(f"  {name}, round {r + 1}: spec/stock {per_round[-1]:.2f}x (load {load_avg()})", flush=True)
    differences = []
    cached_same = 0
    for i, prompt in enumerate(prompts):
        at = first_difference(texts["spec"][i], texts["stock"][i])
        if at is not None:
            differences.append((i, at, margin_at(c, prompt, max_tokens, at)))
        # The reference: the stock engine against itself, its prompt cache filled by the first ask (the
        # last prompt token is then evaluated alone, as in every multi-turn chat).
        ask(c, "stock", prompt, 1, cache_prompt=True)
        cached_same += ask(c, "stock", prompt, max_tokens, cache_prompt=True)["text"] == texts["stock"][i]
    return {"records": records, "per_round": per_round, "differences": differences, "prompts": len(prompts),
            "cached_same": cached_same}


def report(name: str, result: dict[str, Any]) -> None:
    spec, stock = result["records"]["spec"], result["records"]["stock"]
    ratio = tps(spec) / tps(stock)
    rounds = result["per_round"]
    drafted, accepted = sum(r["drafted"] for r in spec), sum(r["accepted"] for r in spec)
    print(f"{name}: generation {tps(spec):.1f} vs {tps(stock):.1f} tokens/s = {ratio:.2f}x stock "
          f"(rounds {min(rounds):.2f}-{max(rounds):.2f}, median {statistics.median(rounds):.2f}); end to end "
          f"{wall_tps(spec):.1f} vs {wall_tps(stock):.1f} tokens/s = {wall_tps(spec) / wall_tps(stock):.2f}x; "
          f"drafted {drafted}, accepted {accepted}"
          + (f" ({accepted / drafted:.0%})" if drafted else ""))
    same = result["prompts"] - len(result["differences"])
    print(f"  same output at temperature 0: {same}/{result['prompts']}"
          + "".join(f"; prompt {i + 1} differs from character {at} (stock's margin there: "
                    f"{'?' if margin is None else margin} logprob)" for i, at, margin in result["differences"]))
    print(f"  reference, stock against itself with its prompt cache: {result['cached_same']}/{result['prompts']} "
          "the same")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="times each prompt is asked of each side")
    parser.add_argument("--max-tokens", type=int, default=256, help="per answer")
    parser.add_argument("--quick", action="store_true", help="one round of 128 tokens")
    parser.add_argument("--spec-args", default="", help="llamacpp_args of `spec` (e.g. another --spec-type)")
    parser.add_argument("--cold", action="store_true", help="no warm-up: the controller measures the stock speed "
                                                           "itself during the run")
    parser.add_argument("--timeout", type=float, default=900.0, help="per request, seconds")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.max_tokens = 1, 128

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally block stops every process we started

    signal.signal(signal.SIGTERM, on_term)
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
        root = Path(tmp)
        models = root / "models"
        gemma_copies(models, SIDES)
        cache = new_cache(root, "cache", backend_dir())
        (cache / "config.json").write_text(json.dumps({"max_loaded_models": 2, "auto_check_model_updates": False}))
        port = free_port()
        print(f"Gemma 3 270M, {args.rounds} round(s) of {args.max_tokens} tokens per answer; "
              f"{os.cpu_count()} cores, load {load_avg()}", flush=True)
        try:
            proc = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=root / "server.log")
            url = f"http://127.0.0.1:{port}"
            wait_ok(url + "/live", proc, 60)
            with httpx.Client(base_url=url, timeout=args.timeout) as c:
                options = {"stock": {"speculation": "off"}, "spec": {"llamacpp_args": args.spec_args}
                           if args.spec_args else {}}
                for side in SIDES:
                    if options[side]:
                        c.post(f"/v1/models/{side}/options", json=options[side]).raise_for_status()
                    ask(c, side, "Hello", 8)  # loaded, warm
                if not args.cold and not args.spec_args:
                    warm_up(c)
                health = {m["model_name"]: m for m in c.get("/v1/health").json()["all_models_loaded"]}
                for side in SIDES:
                    command = health.get(f"extra.{side}", health.get(side, {})).get("launch_command", [])
                    spec_type = command[command.index("--spec-type") + 1] if "--spec-type" in command else "none"
                    print(f"  {side}: --spec-type {spec_type}", flush=True)
                results = {name: run_corpus(c, name, prompts, args.rounds, args.max_tokens)
                           for name, prompts in CORPORA.items()}
                print()
                for name, result in results.items():
                    report(name, result)
                stats = c.get("/v1/stats").json().get("speculation", {})
                view = stats.get("extra.spec", stats.get("spec"))
                print(f"the controller's view of spec: {json.dumps(view)}")
                print(f"load average at the end: {load_avg()}")
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()
