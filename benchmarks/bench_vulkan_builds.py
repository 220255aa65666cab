"""What a `vulkan` source build of whisper.cpp and stable-diffusion.cpp costs: wall time, CPU time and
ccache hits, with the compiler cache `.ci/run` has when it starts them, and again with a warm one.

Why: `.ci/run` must stay within its budget on 2 cores. A vulkan build is the engine's CPU build plus
ggml's Vulkan backend: its shaders (glslc, run by ggml's shader generator, which ccache cannot keep),
the C++ files they become and ggml-vulkan.cpp. Two builds per engine, each into a scratch cache dir
laid out as the test cache (so ccache's paths, relative to `CCACHE_BASEDIR`, match its entries):

- `cold`: with a copy of the test cache's ccache, i.e. what a cold `.ci/run` has once the CPU builds
  are done (their objects; nothing of the Vulkan backend);
- `warm`: a fresh build folder with the ccache the `cold` build left (every compilation a hit; the
  shaders are still compiled), the reference the `cold` figure is divided by.

CPU time is the children's user + system time (every compiler and glslc run is waited for), which a
busy machine inflates far less than the wall time; the load average is printed beside each build.
The sdists come from the test cache (no download). Sources are the pinned ones; nothing is
installed into the test cache. It prints figures; it never asserts. Results: docs/performance.md
("whisper.cpp and stable-diffusion.cpp on Vulkan: build costs").

    .venv/bin/python benchmarks/bench_vulkan_builds.py [whispercpp] [sd-cpp]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from bench_serving import TEST_CACHE, load_avg  # noqa: E402


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ccache_counts(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, env=env, check=True).stdout
    counts = dict(line.split("\t") for line in out.splitlines() if "\t" in line)
    return {"hits": int(counts["direct_cache_hit"]) + int(counts["preprocessed_cache_hit"]),
            "misses": int(counts["cache_miss"])}


def build(recipe: str, scratch: Path, ccache_dir: Path) -> dict[str, float | int | str]:
    """One vulkan source build of `recipe` into `scratch` (in this process: its children are timed)."""
    from lemonade.backends.sdcpp.install import SdCppInstall
    from lemonade.backends.whispercpp.install import WhisperCppInstall

    (scratch / "backends" / recipe).mkdir(parents=True)
    shutil.copytree(TEST_CACHE / "backends" / recipe / "_downloads", scratch / "backends" / recipe / "_downloads")
    env = {"CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
           "CCACHE_DIR": str(ccache_dir), "CCACHE_BASEDIR": str(scratch), "CCACHE_MAXSIZE": "2G",
           "LEMONADE_WHISPERCPP_NO_RELEASE": "1", "LEMONADE_SDCPP_NO_RELEASE": "1"}
    os.environ.update(env)
    subprocess.run(["ccache", "-z"], env={**os.environ}, check=True, capture_output=True)
    installer = {"whispercpp": WhisperCppInstall, "sd-cpp": SdCppInstall}[recipe](scratch)
    load_before, cpu_before, started = load_avg(), children_cpu(), time.monotonic()
    installer.install_pinned("vulkan")
    wall, cpu = time.monotonic() - started, children_cpu() - cpu_before
    return {"wall": wall, "cpu": cpu, "load": f"{load_before} -> {load_avg()}", **ccache_counts({**os.environ})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", default=["whispercpp", "sd-cpp"])
    args = parser.parse_args()
    if shutil.which("ccache") is None or not (TEST_CACHE / "ccache").is_dir():
        sys.exit(f"needs ccache and the test cache's compiler cache ({TEST_CACHE / 'ccache'}): run .ci/run once")
    from lemonade.backends.llamacpp.gpu import missing_toolkit
    from tests.vulkan_sdk import debian_vulkan_headers

    if any("Vulkan headers" in m for m in missing_toolkit("vulkan")) and not os.environ.get("VULKAN_SDK"):
        os.environ["VULKAN_SDK"] = str(debian_vulkan_headers(TEST_CACHE))
    missing = missing_toolkit("vulkan")
    if missing:
        sys.exit(f"the Vulkan source build needs: {'; '.join(missing)}")
    print(f"{os.cpu_count()} CPUs; {TEST_CACHE}")
    print(f"{'engine':<11} {'ccache':<6} {'wall s':>7} {'CPU s':>7} {'hits':>5} {'misses':>6}  load (1/5/15 min)")
    with tempfile.TemporaryDirectory(prefix="bench-vulkan-builds-") as tmp:
        for recipe in args.recipes:
            ccache_dir = Path(tmp) / f"ccache-{recipe}"
            shutil.copytree(TEST_CACHE / "ccache", ccache_dir)
            figures = {}
            for kind in ("cold", "warm"):
                figures[kind] = build(recipe, Path(tmp) / f"{recipe}-{kind}", ccache_dir)
                f = figures[kind]
                print(f"{recipe:<11} {kind:<6} {f['wall']:7.0f} {f['cpu']:7.0f} {f['hits']:5} {f['misses']:6}  "
                      f"{f['load']}", flush=True)
            ratio = float(figures["cold"]["cpu"]) / float(figures["warm"]["cpu"])
            print(f"{recipe:<11} cold/warm CPU time: {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
