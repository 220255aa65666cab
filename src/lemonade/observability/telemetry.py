"""OpenTelemetry traces of requests, exported over OTLP/HTTP (guide-configuration-README.md, `telemetry`).

Off by default, and then free: nothing of OpenTelemetry is imported, the request layer
(api/guard.py) checks one flag and sets no trace, and every other site finds `request_trace`
empty (runtime/request_context.py). When `telemetry.enabled`, each HTTP request is a root span
(`POST /v1/chat/completions`) with children for what it went through:

- `lemonade.route`: the model name resolved to a catalog entry (requested and resolved names, recipe);
- `lemonade.load`: waiting for the model (install, download, queue, engine start), when not resident;
- `lemonade.engine`: the call to the engine (or cloud provider) until its answer, or its first byte
  when streamed;
- `lemonade.stream`: relaying a stream, chunk count and bytes.

Model and token attributes follow the configured semantics (`openinference`: `llm.*`, `otel_genai`:
`gen_ai.*`); prompts and answers are captured unless `hide_inputs` / `hide_outputs` say otherwise.
Spans leave in batches through the SDK's BatchSpanProcessor and the official OTLP/HTTP protobuf
exporter (`send_batch_size`, `batch_timeout_s`, `max_queue_capacity`); `flush()` forces them out
(`POST /internal/telemetry/flush`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lemonade.config import Config

log = logging.getLogger("lemonade.telemetry")
CAPTURES = (("inputs", "hide_inputs"), ("outputs", "hide_outputs"), ("thinking", "hide_thinking"))
UNTRACED_PATHS = ("/live", "/metrics", "/internal/telemetry/flush")
MAX_CAPTURE_CHARS = 32768  # a captured prompt or answer is cut here: spans are not a transcript store


class Telemetry:
    """The server's tracer: built from config, rebuilt when a `telemetry.*` key changes."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.enabled = False  # the one flag the request path reads
        self._provider: Any = None
        self._tracer: Any = None
        self._lock = threading.Lock()
        self.apply()
        config.on_change(lambda changed: self.apply() if any(k.startswith("telemetry.") for k in changed) else None)

    def settings(self) -> dict[str, Any]:
        return self.config.get("telemetry")

    def apply(self) -> None:
        """(Re)build the exporter pipeline from the current settings; the old one is flushed and shut
        down in the background (its endpoint may be slow to answer)."""
        settings = self.settings()
        with self._lock:
            old, self._provider, self._tracer = self._provider, None, None
            self.enabled = False
            if settings["enabled"]:
                self._provider, self._tracer = self._build(settings)
                self.enabled = True
        if old is not None:
            threading.Thread(target=old.shutdown, name="telemetry-shutdown", daemon=True).start()
        if settings["enabled"]:
            log.info("Telemetry on: traces go to %s (%s)", settings["otlp"]["endpoint"], settings["otlp"]["protocol"])

    @staticmethod
    def _build(settings: dict[str, Any]) -> tuple[Any, Any]:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from lemonade import __version__

        otlp = settings["otlp"]
        if otlp["protocol"] != "http/protobuf":
            log.warning("telemetry.otlp.protocol %s: this server exports http/protobuf only", otlp["protocol"])
        exporter = OTLPSpanExporter(endpoint=otlp["endpoint"], headers=dict(otlp["headers"]) or None,
                                    timeout=10, compression=Compression.NoCompression)
        provider = TracerProvider(resource=Resource.create({"service.name": "lemonade",
                                                            "service.version": __version__}))
        batch = min(int(otlp["send_batch_size"]), int(settings["max_queue_capacity"]))
        provider.add_span_processor(BatchSpanProcessor(
            exporter, max_queue_size=int(settings["max_queue_capacity"]), max_export_batch_size=batch,
            schedule_delay_millis=float(otlp["batch_timeout_s"]) * 1000))
        return provider, provider.get_tracer("lemonade")

    def state(self) -> dict[str, Any]:
        """`telemetry` of `/v1/health`."""
        if not self.enabled:
            return {"enabled": False}
        settings = self.settings()
        return {"enabled": True, "captures": [name for name, hide in CAPTURES if not settings[hide]]}

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every queued span now (blocking: run it in a thread)."""
        provider = self._provider
        return True if provider is None else bool(provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        with self._lock:
            provider, self._provider, self._tracer, self.enabled = self._provider, None, None, False
        if provider is not None:
            provider.shutdown()

    def start_request(self, method: str, path: str) -> RequestTrace | None:
        """The root span of one HTTP request, or None for paths not worth a trace."""
        tracer = self._tracer
        if tracer is None or path in UNTRACED_PATHS:
            return None
        from opentelemetry.trace import SpanKind

        span = tracer.start_span(f"{method} {path}", kind=SpanKind.SERVER,
                                 attributes={"http.request.method": method, "url.path": path})
        return RequestTrace(tracer, span, self.settings())


class RequestTrace:
    """One request's root span and the children made under it (the sites call these only when a
    trace is set, so none of this runs when telemetry is off)."""

    def __init__(self, tracer: Any, root: Any, settings: dict[str, Any]) -> None:
        self.tracer = tracer
        self.root = root
        self.semantics = set(settings["otlp"]["semantics"])
        self.hide_inputs = bool(settings["hide_inputs"])
        self.hide_outputs = bool(settings["hide_outputs"])

    def child(self, name: str, attributes: dict[str, Any] | None = None) -> Any:
        from opentelemetry import trace

        return self.tracer.start_span(name, context=trace.set_span_in_context(self.root),
                                      attributes={k: v for k, v in (attributes or {}).items() if v is not None})

    def end(self, status: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        self.root.end()

    @staticmethod
    def fail(span: Any, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, str(getattr(exc, "message", exc))[:500]))
        span.end()

    # ----- model attributes, in the configured semantics -------------------------------------------
    def model_call(self, span: Any, *, model: str, recipe: str, endpoint: str, body: dict[str, Any] | None) -> None:
        """What is asked of which model; the prompt unless inputs are hidden."""
        kind = "EMBEDDING" if endpoint == "embeddings" else "RERANKER" if endpoint == "rerank" else "LLM"
        prefix = {"EMBEDDING": "embedding", "RERANKER": "reranker"}.get(kind, "llm")
        attrs: dict[str, Any] = {"lemonade.endpoint": endpoint, "lemonade.recipe": recipe}
        if "openinference" in self.semantics:
            attrs.update({"openinference.span.kind": kind, f"{prefix}.model_name": model, "llm.system": recipe})
        if "otel_genai" in self.semantics:
            attrs.update({"gen_ai.system": recipe, "gen_ai.request.model": model,
                          "gen_ai.operation.name": "embeddings" if kind == "EMBEDDING" else "chat"})
        if body is not None and not self.hide_inputs:
            prompt = body.get("messages", body.get("input", body.get("prompt")))
            if prompt is not None:
                text = _capped(prompt)
                if "openinference" in self.semantics:
                    attrs["input.value"] = text
                if "otel_genai" in self.semantics:
                    attrs["gen_ai.input.messages"] = text
        span.set_attributes(attrs)

    def usage(self, span: Any, tokens_in: int | None, tokens_out: int | None,
              answer: dict[str, Any] | None = None, started: float | None = None) -> None:
        """Token counts (and the answer, unless outputs are hidden) of a finished call."""
        attrs: dict[str, Any] = {}
        if tokens_in is not None or tokens_out is not None:
            total = (tokens_in or 0) + (tokens_out or 0)
            if "openinference" in self.semantics:
                attrs.update({"llm.token_count.prompt": tokens_in, "llm.token_count.completion": tokens_out,
                              "llm.token_count.total": total})
            if "otel_genai" in self.semantics:
                attrs.update({"gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out})
            if started is not None and tokens_out:
                tps = tokens_out / max(time.perf_counter() - started, 1e-6)
                attrs["llm.performance.tokens_per_second" if "openinference" in self.semantics
                      else "gen_ai.usage.tokens_per_second"] = round(tps, 2)
        if answer is not None and not self.hide_outputs:
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if isinstance(choices, list) and choices:
                first = choices[0] if isinstance(choices[0], dict) else {}
                text = (first.get("message") or {}).get("content") if "message" in first else first.get("text")
                if isinstance(text, str):
                    if "openinference" in self.semantics:
                        attrs["output.value"] = text[:MAX_CAPTURE_CHARS]
                    if "otel_genai" in self.semantics:
                        attrs["gen_ai.output.messages"] = json.dumps(
                            [{"role": "assistant", "content": text[:MAX_CAPTURE_CHARS]}])
        span.set_attributes({k: v for k, v in attrs.items() if v is not None})


def _capped(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:MAX_CAPTURE_CHARS]
