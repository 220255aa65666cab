"""`lemonade bench`: measure a model through a running server over a small grid of parameters.

Why through the server: what a user gets is the engine as the server starts it, so every cell of the
grid is a real `/v1/load` with the cell's options, and every figure comes from real chat
completions. Per cell: load time, the engine's memory, time to first token and tokens/s of one
stream, and the same for N concurrent streams (aggregate tokens/s). The first cell is always the
stock one (no tuning parameter given) so every other cell is judged against it.

The measuring is kept apart from printing (`cli/bench_cmd.py`) so benchmarks/ and tests can use it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from lemonade.backends.tuning import backend_option, params_to_options

CHAT = "/v1/chat/completions"
FILLER = ("Lemon trees grow in warm places and their fruit is picked in winter. ")  # ~14 tokens


@dataclass
class BenchSettings:
    runs: int = 3            # single-stream requests measured per cell
    warmup: int = 1          # requests before measuring (not counted)
    streams: int = 8         # concurrent streams of the multi-stream measurement
    stream_rounds: int = 1   # rounds of `streams` concurrent requests
    max_tokens: int = 64
    prompt_tokens: int = 256  # approximate prompt length (prompt processing is what batch sizes change)
    timeout: float = 600.0


@dataclass
class Cell:
    """One point of the grid: a backend and tuning parameters (None = the engine's default)."""

    backend: str | None
    params: dict[str, int | None]

    @property
    def stock(self) -> bool:
        return all(v is None for v in self.params.values())

    def label(self) -> str:
        given = [f"{k}={v}" for k, v in self.params.items() if v is not None]
        return f"{self.backend or 'default'} " + (" ".join(given) if given else "stock")


def grid(backends: list[str | None], values: dict[str, list[int | None]]) -> list[Cell]:
    """Every combination, each backend's stock cell first (duplicates dropped)."""
    names = list(values)
    cells: list[Cell] = []
    seen: set[str] = set()
    for backend in backends:
        combos = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(values[n] for n in names))]
        stock: dict[str, int | None] = {n: None for n in names}
        for params in [stock] + combos:
            cell = Cell(backend, params)
            key = json.dumps([backend, params], sort_keys=True)
            if key not in seen:
                seen.add(key)
                cells.append(cell)
    return cells


