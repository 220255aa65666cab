"""Sending finished spans to an OTLP/HTTP receiver, in batches, off the request path.

The rules are the ones the configuration guide states (guide-configuration-README.md, "Telemetry
and Tracing Details"):

- spans wait in one bounded queue (`max_queue_capacity`); when it is full the oldest is dropped
  (head-drop: current state matters more than old);
- a batch leaves when `send_batch_size` spans for one destination are waiting, or when the oldest
  has waited `batch_timeout_s`; `flush()` sends everything now;
- `http/protobuf` bodies are `ExportTraceServiceRequest` messages (encoded with the collector's own
  message types from `opentelemetry-proto`), `http/json` bodies are the same in OTLP/JSON;
- a failed batch is tried again `max_retries` times after `retry_backoff_base_s * 2^n` seconds
  (at most 60, times a 0.5-1.5 jitter); a 4xx other than 429 is not retried; a batch that fails
  every retry marks the endpoint unreachable, and until one batch gets through, later batches
  are tried once and dropped without waiting;
- the receiver's headers are the configured ones plus `OTEL_EXPORTER_OTLP_HEADERS`; names or values
  with CR, LF or NUL are refused, and `Content-Type`/`Content-Length` cannot be overridden.

Each queued span carries the destination (endpoint, headers, protocol) it was made under, so a
setting changed meanwhile never sends an old span somewhere it was not meant for.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("lemonade.telemetry")
SERVICE_NAME = "lemonade-server"
MAX_BACKOFF_S = 60.0
SEND_TIMEOUT_S = 5.0
FORBIDDEN_HEADERS = ("content-type", "content-length")


@dataclass(frozen=True)
class Destination:
    endpoint: str
    headers: tuple[tuple[str, str], ...]
    protocol: str


@dataclass
class _Queued:
    span: dict[str, Any]
    dest: Destination
    arrived: float = field(default_factory=time.monotonic)


def receiver_headers(configured: dict[str, str], environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The headers sent to the receiver: configured ones, then `OTEL_EXPORTER_OTLP_HEADERS`
    (`k=v,k2=v2`), trimmed; unsafe or reserved ones are left out (and logged)."""
    env = os.environ if environ is None else environ
    pairs = list(configured.items())
    for item in env.get("OTEL_EXPORTER_OTLP_HEADERS", "").split(","):
        if "=" in item:
            key, _, value = item.partition("=")
            pairs.append((key, value))
    out: dict[str, str] = {}
    for key, value in pairs:
        key, value = key.strip(), value.strip()
        if not key:
            continue
        if any(c in key + value for c in "\r\n\0"):
            log.warning("Telemetry: an OTLP header name or value holds CR, LF or NUL; it is not sent")
        elif key.lower() in FORBIDDEN_HEADERS:
            log.warning("Telemetry: the OTLP header %s is set by the exporter and cannot be overridden", key)
        else:
            out[key] = value
    return tuple(out.items())


def resource_spans(spans: list[dict[str, Any]], version: str) -> dict[str, Any]:
    """An OTLP/JSON ExportTraceServiceRequest holding `spans`."""
    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    return {"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", SERVICE_NAME), attr("service.version", version)]},
        "scopeSpans": [{"scope": {"name": SERVICE_NAME, "version": version}, "spans": spans}],
    }]}


def encode_json(spans: list[dict[str, Any]], version: str) -> bytes:
    return json.dumps(resource_spans(spans, version), ensure_ascii=False).encode()


def encode_protobuf(spans: list[dict[str, Any]], version: str) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

    def any_value(value: dict[str, Any]) -> AnyValue:
        if "stringValue" in value:
            return AnyValue(string_value=value["stringValue"])
        if "boolValue" in value:
            return AnyValue(bool_value=value["boolValue"])
        if "intValue" in value:
            return AnyValue(int_value=int(value["intValue"]))
        return AnyValue(double_value=float(value["doubleValue"]))

    def kv(attrs: list[dict[str, Any]]) -> list[KeyValue]:
        return [KeyValue(key=a["key"], value=any_value(a["value"])) for a in attrs]

    pb_spans = []
    for s in spans:
        span = Span(trace_id=bytes.fromhex(s["traceId"]), span_id=bytes.fromhex(s["spanId"]), name=s["name"],
                    kind=s["kind"], start_time_unix_nano=int(s["startTimeUnixNano"]),
                    end_time_unix_nano=int(s["endTimeUnixNano"]), attributes=kv(s["attributes"]),
                    status=Status(code=s["status"]["code"], message=s["status"].get("message", "")))
        if "parentSpanId" in s:
            span.parent_span_id = bytes.fromhex(s["parentSpanId"])
        pb_spans.append(span)
    resource = Resource(attributes=kv(resource_spans([], version)["resourceSpans"][0]["resource"]["attributes"]))
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(scope=InstrumentationScope(name=SERVICE_NAME, version=version),
                                                   spans=pb_spans)])])
    return request.SerializeToString()


