"""How fast the server starts and the CLI answers: start -> `/live`, `lemonade --help`, `lemonade status`.

- start -> /live: `python -m lemonade.cli.main serve` (what the `lemonade` script and the test
  harness run) on a free port with empty cache and config dirs, from process start to the first 200
  of `GET /live` (asked every 5 ms with a plain HTTP/1.1 request);
- `lemonade --help` and `lemonade status` (against a server started for it), wall time of the
  whole process;
- `--importtime`: the heaviest imports of `import lemonade.api.app` and of a CLI command, from
  `python -X importtime` (cumulative ms, the first importer pays).

The machine is shared: every figure is a median (and the minimum) of `--runs` runs, each printed
with the 1-minute load average it ran at, and with the CPU time the process used (user + system,
until /live for the server): on a busy machine the wall time grows with the load, the CPU time
much less, so it is what a quiet machine's wall time comes close to. With `--wait-load L` a run
waits (up to `--load-wait` s) until the load is below L. `--src A,B` times other source trees too,
alternating run by run so both meet the same load (e.g. the commit before a change, `git
archive`-d elsewhere, against `src`). Results: docs/performance.md, "Start-up".

    .venv/bin/python benchmarks/bench_startup.py [--runs 7] [--src OLD/src,src] [--importtime] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load() -> float:
    return os.getloadavg()[0]


def wait_for_quiet(limit: float | None, patience: float) -> float:
    deadline = time.monotonic() + patience
    while limit is not None and load() > limit and time.monotonic() < deadline:
        time.sleep(5)
    return load()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def live(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/live")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def cpu_of(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def env_for(src: Path, home: Path) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE dropped: the untimed first round writes each tree's bytecode, else
    # every run of a tree that has none (a `git archive`) would compile it and be timed doing so
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEMONADE_", "HF_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"PYTHONPATH": str(src), "LEMONADE_CACHE_DIR": str(home / "cache"),
                "LEMONADE_CONFIG_DIR": str(home / "config"), "HF_HOME": str(home / "hf"),
                "LEMONADE_BROADCAST": "false", "HF_HUB_DISABLE_TELEMETRY": "1"})
    return env


@contextlib.contextmanager
def server(src: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, float, float]]:
    """A server of `src` on a free port: (process, port, seconds from start to the first 200 of /live,
    CPU seconds it used until then)."""
    home = Path(tempfile.mkdtemp(prefix="lemonade-start-"))
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port)],
                            env=env_for(src, home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    try:
        while not live(port):
            if proc.poll() is not None:
                raise RuntimeError(f"the server of {src} exited with {proc.returncode}")
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"the server of {src} was not live after 120 s")
            time.sleep(0.005)
        took = time.perf_counter() - started
        yield proc, port, took, cpu_of(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def cli(src: Path, args: list[str], port: int | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `lemonade ARGS` run."""
    home = Path(tempfile.mkdtemp(prefix="lemonade-cli-"))
    env = env_for(src, home)
    if port is not None:
        env["LEMONADE_PORT"] = str(port)
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args], env=env, capture_output=True,
                          stdin=subprocess.DEVNULL)
    took, cpu = time.perf_counter() - started, children_cpu() - cpu
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"lemonade {' '.join(args)} ({src}) exited with {done.returncode}: {done.stderr[-800:]!r}")
    return took, cpu


def heaviest(src: Path, code: str, top: int) -> list[tuple[float, str]]:
    """The `top` imports with the largest cumulative time (ms) in `python -X importtime -c code`."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          env=env_for(src, Path(tempfile.gettempdir())), capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]) / 1000, parts[2].rstrip()))
    return sorted(rows, reverse=True)[:top]


def summary(samples: list[tuple[float, float, float]]) -> dict[str, Any]:
    """samples: (wall s, CPU s, load)."""
    return {"median_s": round(statistics.median(t for t, _, _ in samples), 3),
            "min_s": round(min(t for t, _, _ in samples), 3),
            "median_cpu_s": round(statistics.median(c for _, c, _ in samples), 3),
            "median_load": round(statistics.median(lo for _, _, lo in samples), 2),
            "runs": [{"s": round(t, 3), "cpu_s": round(c, 3), "load": round(lo, 2)} for t, c, lo in samples]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--src", default=str(ROOT / "src"), help="source trees, comma-separated (default: src)")
    parser.add_argument("--wait-load", type=float, default=None, help="before each run, wait for a load below this")
    parser.add_argument("--load-wait", type=float, default=300, help="wait at most this long for it (s)")
    parser.add_argument("--importtime", action="store_true", help="also list the heaviest imports")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    trees = [Path(s).resolve() for s in args.src.split(",")]
    figures: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        str(t): {"start_to_live": [], "help": [], "status": []} for t in trees}
    for tree in trees:  # one untimed round first: bytecode compiled, files in the page cache
        with server(tree) as (_, port, _took, _cpu):
            cli(tree, ["status"], port)
        cli(tree, ["--help"])
    for i in range(args.runs):
        for tree in trees:  # alternating: both trees meet the same load
            out = figures[str(tree)]
            lo = wait_for_quiet(args.wait_load, args.load_wait)
            with server(tree) as (_, port, took, cpu):
                out["start_to_live"].append((took, cpu, lo))
                out["status"].append((*cli(tree, ["status"], port), load()))
            out["help"].append((*cli(tree, ["--help"]), load()))
            print(f"run {i + 1}/{args.runs} {tree}: start->/live {took:.3f} s ({cpu:.2f} s CPU), status "
                  f"{out['status'][-1][0]:.3f} s, --help {out['help'][-1][0]:.3f} s (load {lo:.2f})", flush=True)
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "trees": {}}
    for tree in trees:
        report["trees"][str(tree)] = {name: summary(samples) for name, samples in figures[str(tree)].items()}
        if args.importtime:
            report["trees"][str(tree)]["importtime_ms"] = {
                "import lemonade.api.app": heaviest(tree, "import lemonade.api.app", 25),
                "lemonade status (CLI modules)": heaviest(tree, "import lemonade.cli.main as m; m._register_commands("
                                                                "'status')", 15)}
    for tree, result in report["trees"].items():
        print(f"\n{tree}")
        for name in ("start_to_live", "help", "status"):
            r = result[name]
            print(f"  {name:14} median {r['median_s']:.3f} s, min {r['min_s']:.3f} s, CPU {r['median_cpu_s']:.3f} s "
                  f"(median load {r['median_load']})")
        for what, rows in result.get("importtime_ms", {}).items():
            print(f"  heaviest imports, {what} (cumulative ms):")
            for ms, name in rows:
                print(f"    {ms:8.1f}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
