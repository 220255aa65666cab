"""`lemonade bench`: measure models through a running server, as Lemonade's `bench` does.

Why through the server: what a user gets is the engine as the server starts it, so every setting is
a real `/v1/load` and every figure comes from real requests. A setting is one load: a backend, a
context size, an argument set (`--llamacpp-args`) and the auto-tune grid's parameters (`--threads`,
`--batch`, ...; the stock setting, none of them, comes first and the others are judged against it).
Per setting, each scenario (`autotune/scenarios.py`) runs its warm-up and measured runs; before each
run the model is loaded afresh (no prompt cache carries over) unless `reload` is off, when one load
serves the setting's every run. A run's figures are the engine's own when it reports them
(llama-server's `timings`: prompt time as TTFT, decode tokens/s), else timed here; after a run the
model's memory (`/v1/health`: the server's estimate and its measurements of the engine process
tree, with their peak) and the machine's (`/v1/system-stats`) are read. With `streams`, each
setting also gets N concurrent streamed requests of its first text scenario (aggregate tokens/s),
the figure auto-tune's profiles were judged by.

The measuring is kept apart from shaping and printing (`bench_report.py`, `cli/bench_cmd.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from lemonade.autotune.scenarios import Scenario
from lemonade.backends.tuning import args_option, backend_option, params_to_options

CHAT = "/v1/chat/completions"


class BenchError(RuntimeError):
    """A setting or a run could not be measured (load refused, engine error); the message says why."""


@dataclass
class Setting:
    """One load: a backend, a context size, an argument set and tuning parameters (None = default)."""

    backend: str | None
    ctx_size: int | None = None
    args: str = ""
    params: dict[str, int | None] = field(default_factory=dict)

    @property
    def stock(self) -> bool:
        return not self.args and all(v is None for v in self.params.values())

    def label(self, recipe: str) -> str:
        """Lemonade's `recipe/backend (ctx=N) args=[...]`, then the grid's parameters."""
        text = f"{recipe}/{self.backend or 'default'}"
        if self.ctx_size:
            text += f" (ctx={self.ctx_size})"
        if self.args:
            text += f" args=[{self.args}]"
        given = [f"{k}={v}" for k, v in self.params.items() if v is not None]
        return text + (" " + " ".join(given) if given else "")

    def options(self, recipe: str) -> dict[str, Any]:
        """The `/v1/load` options: the grid's flags with the argument set (which replaces the server's
        own flags for this load, `merge_args: false`, as Lemonade's bench does)."""
        options = params_to_options(recipe, self.params)
        if self.ctx_size:
            options["ctx_size"] = self.ctx_size
        key = args_option(recipe)
        if self.args and key:
            options[key] = f"{self.args} {options.get(key, '')}".strip()
            options["merge_args"] = False
        return options


