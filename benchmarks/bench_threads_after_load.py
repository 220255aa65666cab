"""An engine started just after other work ended: the threads it gets, and what they cost.

The 1-minute load average still counts, for a minute, work that has just ended. `backends/cpu_share.py`
gives an engine fewer compute threads only when the cores are busy now too. This benchmark keeps
every core busy for `--busy` seconds, ends that work, starts a server at once (the load average is
still high, the cores idle) and sends `--conversations` conversations sharing a 1,500-word system
prompt, all at once; then the same with `llamacpp.args="-t 1"`, the count the load average alone
gave before (the reference, measured in the same run). It prints the thread decision the server
logged and the mean time to first token of each, and their ratio.

    .venv/bin/python benchmarks/bench_threads_after_load.py [--busy 60] [--conversations 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
from bench_warm import A, conversations  # noqa: E402


def keep_cores_busy(seconds: float) -> None:
    """One busy loop per core for `seconds`, then none (each stopped by its own pid)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(seconds)
    finally:
        for proc in loops:
            proc.kill()
            proc.wait()


def one_run(procs: Processes, root: Path, models: Path, name: str, busy: float, n: int,
            engine_args: str | None) -> tuple[str, float]:
    keep_cores_busy(busy)
    print(f"{name}: load average {load_avg()} as the server starts", flush=True)
    env = lemonade_env(new_cache(root, f"cache-{name}", backend_dir()), models)
    if engine_args is not None:
        env["LEMONADE_LLAMACPP_ARGS"] = engine_args
    port = free_port()
    log = root / f"server-{name}.log"
    server = procs.start(serve_argv(port), env=env, log=log)
    try:
        wait_ok(f"http://127.0.0.1:{port}/live", server, 60)
        figures = asyncio.run(conversations(f"http://127.0.0.1:{port}", A, 1, True, n=n))
    finally:
        procs.stop(server)
    decision = next((line.split(") ", 1)[1] for line in log.read_text().splitlines()
                     if "compute thread" in line), "no thread decision logged (the engine's default)")
    return decision, figures["mean_ttft_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--busy", type=float, default=60.0, help="seconds every core is kept busy before each run")
    parser.add_argument("--conversations", type=int, default=4)
    args = parser.parse_args()
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        root = Path(tmp)
        models = root / "models"
        models.mkdir()
        (models / f"{A}.gguf").symlink_to(next(gemma_dir().glob("*.gguf")))
        ours = one_run(procs, root, models, "shipped", args.busy, args.conversations, None)
        before = one_run(procs, root, models, "t1", args.busy, args.conversations, "-t 1")
    print(f"\nshipped: {ours[0]}\n  mean time to first token {ours[1]:.2f} s")
    print(f"-t 1 (the load average's count before): mean time to first token {before[1]:.2f} s")
    print(f"ratio {ours[1] / before[1]:.3f}x")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
