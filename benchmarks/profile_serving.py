"""Where our server's CPU goes per request, under a chosen load: py-spy on the live server.

Why: `bench_serving.py` says how much the proxy costs; this says where. It starts our server
(same setup as the benchmark: the real Gemma 3 270M GGUF, the installed cpu llama.cpp, `-np N`),
keeps N concurrent streams (or max_tokens=1 requests, or both) running, records the server
process with `py-spy record --nonblocking` (the process is never paused) for a fixed time, and
prints per-request CPU shares: inclusive time of each of our functions, and of the phases a
request goes through (middleware, validation, routing, upstream connect, relay, uvicorn, ...).

    .venv/bin/pip install py-spy    # a profiling tool, not a dependency of the server
    .venv/bin/python benchmarks/profile_serving.py [--workload streams|tiny|mixed] [--streams 8]
        [--seconds 30] [--rate 250] [--profiler py-spy|yappi] [--keep]

py-spy samples only threads that are running (or runnable), so the figures are CPU, not wall time;
on a busy machine it also charges time the server waited for a core. `--profiler yappi` (pip
install yappi) runs the server under yappi's CPU clock instead: exact CPU per function (our code,
Starlette, uvicorn, aiohttp), coroutine-aware, at the price of slowing the server down.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_serving import (  # noqa: E402
    GEMMA_NAME,
    Processes,
    Side,
    backend_dir,
    chat_body,
    free_port,
    gemma_dir,
    lemonade_env,
    new_cache,
    serve_argv,
    timed_request,
    timed_stream,
    wait_ok,
)

# Phases, first match wins, tested from the innermost frame outwards: the sample is charged to
# the innermost frame that names a phase (so "relay" inside "middleware" counts as relay).
PHASES: list[tuple[str, re.Pattern[str]]] = [(name, re.compile(pat)) for name, pat in [
    ("json encode/decode", r"^(dumps|loads|encode|decode|raw_decode|iterencode) \(json/"),
    ("pydantic validation / dump", r"pydantic|model_dump|validate_python"),
    ("upstream connect", r"\(aiohttp/connector\.py\)|create_connection|_create_direct_connection"
                         r"|_connect \(lemonade/runtime/engine_client"),
    ("upstream request/response (aiohttp: remote engines, uploads)", r"\(aiohttp/"),
    ("upstream request/response (engine_client.py)", r"\(lemonade/runtime/engine_client\.py\)|httptools/parser"),
    ("relay (proxy.py)", r"^relay \(lemonade/runtime/proxy\.py\)"),
    ("model check / resolve", r"check_model|resolve \(lemonade/(serving/models|catalog)|find \(lemonade/catalog"),
    ("router use/acquire/release", r"\(lemonade/runtime/router/"),
    ("options", r"\(lemonade/runtime/options\.py\)"),
    ("file system", r"^(stat|exists|is_file|is_dir|walk|scandir|open|read_text|gguf_info) "),
    ("engine log pump", r"_pump_output"),
    ("stats/metrics", r"\(lemonade/(runtime/stats|observability)/|observe_request|record_inference"),
    ("proxy (other)", r"\(lemonade/runtime/(proxy|engine_request|assemble)\.py\)"),
    ("route handler", r"\(lemonade/api/(openai|ollama|anthropic)/"),
    ("our middleware", r"\(lemonade/api/(middleware|origins|disconnect)\.py\)"),
    ("starlette/fastapi", r"\((starlette|fastapi)/"),
    ("uvicorn/httptools", r"\(uvicorn/"),
    ("asyncio/uvloop", r"\(asyncio/|uvloop"),
]]


def parse_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) format: `frame;frame;... count`, outermost frame first."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append(([_short(f) for f in stack.split(";")], int(count)))
    return stacks


def _short(frame: str) -> str:
    """`func (/long/path/site-packages/pkg/mod.py:12)` -> `func (pkg/mod.py)`."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    func, path = m.groups()
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    if path.startswith(".") or re.match(r"^\.\d+/", path):
        path = path.split("/", 1)[1]
    return f"{func} ({path})"


def summarise(stacks: list[tuple[list[str], int]], rate: int, requests: int, tokens: int) -> str:
    total = sum(c for _, c in stacks)
    if not total:
        return "no samples (was the server idle?)"
    per_req = 1000.0 / rate / max(requests, 1)  # ms of CPU per sample, spread over the requests
    phase = collections.Counter[str]()
    inclusive = collections.Counter[str]()
    selfs = collections.Counter[str]()
    for frames, count in stacks:
        for frame in set(frames):
            if "lemonade/" in frame:
                inclusive[frame] += count
        selfs[frames[-1]] += count
        for frame in reversed(frames):
            name = next((n for n, pat in PHASES if pat.search(frame)), None)
            if name:
                phase[name] += count
                break
        else:
            phase["other"] += count
    out = [f"{total} samples at {rate}/s = {total / rate:.2f} s of CPU; {requests} requests, {tokens} tokens; "
           f"{total / rate * 1000 / max(requests, 1):.2f} ms per request, "
           f"{total / rate * 1000 / max(tokens, 1):.3f} ms per token", "",
           "phase (innermost match)   share   ms/request"]
    for name, count in phase.most_common():
        out.append(f"  {name:<36} {count / total:6.1%} {count * per_req:8.3f}")
    out += ["", "our functions, inclusive      share   ms/request"]
    for frame, count in inclusive.most_common(30):
        out.append(f"  {count / total:6.1%} {count * per_req:8.3f}  {frame}")
    out += ["", "hottest frames, self          share   ms/request"]
    for frame, count in selfs.most_common(25):
        out.append(f"  {count / total:6.1%} {count * per_req:8.3f}  {frame}")
    return "\n".join(out)