def settings(backends: list[str | None], ctx_sizes: list[int | None], arg_sets: list[str],
             values: dict[str, list[int | None]]) -> list[Setting]:
    """Every combination; per backend, context and argument set the stock grid point first."""
    names = list(values)
    out: list[Setting] = []
    seen: set[str] = set()
    for backend, ctx, args in itertools.product(backends, ctx_sizes or [None], arg_sets or [""]):
        combos = [dict(zip(names, c, strict=True)) for c in itertools.product(*(values[n] for n in names))]
        stock: dict[str, int | None] = {n: None for n in names}
        for params in [stock, *combos]:
            key = json.dumps([backend, ctx, args, params], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(Setting(backend, ctx, args, params))
    return out


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks (Lemonade's bench: p50, p95)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = p / 100 * (len(ordered) - 1)
    low, high = math.floor(index), math.ceil(index)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def stats(values: list[float]) -> dict[str, float]:
    return {"mean": round(sum(values) / len(values), 3), "min": round(min(values), 3), "max": round(max(values), 3),
            "p50": round(percentile(values, 50), 3), "p95": round(percentile(values, 95), 3)}


def gb(value: Any) -> float | None:
    return round(value / 2**30, 3) if isinstance(value, int | float) and value >= 0 else None


@dataclass
class Run:
    """One measured request."""

    ttft_ms: float = 0.0
    tps: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    duration_ms: float = 0.0
    response: Any = None
    model_memory_bytes: int | None = None   # the engine's, measured by the server after the run
    model_peak_bytes: int | None = None
    memory_gb: float | None = None          # the machine's RAM in use (/v1/system-stats)
    vram_gb: float | None = None


@dataclass
class Bench:
    """Runs one model's settings and scenarios against one server."""

    base_url: str
    model: str
    recipe: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 300.0
    memory: bool = True
    reload: bool = True
    response_log: Path | None = None
    timestamp: str = ""
    progress: Callable[[str], None] = lambda _msg: None
    entry: dict[str, Any] = field(default_factory=dict)  # the model's /v1/health entry after the last load

    def _client(self, timeout: float | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout or self.timeout)

    # ----- loads ---------------------------------------------------------------------------------------------

    def load(self, setting: Setting) -> dict[str, Any]:
        """A fresh engine with the setting's options; its `/v1/health` entry."""
        body: dict[str, Any] = {"model_name": self.model, "save_options": False, **setting.options(self.recipe)}
        key = backend_option(self.recipe)
        if setting.backend and key:
            body[key] = setting.backend
        with self._client(timeout=max(self.timeout, 3600)) as c:  # a load may install and download
            c.post("/v1/unload", json={"model_name": self.model})  # 404 when not loaded: fine
            resp = c.post("/v1/load", json=body)
            if resp.status_code != 200:
                raise BenchError(f"load failed ({setting.label(self.recipe)}): HTTP {resp.status_code}: "
                                 f"{_message(resp)}")
            self.entry = self._health_entry(c)
        return self.entry

    def _health_entry(self, c: httpx.Client) -> dict[str, Any]:
        health = c.get("/v1/health").json()
        return next((m for m in health.get("all_models_loaded", []) if m.get("model_name") == self.model), {})

    # ----- one run -------------------------------------------------------------------------------------------

    def run_once(self, scenario: Scenario, capture: bool) -> Run:
        """One request of the scenario, timed; BenchError when it fails or says nothing measurable."""
        if scenario.kind == "embed":
            path, body = "/v1/embeddings", {"model": self.model, "input": scenario.input}
        elif scenario.kind == "imagegen":
            path, body = "/v1/images/generations", {"model": self.model, **scenario.image,
                                                    "response_format": "b64_json"}
        else:
            path, body = CHAT, {"model": self.model, "messages": scenario.chat_messages(),
                                "max_completion_tokens": scenario.max_tokens, "temperature": 0}
        with self._client() as c:
            start = time.perf_counter()
            try:
                resp = c.post(path, json=body)
            except httpx.HTTPError as exc:
                raise BenchError(f"request failed: {exc}") from None
            run = Run(duration_ms=round((time.perf_counter() - start) * 1000, 2))
            if resp.status_code != 200:
                raise BenchError(f"HTTP {resp.status_code}: {_message(resp)}")
            data = resp.json()
            _figures(data, run, scenario)
            if capture:
                run.response = _response_text(data, scenario)
            if self.memory:
                self._memory(c, run)
        if scenario.kind == "textgen" or scenario.kind == "vision":
            if run.ttft_ms <= 0 and run.tps <= 0 and run.output_tokens <= 0:
                raise BenchError("the answer carried no timings and no token counts")
        return run

    def _memory(self, c: httpx.Client, run: Run) -> None:
        entry = self._health_entry(c)
        run.model_memory_bytes = entry.get("memory_bytes")
        peak = entry.get("memory_peak_bytes")
        if run.model_memory_bytes is None:  # not measured yet: measure it here when the server is local
            run.model_memory_bytes = self._local_tree_bytes(entry.get("pid"))
        run.model_peak_bytes = max(v for v in (peak, run.model_memory_bytes, 0) if isinstance(v, int)) or None
        try:
            system = c.get("/v1/system-stats").json()
        except (httpx.HTTPError, ValueError):
            return
        run.memory_gb, run.vram_gb = system.get("memory_gb"), system.get("vram_gb")

    def _local_tree_bytes(self, pid: Any) -> int | None:
        from lemonade.system.memory import process_tree_memory

        if not isinstance(pid, int) or (urlsplit(self.base_url).hostname or "") not in ("127.0.0.1", "localhost",
                                                                                         "::1"):
            return None
        measured = process_tree_memory(pid)
        return measured[0] if measured else None

    # ----- a scenario ----------------------------------------------------------------------------------------

    def run_scenario(self, setting: Setting, scenario: Scenario, warmup: int, runs: int) -> dict[str, Any]:
        """The scenario's warm-up and measured runs; its result in Lemonade's JSON shape (plus the
        model's own memory)."""
        done: list[Run] = []
        failed = 0
        for i in range(warmup):
            try:
                if self.reload:
                    self.load(setting)
                self.run_once(scenario, capture=False)
                self.progress(f"    warm-up {i + 1}/{warmup} done")
            except (BenchError, httpx.HTTPError) as exc:
                self.progress(f"    warm-up {i + 1}/{warmup} failed: {exc}")
        for i in range(runs):
            try:
                if self.reload:
                    self.load(setting)
                run = self.run_once(scenario, capture=self.response_log is not None)
            except (BenchError, httpx.HTTPError) as exc:
                failed += 1
                self.progress(f"    run {i + 1}/{runs} FAILED (left out of the figures): {exc}")
                continue
            self.progress(f"    run {i + 1}/{runs}: TTFT {run.ttft_ms:.1f} ms, {run.tps:.1f} tokens/s")
            if self.response_log is not None:
                self._log_response(setting, scenario, i + 1, run)
            done.append(run)
        return scenario_result(scenario, done, failed)

    def _log_response(self, setting: Setting, scenario: Scenario, number: int, run: Run) -> None:
        """One JSONL line: the answer and what produced it (Lemonade's `--response-log` fields)."""
        assert self.response_log is not None
        line = {"timestamp": self.timestamp, "model": self.model, "recipe": self.recipe,
                "backend": self.entry.get("backend", setting.backend), "ctx_size": self.ctx_size(setting),
                "backend_args": setting.args, "params": setting.params, "scenario": scenario.name,
                "category": scenario.category, "run_number": number, "input_tokens": run.input_tokens,
                "output_tokens": run.output_tokens, "ttft_ms": run.ttft_ms, "tps": run.tps,
                "response": run.response}
        with open(self.response_log, "a", encoding="utf-8") as log:
            log.write(json.dumps(line, ensure_ascii=False) + "\n")
        run.response = None

    def ctx_size(self, setting: Setting) -> int:
        """The context the setting asked for, else the one the engine reports (0: unknown)."""
        return int(setting.ctx_size or self.entry.get("context_length") or 0)

    # ----- a setting -----------------------------------------------------------------------------------------

    def run_setting(self, setting: Setting, scenarios: list[Scenario], warmup: int | None, runs: int | None,
                    streams: int = 0) -> dict[str, Any]:
        """Every scenario of one setting; its result in Lemonade's JSON shape plus the setting's own
        figures (load time, launch command, the engine's context and memory, concurrent streams)."""
        label = setting.label(self.recipe)
        result: dict[str, Any] = {"recipe": self.recipe, "backend": setting.backend, "ctx_size": setting.ctx_size or 0,
                                  "backend_args": setting.args, "params": setting.params, "stock": setting.stock,
                                  "options": setting.options(self.recipe), "scenarios": []}
        self.progress(f"=== [{self.model}] {label} ===")
        try:
            entry = self.load(setting)
        except (BenchError, httpx.HTTPError) as exc:
            self.progress(f"  {exc}")
            return {**result, "error": str(exc)}
        load_before = os.getloadavg()[0]
        result.update(backend=entry.get("backend", setting.backend), ctx_size=self.ctx_size(setting),
                      context_length=entry.get("context_length"), load_seconds=entry.get("load_seconds"),
                      launch_command=entry.get("launch_command"), auto_tune=entry.get("auto_tune"),
                      memory_estimate_gb=gb(entry.get("memory_estimate_bytes")))
        for scenario in scenarios:
            self.progress(f"  scenario {scenario.name} ({scenario.category})")
            result["scenarios"].append(self.run_scenario(
                setting, scenario, scenario.warmup_runs if warmup is None else warmup,
                scenario.measurement_runs if runs is None else runs))
        text = next((s for s in scenarios if s.kind == "textgen"), None)
        if streams and text is not None:
            self.progress(f"  {streams} concurrent streams of {text.name}")
            try:
                if self.reload:
                    self.load(setting)
                result["concurrent"] = asyncio.run(self._concurrent(text, streams))
            except (BenchError, httpx.HTTPError) as exc:
                result["concurrent"] = {"streams": streams, "error": str(exc)}
        # How busy the machine was around the measurement (a shared machine's figures are only
        # comparable when it stayed the same).
        result["load_avg"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        peaks = [s["model_memory_gb"]["peak"] for s in result["scenarios"] if s.get("model_memory_gb")]
        result["model_memory_peak_gb"] = max(peaks) if peaks else None
        return result

    async def _concurrent(self, scenario: Scenario, streams: int) -> dict[str, Any]:
        limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
        async with httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=self.timeout,
                                     limits=limits) as client:
            runs = await asyncio.gather(*(timed_stream(client, self.model, scenario, n) for n in range(streams)))
        tokens = sum(r["tokens"] for r in runs)
        span = max(r["end"] for r in runs) - min(r["start"] for r in runs)
        ttfts = [round((r["first"] - r["start"]) * 1000, 1) for r in runs]
        return {"streams": streams, "scenario": scenario.name, "ttft_ms": stats(ttfts),
                "tokens_per_s": round(tokens / max(span, 1e-9), 2), "tokens": tokens}


async def timed_stream(client: httpx.AsyncClient, model: str, scenario: Scenario, n: int) -> dict[str, float]:
    """One streamed chat completion of the scenario (its last message told apart per stream, so no
    two share a prompt cache): start, first token and end times, tokens generated."""
    messages = [dict(m) for m in scenario.chat_messages()]
    if isinstance(messages[-1].get("content"), str):
        messages[-1]["content"] = f"{messages[-1]['content']} ({n})"
    body = {"model": model, "messages": messages, "max_tokens": scenario.max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = time.perf_counter()
    first = 0.0
    chunks = tokens = 0
    async with client.stream("POST", CHAT, json=body) as resp:
        if resp.status_code != 200:
            raise BenchError(f"chat completion failed: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise BenchError(f"stream error: {event['error']}")
            delta = ((event.get("choices") or [{}])[0]).get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                chunks += 1
                first = first or time.perf_counter()
            tokens = int((event.get("usage") or {}).get("completion_tokens") or tokens)
    end = time.perf_counter()
    return {"start": start, "first": first or end, "end": end, "tokens": tokens or chunks}


def _figures(data: dict[str, Any], run: Run, scenario: Scenario) -> None:
    """TTFT, tokens/s and token counts from the answer: the engine's `timings` first, then `usage`;
    an embedding's or a picture's TTFT is its whole request (Lemonade's rule)."""
    usage: dict[str, Any] = data["usage"] if isinstance(data.get("usage"), dict) else {}
    timings: dict[str, Any] = data["timings"] if isinstance(data.get("timings"), dict) else {}
    run.input_tokens = int(timings.get("prompt_n") or usage.get("prompt_tokens") or 0)
    run.output_tokens = int(timings.get("predicted_n") or usage.get("completion_tokens") or 0)
    if scenario.kind in ("embed", "imagegen"):
        run.ttft_ms = run.duration_ms
        run.tps = float(timings.get("predicted_per_second") or 0.0)
        return
    run.ttft_ms = round(float(timings.get("prompt_ms") or 0.0), 2)
    run.tps = round(float(timings.get("predicted_per_second") or 0.0), 2)
    if run.tps <= 0 and run.output_tokens and run.duration_ms:
        run.tps = round(run.output_tokens * 1000 / run.duration_ms, 2)


def _response_text(data: dict[str, Any], scenario: Scenario) -> Any:
    if scenario.kind == "embed":
        return data.get("data")
    if scenario.kind == "imagegen":
        return ((data.get("data") or [{}])[0]).get("b64_json")
    choice = (data.get("choices") or [{}])[0]
    return (choice.get("message") or {}).get("content", choice)


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error")
        return str(err.get("message") if isinstance(err, dict) else err or resp.text)[:300]
    except (ValueError, AttributeError):
        return resp.text[:300]


def scenario_result(scenario: Scenario, runs: list[Run], failed: int) -> dict[str, Any]:
    """Lemonade's per-scenario JSON: token counts of the first run, `ttft_ms`, `duration_ms` and
    `tps` statistics, the machine's memory peaks; and the model's own memory (`model_memory_gb`)."""
    out: dict[str, Any] = {"name": scenario.name, "category": scenario.category,
                           "input_tokens": runs[0].input_tokens if runs else 0,
                           "output_tokens": runs[0].output_tokens if runs else 0}
    if not runs:
        return {**out, "all_runs_failed": True, "failed_runs": failed}
    out.update(ttft_ms=stats([r.ttft_ms for r in runs]), duration_ms=stats([r.duration_ms for r in runs]),
               tps=stats([r.tps for r in runs]))
    for key, values in (("vram_peak_gb", [r.vram_gb for r in runs]), ("memory_peak_gb", [r.memory_gb for r in runs])):
        known = [v for v in values if isinstance(v, int | float)]
        if known:
            out[key] = max(known)
    measured = [r.model_memory_bytes for r in runs if r.model_memory_bytes]
    peaks = [r.model_peak_bytes for r in runs if r.model_peak_bytes]
    if measured or peaks:
        out["model_memory_gb"] = {"measured": gb(max(measured)) if measured else None,
                                  "peak": gb(max(peaks or measured))}
    out["failed_runs"] = failed
    return out


def summary(result: dict[str, Any]) -> dict[str, float | None]:
    """The figures a setting is judged by against stock (auto-tune's contribution): the mean over its
    text scenarios of their mean TTFT and tokens/s, the concurrent streams' median TTFT and aggregate
    tokens/s, the model's memory peak in MB and the load time."""
    if "error" in result:
        return {}
    text = [s for s in result.get("scenarios", []) if "tps" in s and s.get("category") not in ("embed", "imagegen")]
    concurrent = result.get("concurrent") or {}

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 2) if values else None

    peak = result.get("model_memory_peak_gb")
    return {"ttft_ms": mean([s["ttft_ms"]["mean"] for s in text]), "tps_1": mean([s["tps"]["mean"] for s in text]),
            "ttft_ms_n": (concurrent.get("ttft_ms") or {}).get("p50"), "tps_n": concurrent.get("tokens_per_s"),
            "memory_mb": round(peak * 1024, 1) if peak else None, "load_seconds": result.get("load_seconds")}