def prompt(i: int, tokens: int) -> str:
    """A prompt of about `tokens` tokens that starts differently each time (no prompt-cache reuse)."""
    repeats = max(1, tokens // 14)
    return f"Request {i}. " + FILLER * repeats + "Now tell a long story about lemons."


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


async def timed_stream(client: httpx.AsyncClient, model: str, content: str, max_tokens: int) -> dict[str, float]:
    """One streamed chat completion: seconds to the first token, tokens generated, decode seconds."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = time.perf_counter()
    first = 0.0
    chunks = 0
    tokens = 0
    async with client.stream("POST", CHAT, json=body) as resp:
        if resp.status_code != 200:
            raise BenchError(f"chat completion failed: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise BenchError(f"stream error: {event['error']}")
            choice = (event.get("choices") or [{}])[0]
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                chunks += 1
                first = first or time.perf_counter()
            usage = event.get("usage") or {}
            if usage.get("completion_tokens"):
                tokens = int(usage["completion_tokens"])
            if "timings" in event and event["timings"].get("predicted_n"):
                tokens = int(event["timings"]["predicted_n"])
    end = time.perf_counter()
    return {"start": start, "first": first or end, "end": end, "tokens": tokens or chunks}


class BenchError(RuntimeError):
    """A cell could not be measured (load refused, engine error); the message says why."""


@dataclass
class Bench:
    """Runs cells against one server. `http` is the server's base URL; `headers` carry the API key."""

    base_url: str
    model: str
    recipe: str
    settings: BenchSettings = field(default_factory=BenchSettings)
    headers: dict[str, str] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda _msg: None

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=self.settings.timeout)

    def load(self, cell: Cell) -> tuple[float, dict[str, Any]]:
        """Load the model with the cell's options (a reload when they differ); seconds and its health entry."""
        # Only the cell's options are sent: the rest comes from the model's saved options and the
        # server's config as in any load (request options are never kept from one load to the next).
        body: dict[str, Any] = {"model_name": self.model, **params_to_options(self.recipe, cell.params)}
        key = backend_option(self.recipe)
        if cell.backend and key:
            body[key] = cell.backend
        with self._client() as c:
            c.post("/v1/unload", json={"model_name": self.model})  # a fresh engine per cell (404 if none: fine)
            start = time.perf_counter()
            resp = c.post("/v1/load", json=body)
            seconds = time.perf_counter() - start
            if resp.status_code != 200:
                raise BenchError(f"load failed ({cell.label()}): HTTP {resp.status_code}: {resp.text[:300]}")
            health = c.get("/v1/health").json()
        entry = next((m for m in health.get("all_models_loaded", []) if m.get("model_name") == self.model), None)
        if entry is None:
            entry = next(iter(health.get("all_models_loaded", [])), {})
        return seconds, entry

    def memory_mb(self, pid: Any) -> float | None:
        """The engine's resident memory, when the server runs on this machine (else unknown: None)."""
        host = urlsplit(self.base_url).hostname or ""
        if not isinstance(pid, int) or host not in ("127.0.0.1", "localhost", "::1"):
            return None
        try:
            return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except psutil.Error:
            return None

    async def _measure(self) -> dict[str, Any]:
        s = self.settings
        limits = httpx.Limits(max_connections=s.streams + 4, max_keepalive_connections=s.streams + 4)
        async with httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=s.timeout,
                                     limits=limits) as client:
            n = itertools.count()
            for _ in range(s.warmup):
                await timed_stream(client, self.model, prompt(next(n), s.prompt_tokens), s.max_tokens)
            single = []
            for _ in range(s.runs):
                single.append(await timed_stream(client, self.model, prompt(next(n), s.prompt_tokens), s.max_tokens))
            rounds = []
            for _ in range(s.stream_rounds):
                runs = await asyncio.gather(*(timed_stream(client, self.model, prompt(next(n), s.prompt_tokens),
                                                           s.max_tokens) for _ in range(s.streams)))
                rounds.append(runs)
        one: dict[str, Any] = {  # lists of figures, then their medians
            "ttft_ms": [round((r["first"] - r["start"]) * 1000, 1) for r in single],
            "tokens_per_s": [round(r["tokens"] / max(r["end"] - r["start"], 1e-9), 2) for r in single],
            "decode_tokens_per_s": [round(max(r["tokens"] - 1, 0) / max(r["end"] - r["first"], 1e-9), 2)
                                    for r in single]}
        many: dict[str, Any] = {
            "ttft_ms": [round((r["first"] - r["start"]) * 1000, 1) for runs in rounds for r in runs],
            "tokens_per_s": [round(sum(r["tokens"] for r in runs)
                                   / max(max(r["end"] for r in runs) - min(r["start"] for r in runs), 1e-9), 2)
                             for runs in rounds]}
        for part in (one, many):
            part["median"] = {k: median(v) for k, v in list(part.items())}
        return {"single": one, "multi": many}

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        self.progress(f"{cell.label()}: loading")
        seconds, entry = self.load(cell)
        self.progress(f"{cell.label()}: measuring")
        load_before = os.getloadavg()[0]
        figures = asyncio.run(self._measure())
        # How busy the machine was: the 1-minute load average around the measurement (a shared
        # machine's figures are only comparable when it stayed the same).
        figures["load_avg"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        return {"backend": entry.get("backend", cell.backend), "params": cell.params, "stock": cell.stock,
                "options": params_to_options(self.recipe, cell.params), "load_seconds": round(seconds, 2),
                "memory_mb": self.memory_mb(entry.get("pid")), "launch_command": entry.get("launch_command"),
                "auto_tune": entry.get("auto_tune"), **figures}

    def run(self, cells: list[Cell], on_result: Callable[[list[dict[str, Any]]], None] | None = None
            ) -> list[dict[str, Any]]:
        """Every cell in order; `on_result` sees the list after each (so a long run keeps what it has)."""
        results: list[dict[str, Any]] = []
        for cell in cells:
            try:
                results.append(self.run_cell(cell))
            except (BenchError, httpx.HTTPError) as exc:
                self.progress(f"{cell.label()}: FAILED: {exc}")
                results.append({"backend": cell.backend, "params": cell.params, "stock": cell.stock,
                                "error": str(exc)})
            if on_result is not None:
                on_result(results)
        return results


def summary(result: dict[str, Any]) -> dict[str, float | None]:
    """The medians a row shows and a profile is judged by."""
    if "error" in result:
        return {}
    return {"ttft_ms": result["single"]["median"]["ttft_ms"], "tps_1": result["single"]["median"]["tokens_per_s"],
            "ttft_ms_n": result["multi"]["median"]["ttft_ms"], "tps_n": result["multi"]["median"]["tokens_per_s"],
            "memory_mb": result.get("memory_mb"), "load_seconds": result.get("load_seconds")}
