"""Image generation benchmark: seconds per image through Lemonade vs. `sd-cli` run directly.

Why: a picture through the server crosses the HTTP API, the router, the proxy and sd-server's
OpenAI route (JSON, base64); `sd-cli` is the same stable-diffusion.cpp build run as a plain program
on the same files. One run, one install (the test cache's `sd-cpp` cpu backend), one model: the
random-weight SD 1.x tiny-UNet checkpoint of `tests/sd_factory.py` (real layout and widths, so the
arithmetic per image is that of a real tiny SD 1.x model; the pictures are noise).

Two settings: 64x64 with 1 step (where fixed costs dominate) and 512x512 with 4 steps (SD-Turbo's
usual request). Per setting, `--runs` images each way, alternating A/B then B/A:

- server: `POST /v1/images/generations` on a loaded model (the load is timed once, apart);
- sd-cli: `sd-cli -m FILE -p PROMPT -W -H --steps --cfg-scale -s SEED -o out.png`, a new process per
  image, so its figure includes loading the 1 GB checkpoint each time (that is what calling sd-cli
  per image costs; the server loads once).

It prints figures; it never asserts. Results: docs/performance.md ("Image generation").

    .venv/bin/python benchmarks/bench_images.py [--runs 3] [--big-runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from bench_serving import TEST_CACHE, Processes, free_port, load_avg, serve_argv, wait_ok  # noqa: E402

MODEL = "user.Tiny-SD1"
REPO = "test-org/tiny-sd1"
PROMPT = "a lemon on a wooden table"


def backend() -> Path:
    """The test cache's sd-cpp backend, installed if missing."""
    from lemonade.backends.registry import Engines
    from lemonade.config import Config

    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get("sd-cpp")
    assert engine is not None
    if engine.state("cpu").state != "installed":
        engine.install("cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / "sd-cpp" / "cpu"


def seed_hf_cache(hf_home: Path, file: Path) -> None:
    """The model file as a downloaded `test-org/tiny-sd1` in the HF cache layout (no download)."""
    repo = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snapshot / file.name).symlink_to(file)


def sd_cli_image(cli: Path, model: Path, out: Path, width: int, height: int, steps: int, seed: int) -> float:
    started = time.perf_counter()
    subprocess.run([str(cli), "-m", str(model), "-p", PROMPT, "-W", str(width), "-H", str(height), "--steps",
                    str(steps), "--cfg-scale", "1", "-s", str(seed), "-o", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ,
                                                                              "LD_LIBRARY_PATH": str(cli.parent)})
    return time.perf_counter() - started


def server_image(http: httpx.Client, width: int, height: int, steps: int, seed: int) -> float:
    started = time.perf_counter()
    resp = http.post("/v1/images/generations", json={"model": MODEL, "prompt": PROMPT, "size": f"{width}x{height}",
                                                     "steps": steps, "cfg_scale": 1.0, "seed": seed})
    resp.raise_for_status()
    assert resp.json()["data"][0]["b64_json"]
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> dict:
    from tests.sd_factory import tiny_sd1_model

    installed = backend()
    model_file = tiny_sd1_model()
    cli = installed / "sd-cli"
    results: dict = {"load_avg_start": load_avg(), "model_bytes": model_file.stat().st_size}
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        root = Path(tmp)
        cache = root / "cache"
        (cache / "backends" / "sd-cpp").mkdir(parents=True)
        (cache / "backends" / "sd-cpp" / "cpu").symlink_to(installed, target_is_directory=True)
        seed_hf_cache(cache / "hf", model_file)
        (cache / "config.json").write_text(json.dumps({"offline": True}))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
        env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(cache), "HF_HOME": str(cache / "hf"),
                    "PYTHONPATH": str(ROOT / "src")})
        proc = procs.start(serve_argv(port), env=env, log=root / "server.log")
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/live", proc, 60)
        try:
            _measure(url, args, cli, model_file, root, results)
        finally:
            procs.stop_all()
    results["load_avg_end"] = load_avg()
    return results


def _measure(url: str, args: argparse.Namespace, cli: Path, model_file: Path, root: Path, results: dict) -> None:
    with httpx.Client(base_url=url, timeout=3600) as http:
        reg = http.post("/v1/models/register", json={"model_name": MODEL, "checkpoint": f"{REPO}:{model_file.name}",
                                                     "recipe": "sd-cpp", "labels": ["image"]})
        reg.raise_for_status()
        started = time.perf_counter()
        http.post("/v1/load", json={"model_name": MODEL}).raise_for_status()
        results["server_load_s"] = time.perf_counter() - started
        for label, (w, h, steps, runs) in {"64x64, 1 step": (64, 64, 1, args.runs),
                                           "512x512, 4 steps": (512, 512, 4, args.big_runs)}.items():
            server_image(http, w, h, steps, 0)  # warm (first request after load)
            ours: list[float] = []
            direct: list[float] = []
            for i in range(runs):
                order = ("server", "cli") if i % 2 == 0 else ("cli", "server")
                for side in order:
                    if side == "server":
                        ours.append(server_image(http, w, h, steps, i + 1))
                    else:
                        direct.append(sd_cli_image(cli, model_file, root / "out.png", w, h, steps, i + 1))
            results[label] = {"server_s": ours, "sd_cli_s": direct,
                              "server_median": statistics.median(ours), "sd_cli_median": statistics.median(direct)}
            print(label, json.dumps(results[label]), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="64x64 images per side")
    parser.add_argument("--big-runs", type=int, default=2, help="512x512 images per side")
    results = run(parser.parse_args())
    print(json.dumps(results, indent=2))
    print(f"\nserver load (once): {results['server_load_s']:.2f} s; model file {results['model_bytes'] / 1e9:.2f} GB")
    print("| setting | through Lemonade (s/image, median) | sd-cli per image (s, median) | ratio |")
    print("|---|---|---|---|")
    for label in ("64x64, 1 step", "512x512, 4 steps"):
        r = results[label]
        print(f"| {label} | {r['server_median']:.2f} | {r['sd_cli_median']:.2f} | "
              f"{r['server_median'] / r['sd_cli_median']:.2f} |")


if __name__ == "__main__":
    main()
