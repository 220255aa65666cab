"""Peer forwarding benchmark (issue 42 part 4): what a request pays for going through another server
of the LAN instead of straight to the one that has the model.

Two hosts on one bridge (tests/lan.py: network namespaces, each with its own address; the benchmark
itself is the client, in the root namespace, as a third machine of the LAN): B, a real `lemonade serve`
with Gemma 3 270M and all-MiniLM loaded; A, a real `lemonade serve` with no model and `peers: [B]`.
Both hold the same LEMONADE_PEER_KEY. The same non-streamed requests are sent straight to B and to A
(which forwards them to B), in pairs whose order alternates, over kept-alive connections:

- chat completion, `max_tokens: 1`, temperature 0 (B's prompt cache makes its engine time small and steady);
- embeddings of one short text (all-MiniLM).

For each it prints the p50 straight to B, the p50 through A, the added p50 (difference of the medians)
and the spread (min/p25/p50/p75/max) of the paired differences, then what a streamed chat's first
byte costs the same way. Target (issue 42): forwarding adds at most 2 ms p50 to a non-streamed request.

    sudo .venv/bin/python benchmarks/bench_peers.py [--requests 200]

Needs root (namespaces). Results: docs/performance.md ("Peers"). Every process it starts is stopped
by pid, the namespaces and links removed by name.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_serving import (  # noqa: E402 - sibling module, not a package
    Processes,
    backend_dir,
    gemma_dir,
    lemonade_env,
    load_avg,
    new_cache,
    pct,
    serve_argv,
    wait_ok,
)

from tests.lan import Lan, lan_unusable  # noqa: E402
from tests.models import minilm_gguf  # noqa: E402

GEMMA = "gemma-3-270m-q4_k_m"
EMBED = "all-MiniLM-L6-v2"
PORT = 13305
CHAT = {"model": GEMMA, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
EMBEDDING = {"model": EMBED, "input": "a cat sat on the mat"}


def models_dir(root: Path) -> Path:
    """Gemma at the root, all-MiniLM in a folder named for it (the extra models dir's layout)."""
    folder = root / "models-b"
    (folder / EMBED).mkdir(parents=True)
    gemma = next(gemma_dir().glob("*.gguf"))
    (folder / gemma.name).symlink_to(gemma)
    minilm = minilm_gguf()
    (folder / EMBED / minilm.name).symlink_to(minilm)
    return folder


def timed(client: httpx.Client, path: str, body: dict[str, object]) -> float:
    start = time.perf_counter()
    r = client.post(path, json=body)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    return elapsed * 1000


def first_byte(client: httpx.Client, path: str, body: dict[str, object]) -> float:
    start = time.perf_counter()
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        r.raise_for_status()
        elapsed = None
        for _ in r.iter_raw():
            if elapsed is None:
                elapsed = time.perf_counter() - start
    assert elapsed is not None, "an empty stream"
    return elapsed * 1000


def paired(name: str, n: int, straight: Callable[[], float], forwarded: Callable[[], float]) -> None:
    """`n` pairs in alternating order; prints the medians, the added p50 and the paired spread."""
    for _ in range(max(5, n // 10)):  # warm both ways (connections, caches)
        straight()
        forwarded()
    direct: list[float] = []
    through: list[float] = []
    for i in range(n):
        if i % 2 == 0:
            direct.append(straight())
            through.append(forwarded())
        else:
            through.append(forwarded())
            direct.append(straight())
    diffs = [t - d for t, d in zip(through, direct, strict=True)]
    spread = "/".join(f"{pct(diffs, q):.2f}" for q in (0, 25, 50, 75, 100))
    straight_p50, through_p50 = statistics.median(direct), statistics.median(through)
    print(f"{name}, {n} per side: straight to B p50 {straight_p50:.2f} ms, through A {through_p50:.2f} ms, "
          f"added p50 {through_p50 - straight_p50:+.2f} ms (paired differences min/p25/p50/p75/max {spread} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200, help="requests per side for each kind")
    args = ap.parse_args()
    reason = lan_unusable("bp")
    if reason:
        sys.exit(f"Cannot make the LAN: {reason}")
    backend = backend_dir()
    procs = Processes()
    lan = Lan(f"bp{os.getpid() % 1000}", 100 + os.getpid() % 100)
    key = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        root = Path(tmp)
        try:
            lan.create()
            host_a, host_b = lan.add_host(), lan.add_host()
            url_a, url_b = f"http://{host_a.address}:{PORT}", f"http://{host_b.address}:{PORT}"
            servers = {}
            for name, host, models, peers in (("b", host_b, models_dir(root), []),
                                              ("a", host_a, root / "none", [url_b])):
                cache = new_cache(root, name, backend)
                models.mkdir(exist_ok=True)
                if peers:
                    (cache / "config.json").write_text(json.dumps({"peers": peers}))
                env = {**lemonade_env(cache, models), "LEMONADE_PEER_KEY": key, "LEMONADE_BROADCAST": "false"}
                argv = ["ip", "netns", "exec", host.ns, *serve_argv(PORT), "--host", host.address]
                servers[name] = procs.start(argv, env=env, log=root / f"server-{name}.log")
            for name, url in (("b", url_b), ("a", url_a)):
                wait_ok(f"{url}/live", servers[name], 120)
            with httpx.Client(base_url=url_b, timeout=300) as b:
                for model in (GEMMA, EMBED):
                    b.post("/v1/load", json={"model_name": model}).raise_for_status()

            def ready() -> bool:
                members = httpx.get(url_a + "/v1/health", timeout=30).json()["peers"]["members"]
                return any(m["url"] == url_b and m["state"] == "up" and {GEMMA, EMBED} <= set(m["loaded"])
                           for m in members)

            deadline = time.monotonic() + 60
            while not ready():
                if time.monotonic() > deadline:
                    sys.exit(f"A never saw B up with both models loaded; logs in {root}")
                time.sleep(0.5)
            print(f"load average before: {load_avg()}")
            with httpx.Client(base_url=url_b, timeout=300) as b, httpx.Client(base_url=url_a, timeout=300) as a:
                paired("chat completion, max_tokens 1", args.requests, lambda: timed(b, "/v1/chat/completions", CHAT),
                       lambda: timed(a, "/v1/chat/completions", CHAT))
                paired("embeddings, one text", args.requests, lambda: timed(b, "/v1/embeddings", EMBEDDING),
                       lambda: timed(a, "/v1/embeddings", EMBEDDING))
                paired("streamed chat, first byte", max(20, args.requests // 4),
                       lambda: first_byte(b, "/v1/chat/completions", CHAT),
                       lambda: first_byte(a, "/v1/chat/completions", CHAT))
                assert not httpx.get(url_a + "/v1/health", timeout=30).json()["peers"]["members"][0].get("error")
            print(f"load average after: {load_avg()}")
        finally:
            procs.stop_all()
            lan.destroy()


if __name__ == "__main__":
    main()
