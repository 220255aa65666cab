"""llama.cpp RPC benchmark (issue 42): what spreading a model over workers costs per token, and what a
worker's `--cache` saves when it is restarted.

Three worker hosts are network namespaces joined to this one by veth links limited to `--rate` in
each direction (default 1gbit: a LAN, not memory speed), each in a memory cgroup capped at `--cap-mib`
(default 160 MiB: Gemma's 241 MiB file is 1.5 times that), each running a real `lemonade worker`
(tests/netns.py). Our server (a real `lemonade serve`) loads Gemma 3 270M:

1. decode speed: locally (the reference, one uncapped host) and spread over the three capped workers, both
   without speculative decoding, the same requests in alternating order (`--requests` of `--tokens`
   tokens each, `ignore_eos`); it prints tokens/s of each and the ratio;
2. `--cache`: the workers are started with `--cache` and an empty cache, the model loaded over them
   (first load: every weight crosses the link), unloaded, the workers stopped and started again, and
   the model loaded once more (second load: a tensor larger than ggml-rpc's 10 MiB threshold is asked
   for by its hash and read from the worker's disk). Both with Lemonade's placement (the output layer
   stays on the main host: Gemma has no other tensor that large, so nothing is cached) and with
   llama.cpp's own (`-ts 1,1,1`: the output layer, a copy of the 170 MiB token embeddings, goes to
   the last worker, so the caps are lifted for this part). It prints the load times and the second
   against the first.

    sudo .venv/bin/python benchmarks/bench_rpc.py [--rate 1gbit] [--cap-mib 160] [--requests 6] [--tokens 64]

Needs root (namespaces, `tc`, cgroups). Results: docs/performance.md ("llama.cpp RPC"). Every process it
starts is stopped by pid, every namespace and link removed by name.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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

from tests.cgroups import memory_cgroup  # noqa: E402
from tests.netns import Host, netns_usable, worker_cache  # noqa: E402

MODEL = "gemma-3-270m-q4_k_m"
PROMPT = "Count from one to one thousand in words."


def decode_rate(c: httpx.Client, tokens: int) -> float:
    """Tokens per second of one non-streamed answer of `tokens` tokens (llama-server's own decode timing)."""
    r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": tokens, "temperature": 0,
                                             "ignore_eos": True, "messages": [{"role": "user", "content": PROMPT}]})
    r.raise_for_status()
    body = r.json()
    timings = body.get("timings") or {}
    if timings.get("predicted_per_second"):
        return float(timings["predicted_per_second"])
    raise RuntimeError(f"no decode timing in the answer: {body}")


def load(c: httpx.Client, **options: object) -> float:
    started = time.perf_counter()
    r = c.post("/v1/load", json={"model_name": MODEL, "speculation": "off", **options})
    if r.status_code != 200:
        raise RuntimeError(f"load failed: {r.status_code} {r.text}")
    return time.perf_counter() - started


def unload(c: httpx.Client) -> None:
    r = c.post("/v1/unload", json={"model_name": MODEL})
    if r.status_code not in (200, 404):  # 404: it was not loaded
        r.raise_for_status()


def restart_workers(hosts: list[Host], root: Path, backend: Path, cache: bool, fresh: bool) -> None:
    for host in hosts:
        host.stop_worker()
    for host in hosts:
        base = root / f"worker-{host.ns}"
        if fresh and (base / "llama").exists():
            for f in sorted((base / "llama").rglob("*"), reverse=True):
                f.unlink() if f.is_file() else f.rmdir()
        home = worker_cache(base, backend)
        host.start_worker(home, root, ["--cache"] if cache else [], {"LLAMA_CACHE": str(base / "llama")})
    for host in hosts:
        host.wait_serving()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="1gbit", help="link speed of each worker host (tc rate)")
    ap.add_argument("--cap-mib", type=int, default=160, help="memory cap of each worker host")
    ap.add_argument("--requests", type=int, default=6, help="answers per side for the decode speed")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    args = ap.parse_args()
    reason = netns_usable()
    if reason:
        sys.exit(f"Cannot make worker hosts: {reason}")
    backend = backend_dir()
    procs = Processes()
    hosts = [Host(i, tag="lb") for i in (1, 2, 3)]
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as tmp, contextlib.ExitStack() as caps:
        root = Path(tmp)
        try:
            for host in hosts:
                host.cgroup = caps.enter_context(memory_cgroup(f"lemonade-bench-{host.ns}", args.cap_mib << 20))
                host.create()
                host.limit_rate(args.rate)
            restart_workers(hosts, root, backend, cache=False, fresh=True)
            workers = [h.endpoint for h in hosts]
            cache = new_cache(root, "server", backend)
            port = free_port()
            server = procs.start(serve_argv(port), env=lemonade_env(cache, gemma_dir()), log=root / "server.log")
            wait_ok(f"http://127.0.0.1:{port}/live", server, 60)
            print(f"load average before: {load_avg()}; links {args.rate}; workers capped at {args.cap_mib} MiB")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900) as c:
                # 1. decode speed, local against split, in alternating order
                rates: dict[str, list[float]] = {"local": [], "split": []}
                for i in range(args.requests):
                    for side in (("local", "split") if i % 2 == 0 else ("split", "local")):
                        unload(c)
                        load(c, rpc_workers=workers if side == "split" else [])
                        decode_rate(c, 8)  # warm
                        rates[side].append(decode_rate(c, args.tokens))
                unload(c)
                local, split = statistics.median(rates["local"]), statistics.median(rates["split"])
                peaks = ", ".join(f"{h.cgroup.peak_bytes() >> 20}" for h in hosts if h.cgroup is not None)
                print(f"decode, {args.tokens} tokens, median of {args.requests}: one host {local:.1f} tokens/s, "
                      f"split over 3 capped workers {split:.1f} tokens/s: {split / local:.2f}x "
                      f"(workers' peaks {peaks} MiB of {args.cap_mib}; OOM kills "
                      f"{sum(h.cgroup.oom_kills() for h in hosts if h.cgroup is not None)})")
                for host in hosts:  # llama.cpp's placement below puts a 170 MiB tensor on one worker
                    assert host.cgroup is not None
                    names = ("memory.max",) if host.cgroup.version == 2 else \
                        ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")  # v1: the one with swap first
                    for name in names:
                        with contextlib.suppress(OSError):
                            (host.cgroup.path / name).write_text(str(2 << 30))
                # 2. a restarted worker with --cache
                for label, extra in (("Lemonade's placement", {}), ("llama.cpp's placement (-ts 1,1,1)",
                                                                     {"llamacpp_args": "-ts 1,1,1"})):
                    restart_workers(hosts, root, backend, cache=True, fresh=True)
                    first = load(c, rpc_workers=workers, **extra)
                    unload(c)
                    restart_workers(hosts, root, backend, cache=True, fresh=False)
                    second = load(c, rpc_workers=workers, **extra)
                    unload(c)
                    cached = sum(f.stat().st_size for h in hosts
                                 for f in (root / f"worker-{h.ns}" / "llama").rglob("*") if f.is_file())
                    print(f"--cache, {label}: first load {first:.2f} s, second load after the workers' restart "
                          f"{second:.2f} s: {second / first:.2f}x; {cached / 2**20:.0f} MiB in the workers' caches")
            print(f"load average after: {load_avg()}")
        finally:
            procs.stop_all()
            for host in hosts:
                host.destroy()  # before its cgroup goes


if __name__ == "__main__":
    main()
