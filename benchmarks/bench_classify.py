"""Classification benchmark: texts per second one request per text vs. one batched request.

Why: `/v1/classify` takes a list of texts, which the worker runs through ONNX Runtime in padded
batches of 16; a routing policy or a client with many texts should know what that buys over one
request per text. Measured on the classify worker itself (the engine the server starts, with the
onnxruntime venv of the test cache, installed first if missing), with the MiniLM topic classifier
the tests train (`tests/classifier_models.py`, built first if missing). Rounds alternate the two
ways so machine load hits both. It never asserts; results: docs/performance.md. The worker it
starts is stopped by pid at the end.

    .venv/bin/python benchmarks/bench_classify.py [--texts 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from lemonade.backends.onnxruntime.contract import read_contract  # noqa: E402
from lemonade.backends.onnxruntime.engine import WORKER  # noqa: E402
from lemonade.backends.registry import Engines  # noqa: E402
from lemonade.config import Config  # noqa: E402
from lemonade.util.ports import free_port  # noqa: E402
from tests.classifier_models import HELD_OUT_TOPICS, classifier_models  # noqa: E402
from tests.helpers import TEST_CACHE  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get("onnxruntime")
    assert engine is not None
    if engine.state("cpu").state != "installed":
        engine.install("cpu")
    folder = classifier_models() / "topic"
    port = free_port()
    proc = subprocess.Popen([str(engine.venv.python), str(WORKER), "--model", str(folder),  # type: ignore[attr-defined]
                             "--contract", read_contract(folder).to_json(), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    base = list(HELD_OUT_TOPICS)
    texts = [f"{base[i % len(base)]} ({i})" for i in range(args.texts)]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            http.post("/classify", json={"texts": texts[:4]})  # warm-up
            single: list[float] = []
            batched: list[float] = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                for text in texts:
                    http.post("/classify", json={"texts": [text]}).raise_for_status()
                single.append(len(texts) / (time.perf_counter() - started))
                started = time.perf_counter()
                http.post("/classify", json={"texts": texts}).raise_for_status()
                batched.append(len(texts) / (time.perf_counter() - started))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    load = os.getloadavg()[0]
    print(f"{args.texts} texts x {args.rounds} rounds, load average {load:.1f} on {os.cpu_count()} cores")
    print(f"one request per text: {statistics.median(single):7.1f} texts/s (median; min {min(single):.1f})")
    print(f"one batched request:  {statistics.median(batched):7.1f} texts/s (median; min {min(batched):.1f})")
    print(f"batched / single:     {statistics.median(batched) / statistics.median(single):7.2f}x")


if __name__ == "__main__":
    main()
