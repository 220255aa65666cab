"""Auto-tune benchmark: Gemma 3 270M with this machine's auto-tuned parameters vs. stock defaults.

Why: a bundled profile must never make anything slower than the engine's own defaults (issue 15).
This script asks our server what it would run: it starts `lemonade serve` with auto-tune on, loads
the model and copies the engine command line the server built (profile flags included), then sets
`auto_tune=false`, loads again and copies that command line (the same but for the profile). Both
`llama-server`s then run side by side on their own ports, and the same traffic goes to both,
alternating A/B then B/A per round (bench_serving's `pairs`) so the rest of the machine's load hits
both alike: 1 stream, then 8 concurrent streams, then the same with long prompts (a profile must not
cost the context or the speed of a long prompt either). For each phase it reports how much CPU other
processes took (`LoadLog`); a busy phase's figures are shown but marked unreliable. It never
asserts. Results: docs/performance.md.

    .venv/bin/python benchmarks/bench_autotune.py [--rounds N] [--tokens N] [--prompt-words N] [--engine-args ARGS]
                                                  [--json FILE]

Every process it starts is stopped by pid at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_serving import (  # noqa: E402  (the measuring tools of the serving benchmark)
    GEMMA_NAME,
    CpuLog,
    LoadLog,
    Processes,
    Side,
    backend_dir,
    cpu_model,
    engine_version,
    free_port,
    gemma_dir,
    lemonade_env,
    load_avg,
    measure_streams,
    new_cache,
    paired_ratios,
    pct,
    rss_mb,
    serve_argv,
    spread,
    table,
    wait_ok,
)


def engine_command(base: str) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Load Gemma in our server; (engine argv, the health's auto_tune, the model's auto_tune)."""
    with httpx.Client(base_url=base, timeout=600) as c:
        c.post("/v1/unload", json={})
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME})
        if resp.status_code != 200:
            raise RuntimeError(f"load failed: {resp.status_code} {resp.text}")
        health = c.get("/v1/health").json()
    entry = next(m for m in health["all_models_loaded"] if m["model_name"] == GEMMA_NAME)
    return list(entry["launch_command"]), health.get("auto_tune") or {}, entry.get("auto_tune") or {}


def on_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    if "--slot-save-path" in out:  # each engine its own folder (never two writers of one slot file)
        i = out.index("--slot-save-path")
        out[i:i + 2] = []
    return out


def summarize(side: Side, key: str) -> dict[str, Any]:
    rounds = side.rounds[key]
    return {"tps": statistics.median(r["tps"] for r in rounds),
            "ttft_ms": pct([t for r in rounds for t in r["ttfts"]], 50),
            "rounds": [{"tps": r["tps"], "ttft_ms": pct(r["ttfts"], 50)} for r in rounds]}


async def traffic(tuned: Side, stock: Side, args: argparse.Namespace, loads: LoadLog) -> None:
    cpu = CpuLog(lambda: 0.0)  # no proxy in between: nothing of ours to count
    with loads.phase("warmup"):
        await measure_streams((tuned, stock), "warmup", 2, 1, 8, cpu)
    with loads.phase("stream1"):
        await measure_streams((tuned, stock), "stream1", args.rounds, 1, args.tokens, cpu)
    with loads.phase("stream8"):
        await measure_streams((tuned, stock), "stream8", args.rounds, 8, args.tokens, cpu)
    if args.prompt_words:
        with loads.phase("long1"):
            await measure_streams((tuned, stock), "long1", args.rounds, 1, args.tokens, cpu,
                                  prompt_words=args.prompt_words)
        with loads.phase("long8"):
            await measure_streams((tuned, stock), "long8", args.rounds, 8, args.tokens, cpu,
                                  prompt_words=args.prompt_words)


