"""Traces of inference requests: to an OTLP receiver (`telemetry.enabled`) and to `/spans/stream`.

Lemonade's tracing (guide-configuration-README.md, `telemetry`): each inference request is one
span (observability/spans.py says which and what it carries), exported in batches over OTLP/HTTP
as protobuf or JSON (observability/otlp_export.py). Independently of `telemetry.enabled`, live
listeners of the `/spans/stream` WebSocket (api/lemonade/spans.py) receive every span they may see.

Off (not enabled, nobody listening), it costs one flag check per request: api/guard.py starts no
span, and every other site finds `request_trace` empty (runtime/request_context.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lemonade.observability.otlp_export import Destination, SpanExporter, receiver_headers
from lemonade.observability.spans import InferenceSpan, public, request_origin

if TYPE_CHECKING:
    from lemonade.config import Config

log = logging.getLogger("lemonade.telemetry")
CAPTURES = (("inputs", "hide_inputs"), ("outputs", "hide_outputs"), ("thinking", "hide_thinking"))
SpanListener = Callable[[dict[str, Any]], None]


class Telemetry:
    """The server's tracer: settings from config (read per span, so changes apply at once), the
    OTLP exporter, and the `/spans/stream` listeners."""

    def __init__(self, config: Config) -> None:
        from lemonade import __version__

        self.config = config
        self.exporter = SpanExporter(lambda: self.config.get("telemetry"), __version__)
        self._listeners: set[SpanListener] = set()
        self.enabled = False
        self.active = False  # the one flag the request path reads: exporting, or someone listening
        self._apply()
        config.on_change(lambda changed: self._apply() if any(k.startswith("telemetry.") for k in changed) else None)

    def settings(self) -> dict[str, Any]:
        return self.config.get("telemetry")

    def _apply(self) -> None:
        was, self.enabled = self.enabled, bool(self.settings()["enabled"])
        self.active = self.enabled or bool(self._listeners)
        if self.enabled and not was:
            otlp = self.settings()["otlp"]
            log.info("Telemetry on: traces go to %s (%s)", otlp["endpoint"], otlp["protocol"])

    # ----- spans ------------------------------------------------------------------------------------
    def start(self, kind: str, name: str, headers: dict[str, str]) -> InferenceSpan:
        settings = self.settings()
        return InferenceSpan(kind, name, request_origin(headers, settings), settings)

    def finish(self, span: InferenceSpan) -> None:
        """The span is done: to the listeners, and to the receiver when exporting."""
        data = span.export()
        for listener in list(self._listeners):
            try:
                listener(data)
            except Exception:  # one broken listener must not cost the others their spans
                log.exception("A /spans/stream listener failed")
        if self.enabled:
            otlp = self.settings()["otlp"]
            self.exporter.push(public(data), Destination(otlp["endpoint"], receiver_headers(otlp["headers"]),
                                                         otlp["protocol"]))

    def listen(self, listener: SpanListener) -> Callable[[], None]:
        """Adds a live listener of every finished span; returns its removal."""
        self._listeners.add(listener)
        self.active = True

        def remove() -> None:
            self._listeners.discard(listener)
            self.active = self.enabled or bool(self._listeners)

        return remove

    # ----- the rest ---------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """`telemetry` of `/v1/health`."""
        if not self.enabled:
            return {"enabled": False}
        settings = self.settings()
        return {"enabled": True, "captures": [name for name, hide in CAPTURES if not settings[hide]]}

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every queued span now (blocking: run it in a thread)."""
        return self.exporter.flush(timeout_s)

    def shutdown(self) -> None:
        self.exporter.shutdown()