class SpanExporter:
    """The queue and its one sender thread (started with the first span)."""

    def __init__(self, settings: Callable[[], dict[str, Any]], version: str) -> None:
        self.settings = settings  # the live `telemetry` settings (batch size, timeout, retries, capacity)
        self.version = version
        self._queue: deque[_Queued] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._flushing = False
        self._sending = False
        self._unreachable = False
        self._last_endpoint = ""
        self.dropped = 0
        self._client: Any = None

    # ----- the request side -------------------------------------------------------------------------
    def push(self, span: dict[str, Any], dest: Destination) -> None:
        with self._cond:
            if self._stopping:
                return
            if dest.endpoint != self._last_endpoint:
                self._last_endpoint, self._unreachable = dest.endpoint, False
            capacity = max(1, int(self.settings()["max_queue_capacity"]))
            while len(self._queue) >= capacity:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped % 100 == 1:
                    log.warning("Telemetry queue full (capacity %d): dropped the oldest span (%d dropped so far)",
                                capacity, self.dropped)
            self._queue.append(_Queued(span, dest))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="telemetry-export", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Send every queued span now; True when the queue emptied within `timeout_s` (a batch the
        receiver refused counts as sent: it is not kept)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if not self._queue and not self._sending:
                return True
            self._flushing = True
            self._cond.notify_all()
            while self._queue or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._flushing = False
                    return False
                self._cond.wait(left)
            self._flushing = False
            return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (each batch tried once), then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    # ----- the sender thread ------------------------------------------------------------------------
    def _next_batch(self) -> tuple[Destination, list[dict[str, Any]]] | None:
        """Waits until a batch is due (under the lock); None when stopping with nothing left."""
        while True:
            if not self._queue:
                if self._stopping:
                    return None
                self._cond.notify_all()  # a flush waiting on an empty queue
                self._cond.wait()
                continue
            settings = self.settings()
            size = max(1, int(settings["otlp"]["send_batch_size"]))
            oldest = self._queue[0]
            due = [q for q in self._queue if q.dest == oldest.dest]
            waited = time.monotonic() - oldest.arrived
            timeout = float(settings["otlp"]["batch_timeout_s"])
            if self._stopping or self._flushing or len(due) >= size or waited >= timeout:
                batch = due[:size] if not self._stopping else due
                taken = {id(q) for q in batch}
                self._queue = deque(q for q in self._queue if id(q) not in taken)
                return oldest.dest, [q.span for q in batch]
            self._cond.wait(timeout - waited)

    def _run(self) -> None:
        import httpx

        self._client = httpx.Client(timeout=SEND_TIMEOUT_S)
        try:
            while True:
                with self._cond:
                    batch = self._next_batch()
                    if batch is None:
                        return
                    self._sending = True
                try:
                    self._deliver(*batch)
                except Exception:  # the thread must survive anything one batch does
                    log.exception("Telemetry: exporting a batch failed")
                finally:
                    with self._cond:
                        self._sending = False
                        self._cond.notify_all()
        finally:
            self._client.close()

    def _deliver(self, dest: Destination, spans: list[dict[str, Any]]) -> None:
        if dest.protocol == "http/json":
            body, content_type = encode_json(spans, self.version), "application/json"
        else:
            body, content_type = encode_protobuf(spans, self.version), "application/x-protobuf"
        headers = {**dict(dest.headers), "Content-Type": content_type}
        max_retries = int(self.settings()["otlp"].get("max_retries", 0))
        with self._cond:
            bypass = self._unreachable
        attempt = 0
        while True:
            retryable, detail = True, ""
            try:
                resp = self._client.post(dest.endpoint, content=body, headers=headers)
                if 200 <= resp.status_code < 300:
                    with self._cond:
                        self._unreachable = False
                    log.debug("Telemetry: sent %d span(s) to %s", len(spans), dest.endpoint)
                    return
                detail = f"HTTP {resp.status_code}: {resp.text[:200]}"
                retryable = not (400 <= resp.status_code < 500 and resp.status_code != 429)
            except Exception as exc:  # connection refused, DNS, timeout: all retryable
                detail = f"{type(exc).__name__}: {exc}"
            log.error("Telemetry: could not send %d span(s) to %s (%s); is the receiver up?", len(spans),
                      dest.endpoint, detail)
            if not retryable:
                log.warning("Telemetry: the receiver refused the batch; it is dropped (not retried)")
                return
            with self._cond:
                stopping_or_flushing = self._stopping or self._flushing
            if bypass or attempt >= max_retries or stopping_or_flushing:
                with self._cond:
                    self._unreachable = True
                log.warning("Telemetry: batch of %d span(s) dropped%s", len(spans),
                            f" after {max_retries} retries" if max_retries else " (retries are off)")
                return
            attempt += 1
            base = float(self.settings()["otlp"].get("retry_backoff_base_s", 5.0))
            delay = min(base * (1 << min(attempt - 1, 10)), MAX_BACKOFF_S) * random.uniform(0.5, 1.5)
            log.debug("Telemetry: retry %d of %d in %.1f s", attempt, max_retries, delay)
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._flushing, delay)
                if self._stopping or self._flushing:
                    return