async def workload(side: Side, kind: str, streams: int, until: float, counts: dict[str, int]) -> None:
    async def streamer(k: int) -> None:
        n = 0
        while time.monotonic() < until:
            run = await timed_stream(side, chat_body(f"Tell a long story about lemon tree number {k}-{n}.", 64,
                                                     stream=True))
            counts["requests"] += 1
            counts["tokens"] += int(run["tokens"])
            n += 1

    async def tiny() -> None:
        while time.monotonic() < until:
            await timed_request(side, chat_body("Hi", 1))
            counts["requests"] += 1
            counts["tokens"] += 1

    jobs = []
    if kind in ("streams", "mixed"):
        jobs += [streamer(k) for k in range(streams)]
    if kind in ("tiny", "mixed"):
        jobs += [tiny() for _ in range(1 if kind == "tiny" else 2)]
    try:
        await asyncio.gather(*jobs)
    finally:
        await side.client.aclose()


# Runs the server under yappi (CPU clock); SIGUSR1 saves the function stats and exits the profiling.
YAPPI_BOOT = """
import os, signal, sys, yappi
out = sys.argv.pop(1)
def dump(signum, frame):
    yappi.stop()
    stats = yappi.get_func_stats()
    stats.save(out + ".part", type="pstat")
    os.rename(out + ".part", out)
signal.signal(signal.SIGUSR1, dump)
yappi.set_clock_type("cpu")
from lemonade.cli.main import main
signal.signal(signal.SIGUSR2, lambda s, f: (yappi.clear_stats(), yappi.start()))
sys.argv[0] = "lemonade"
main()
"""


def yappi_summary(path: Path, requests: int, tokens: int) -> str:
    """pstats of a yappi CPU-clock run: inclusive and own CPU per request of the functions that matter."""
    import pstats

    stats = pstats.Stats(str(path))
    rows = []
    for (filename, _, func), (_, _, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((ct, tt, _short(f"{func} ({filename})")))
    total = max(r[0] for r in rows)
    per = 1000.0 / max(requests, 1)
    out = [f"yappi CPU clock; {requests} requests, {tokens} tokens; most inclusive function {total:.2f} s"]
    interesting = re.compile(r"lemonade/|starlette/|fastapi/|uvicorn/|aiohttp/|pydantic|json/|asyncio/")
    out += ["", "inclusive ms/request  own ms/request  function"]
    for ct, tt, name in sorted(rows, reverse=True):
        if interesting.search(name) and ct * per >= 0.02:
            out.append(f"  {ct * per:8.3f}  {tt * per:8.3f}  {name}")
    out += ["", "own CPU, top 30"]
    for _ct, tt, name in sorted(rows, key=lambda r: -r[1])[:30]:
        out.append(f"  {tt * per:8.3f}  {name}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("streams", "tiny", "mixed"), default="streams")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--profiler", choices=("py-spy", "yappi"), default="py-spy")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, raw profile)")
    args = parser.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if args.profiler == "py-spy" and not Path(pyspy).exists():
        sys.exit("py-spy not found: install it with `.venv/bin/pip install py-spy`")
    procs = Processes()
    root = Path(tempfile.mkdtemp(prefix="lemonade-profile-"))
    try:
        models, backend = gemma_dir(), backend_dir()
        cache = new_cache(root, "main", backend)
        port = free_port()
        argv = serve_argv(port)
        pstat = root / "yappi.pstat"
        if args.profiler == "yappi":
            argv = [sys.executable, "-c", YAPPI_BOOT, str(pstat), *argv[3:]]
        server = procs.start(argv, env=lemonade_env(cache, models), log=cache / "server.log")
        wait_ok(f"http://127.0.0.1:{port}/live", server, timeout=60)
        load = httpx.post(f"http://127.0.0.1:{port}/v1/load", timeout=600, json={
            "model_name": GEMMA_NAME, "llamacpp_args": f"-np {max(args.streams, 1)}"})
        if load.status_code != 200:
            raise RuntimeError(f"load failed: {load.status_code} {load.text}")
        procs.note_children(server)
        side = Side("ours", f"http://127.0.0.1:{port}")
        asyncio.run(workload(side, "tiny", 0, time.monotonic() + 2, {"requests": 0, "tokens": 0}))  # warm up
        counts = {"requests": 0, "tokens": 0}
        if args.profiler == "yappi":
            server.send_signal(signal.SIGUSR2)  # start counting now, after the load and the warm-up
            side = Side("ours", f"http://127.0.0.1:{port}")
            asyncio.run(workload(side, args.workload, args.streams, time.monotonic() + args.seconds, counts))
            server.send_signal(signal.SIGUSR1)
            for _ in range(600):
                if pstat.exists():
                    break
                time.sleep(0.1)
            print(f"workload {args.workload}, {args.streams} streams, {args.seconds:.0f} s")
            print(yappi_summary(pstat, counts["requests"], counts["tokens"]))
            return
        raw = root / "profile.txt"
        spy = subprocess.Popen([pyspy, "record", "--pid", str(server.pid), "--rate", str(args.rate), "--format", "raw",
                                "--nonblocking", "--duration", str(int(args.seconds)), "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # py-spy attaches
        side = Side("ours", f"http://127.0.0.1:{port}")
        asyncio.run(workload(side, args.workload, args.streams, time.monotonic() + args.seconds - 0.5, counts))
        _, err = spy.communicate(timeout=120)
        if not raw.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
        print(f"workload {args.workload}, {args.streams} streams, {args.seconds:.0f} s")
        print(summarise(parse_raw(raw), args.rate, counts["requests"], counts["tokens"]))
        if args.keep:
            print(f"\nraw profile and logs in {root}")
    finally:
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