def run(args: argparse.Namespace) -> dict[str, Any]:
    procs = Processes()
    root = Path(tempfile.mkdtemp(prefix="lemonade-autotune-"))
    loads: LoadLog | None = None
    try:
        models, backend = gemma_dir(), backend_dir()
        started = time.strftime("%Y-%m-%d %H:%M %Z")
        print(f"{started}; {' '.join(sys.argv)}")
        print(f"machine: {os.cpu_count()} cpus, {cpu_model()}, load {load_avg()}")
        print(f"engine: {backend / 'llama-server'} ({engine_version(backend)}); model: {models}")
        cache = new_cache(root, "server", backend)
        port = free_port()
        server = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=cache / "server.log")
        base = f"http://127.0.0.1:{port}"
        wait_ok(base + "/live", server, timeout=120)
        tuned_argv, tune, applied = engine_command(base)
        httpx.post(base + "/internal/set", json={"auto_tune": False}, timeout=30).raise_for_status()
        stock_argv, _, _ = engine_command(base)
        procs.stop(server)
        archetype = (tune.get("archetype") or {}).get("id")
        print(f"archetype: {archetype}; profile: {applied.get('profile')}; overrides: {applied.get('overrides')}")
        if tuned_argv == stock_argv:
            print("The profile changes nothing for this model on this machine: nothing to compare.")
            return {"archetype": archetype, "overrides": applied, "compared": False}

        sides = []
        extra = args.engine_args.split()
        for name, argv in (("tuned", tuned_argv), ("stock", stock_argv)):
            p = free_port()
            cmd = on_port(argv, p) + extra
            print(f"{name}: {' '.join(cmd[1:])}")
            proc = procs.start(cmd, log=root / f"{name}.log", death_sig=signal.SIGKILL)
            wait_ok(f"http://127.0.0.1:{p}/health", proc, timeout=300, interval=0.1)
            sides.append((Side(name, f"http://127.0.0.1:{p}"), proc))
        (tuned, tuned_proc), (stock, stock_proc) = sides
        loads = LoadLog(lambda: [os.getpid(), tuned_proc.pid, stock_proc.pid])
        asyncio.run(traffic(tuned, stock, args, loads))
        figures = {name: {k: summarize(side, k) for k in phases(args)} | {"rss_mb": rss_mb(proc.pid)[0]}
                   for name, side, proc in (("tuned", tuned, tuned_proc), ("stock", stock, stock_proc))}
        result = {"started": started, "archetype": archetype, "overrides": applied, "rounds": args.rounds,
                  "engine_args_both": args.engine_args, "prompt_words": args.prompt_words,
                  "tokens": args.tokens, "figures": figures, "machine_load": loads.phases,
                  "tuned_argv": tuned_argv[1:], "stock_argv": stock_argv[1:], "phases": phases(args)}
        print()
        print(report(result, loads))
        return result
    except BaseException:
        print(f"\nlogs kept in {root}", file=sys.stderr)
        args.keep = True
        raise
    finally:
        if loads is not None:
            loads.close()
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def phases(args: argparse.Namespace) -> dict[str, str]:
    """Phase key -> its label in the report."""
    out = {"stream1": "1 stream", "stream8": "8 streams"}
    if args.prompt_words:
        out |= {"long1": f"1 stream, {args.prompt_words}-word prompt",
                "long8": f"8 streams, {args.prompt_words}-word prompts"}
    return out


def report(result: dict[str, Any], loads: LoadLog) -> str:
    f = result["figures"]
    rows = []
    for key, label in result["phases"].items():
        t, s = f["tuned"][key], f["stock"][key]
        tps = paired_ratios(s["rounds"], t["rounds"], "tps")
        ttft = paired_ratios(s["rounds"], t["rounds"], "ttft_ms")
        rows.append((f"tokens/s, {label}", f"{s['tps']:.1f}", f"{t['tps']:.1f}", f"{statistics.median(tps):.3f}",
                     spread(tps), loads.describe(key)))
        rows.append((f"TTFT p50 ms, {label}", f"{s['ttft_ms']:.0f}", f"{t['ttft_ms']:.0f}",
                     f"{statistics.median(ttft):.3f}", spread(ttft), ""))
    rows.append(("engine RSS MB", f"{f['stock']['rss_mb']:.0f}", f"{f['tuned']['rss_mb']:.0f}",
                 f"{f['tuned']['rss_mb'] / f['stock']['rss_mb']:.3f}", "", ""))
    return table(("figure", "stock", "auto-tuned", "ratio (median of pairs)", "paired min/p25/med/p75/max",
                  "machine during the phase"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="paired rounds per phase (default 6)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream (default 64)")
    parser.add_argument("--prompt-words", type=int, default=2000,
                        help="also measure 1 and 8 streams whose prompts start with this many words of text "
                             "(about as many tokens; 0 skips the long-prompt phases; default 2000)")
    parser.add_argument("--engine-args", default="",
                        help="llama-server arguments added to both sides (e.g. '-t 1' on a machine whose other "
                             "tenants leave too little CPU for the default thread count)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs) at the end")
    args = parser.parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally blocks stop every process we started

    signal.signal(signal.SIGTERM, on_term)
    try:
        result = run(args)
    except KeyboardInterrupt:
        sys.exit(130)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
