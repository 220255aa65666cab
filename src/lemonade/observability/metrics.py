"""Prometheus metrics, built with prometheus_client on a registry owned by the app.

Besides our own families, each loaded llama.cpp backend's `/metrics` is scraped at scrape time
and re-exposed as `lemonade_llamacpp_*` with the model's labels; a backend that fails to answer
is skipped, never failing the scrape.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lemonade import __version__

log = logging.getLogger("lemonade.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")
CHILDREN_KEPT = 4096


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Gauge("lemonade_server_up", "Whether the Lemonade server is running.", registry=r).set(1)
        Gauge("lemonade_server_info", "Lemonade server build information.", ["version"],
              registry=r).labels(version=__version__).set(1)
        self.requests = Counter("lemonade_http_requests", "HTTP requests by route family, method and status.",
                                ["family", "method", "status"], registry=r)
        self.latency = Histogram("lemonade_http_request_duration_seconds",
                                 "HTTP request latency by route family, to the end of the body.", ["family"],
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                          30, 60, 120),
                                 registry=r)
        self.loaded = Gauge("lemonade_models_loaded", "Models loaded, by model type.", ["type"], registry=r)
        # Lemonade's own series names (its app and dashboards read these): the total, the limits, and
        # per-model info labelled as it labels them.
        self.loaded_total = Gauge("lemonade_loaded_models", "Number of models currently loaded in Lemonade.",
                                  registry=r)
        self.max_loaded = Gauge("lemonade_max_loaded_models", "Configured loaded model limit per model type.",
                                ["type"], registry=r)
        self.model_info = Gauge("lemonade_model_info", "Loaded models with their metadata.",
                                ["model_name", "checkpoint", "type", "device", "recipe", "backend"], registry=r)
        self.model_requests = Counter("lemonade_model_requests", "Inference requests per model.",
                                      ["model", "endpoint"], registry=r)
        self.model_tokens = Counter("lemonade_model_tokens", "Tokens processed per model.",
                                    ["model", "kind"], registry=r)
        self.model_loads = Counter("lemonade_model_loads", "Model loads, by outcome.", ["model", "outcome"],
                                   registry=r)
        # Prompt tokens the engine served from its prefix cache: the last request's per model, and totals.
        self.model_cache = Gauge("lemonade_model_cache_tokens",
                                 "Latest prompt tokens served from the backend prefix cache for a model.",
                                 ["model_name"], registry=r)
        self.model_cache_total = Gauge("lemonade_model_cache_tokens_total",
                                       "Cumulative prompt tokens served from the backend prefix cache for a model.",
                                       ["model_name"], registry=r)
        self.cache_total = Counter("lemonade_cache_tokens", "Cumulative prompt tokens served from backend prefix "
                                   "caches.", registry=r)
        self.routing_decisions = Counter("lemonade_routing_decisions",
                                         "Cumulative collection.router routing decisions.", registry=r)
        self.routing_switches = Counter("lemonade_routing_switches", "Cumulative routing decisions that changed "
                                        "a conversation's routed model.", registry=r)
        # Speculative decoding per model (runtime/speculation.py), copied at scrape time.
        self.spec_active = Gauge("lemonade_speculation_active", "Whether the model's engine runs speculative "
                                 "decoding (1) or not (0).", ["model_name", "type"], registry=r)
        self.spec_acceptance = Gauge("lemonade_speculation_acceptance_rate", "Draft tokens the model accepted, "
                                     "as a fraction of those drafted.", ["model_name"], registry=r)
        self.spec_speedup = Gauge("lemonade_speculation_speedup", "Measured generation speed with speculative "
                                  "decoding over the model's speed without it.", ["model_name"], registry=r)
        self.spec_drafted = Gauge("lemonade_speculation_draft_tokens_total", "Cumulative draft tokens.",
                                  ["model_name"], registry=r)
        self.spec_accepted = Gauge("lemonade_speculation_accepted_tokens_total", "Cumulative draft tokens the "
                                   "model accepted.", ["model_name"], registry=r)
        # The router's queue and residency counters (`queue` in /v1/health), copied at scrape time.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.queue = Gauge("lemonade_router", "Requests waiting for a model slot (depth) and the router's running "
                           "totals: waits, loads, swaps, idle evictions, rejections, abandoned waits, watchdog "
                           "kills.", ["figure"], registry=r)

    def set_queue(self, info: dict[str, Any]) -> None:
        for key, value in info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.queue.labels(key).set(value)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: prometheus_client takes a lock and rebuilds the label
        tuple on each call, and every request records two to four of these (issue 17). Only for
        metrics whose children are never removed; bounded, since a client chooses the method."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            if len(self._children) < CHILDREN_KEPT:
                self._children[key] = child
        return child

    def observe_request(self, family: str, method: str, status: int, seconds: float) -> None:
        self._child(self.requests, family, method, str(status)).inc()
        self._child(self.latency, family).observe(seconds)

    def record_inference(self, model: str, endpoint: str, input_tokens: int | None,
                         output_tokens: int | None, cache_tokens: int | None = None) -> None:
        self._child(self.model_requests, model, endpoint).inc()
        if cache_tokens is not None:
            self._child(self.model_cache, model).set(cache_tokens)
            self._child(self.model_cache_total, model).inc(cache_tokens)
            self.cache_total.inc(cache_tokens)
        if input_tokens:
            self._child(self.model_tokens, model, "input").inc(input_tokens)
        if output_tokens:
            self._child(self.model_tokens, model, "output").inc(output_tokens)

    def record_route(self, switched: bool) -> None:
        self.routing_decisions.inc()
        if switched:
            self.routing_switches.inc()

    def set_speculation(self, models: dict[str, dict[str, Any]]) -> None:
        """Refresh the speculation gauges from the controller's figures per model (at scrape time)."""
        for gauge in (self.spec_active, self.spec_acceptance, self.spec_speedup, self.spec_drafted,
                      self.spec_accepted):
            gauge.clear()
        for name, figures in models.items():
            self.spec_active.labels(name, figures.get("type") or "").set(1 if figures.get("type") else 0)
            for gauge, key in ((self.spec_acceptance, "acceptance_rate"), (self.spec_speedup, "speedup"),
                               (self.spec_drafted, "draft_tokens"), (self.spec_accepted, "draft_accepted_tokens")):
                if figures.get(key) is not None:
                    gauge.labels(name).set(figures[key])

    def set_loaded(self, loaded: Iterable[dict[str, Any]], limits: dict[str, int]) -> None:
        """Refresh the residency gauges from the router's view and its limits (called at scrape time)."""
        self.loaded.clear()
        self.model_info.clear()
        counts: dict[str, int] = {}
        for m in loaded:
            counts[m["type"]] = counts.get(m["type"], 0) + 1
            self.model_info.labels(m["model_name"], m.get("checkpoint", ""), m["type"], m.get("device", ""),
                                   m["recipe"], m.get("backend", "")).set(1)
        for kind in ("llm", "embedding", "reranking", "transcription", "image", "tts", *counts):
            self.loaded.labels(kind).set(counts.get(kind, 0))
        self.loaded_total.set(sum(counts.values()))
        for kind, limit in limits.items():
            self.max_loaded.labels(kind).set(limit)

    async def render(self, backends: list[tuple[dict[str, str], str]], client: httpx.AsyncClient) -> bytes:
        """Our families plus each llama.cpp backend's, relabelled. `backends`: (labels, metrics url)."""
        own = generate_latest(self.registry)
        scraped = await asyncio.gather(*(self._scrape(client, url) for _labels, url in backends))
        return own + relay_llamacpp(list(zip([b[0] for b in backends], scraped, strict=True)))

    @staticmethod
    async def _scrape(client: httpx.AsyncClient, url: str) -> str | None:
        try:
            resp = await client.get(url, timeout=2.0)
            return resp.text if resp.status_code == 200 else None
        except httpx.HTTPError as exc:
            log.debug("Backend metrics scrape of %s failed: %s", url, exc)
            return None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def relay_llamacpp(scrapes: list[tuple[dict[str, str], str | None]]) -> bytes:
    """Rename `llamacpp:prompt_tokens_total` to `lemonade_llamacpp_prompt_tokens_total` etc."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for labels, text in scrapes:
        if not text:
            continue
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError:
            continue
        for family in parsed:
            base = "lemonade_llamacpp_" + _NAME_RE.sub("_", family.name.split(":", 1)[-1])
            ftype = family.type if family.type in ("counter", "gauge", "histogram", "summary") else "untyped"
            entry = families.setdefault(base, (ftype, family.documentation or family.name, []))
            for sample in family.samples:
                if sample.value != sample.value or sample.value in (float("inf"), float("-inf")):
                    continue  # spec: NaN and infinity are omitted
                suffix = sample.name[len(family.name):] if sample.name.startswith(family.name) else ""
                all_labels = {**labels, **sample.labels}
                label_text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in all_labels.items())
                entry[2].append(f"{base}{suffix}{{{label_text}}} {sample.value}")
    out = []
    for name, (ftype, doc, lines) in families.items():
        if ftype == "counter" and not name.endswith("_total"):
            ftype = "untyped"  # keep the exposition valid for counters whose name lacks _total
        out.append(f"# HELP {name} {_escape(doc)}\n# TYPE {name} {ftype}\n" + "\n".join(lines) + "\n")
    return "".join(out).encode()
