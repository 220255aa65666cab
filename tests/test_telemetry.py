"""Issue 16, telemetry: OpenTelemetry traces of requests, exported over OTLP/HTTP (protobuf).

The receiver is real: an HTTP server on loopback that decodes each `ExportTraceServiceRequest`
with `opentelemetry-proto` (the collector's own message types) and keeps the spans. The server
serves the real Gemma 3 270M; the requests come from the official openai client.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.conftest import GEMMA_NAME

CHAT = [{"role": "user", "content": "Name three colors."}]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def take(self) -> list[dict[str, Any]]:
        with self.lock:
            spans, self.spans = self.spans, []
            return spans


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ok = self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
        if ok:
            request = ExportTraceServiceRequest.FromString(body)
            with self.server.lock:
                self.server.requests += 1
                for resource in request.resource_spans:
                    service = {a.key: _value(a.value) for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            self.server.spans.append({
                                "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(), "service": service.get("service.name"),
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "error": span.status.code == Status.STATUS_CODE_ERROR,
                                "status_message": span.status.message})
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver():
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def server(module_servers, gemma_dir, receiver):
    # A long batch timeout: spans leave only when a flush sends them (or a batch fills up).
    config = {"telemetry": {"enabled": True, "otlp": {"endpoint": receiver.endpoint, "batch_timeout_s": 120}}}
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)}, config=config)


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def flushed(http, receiver) -> list[dict[str, Any]]:
    resp = http.post("/internal/telemetry/flush")
    assert resp.status_code == 200 and resp.json() == {"status": "flushed"}
    return receiver.take()


def test_health_says_what_is_captured(http):
    assert http.get("/v1/health").json()["telemetry"] == {"enabled": True, "captures": ["inputs", "outputs",
                                                                                         "thinking"]}


def test_request_spans_arrive_on_flush(http, oai, receiver):
    done = oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=6)
    chunks = list(oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=6, stream=True))
    assert done.choices and len(chunks) >= 2
    assert receiver.take() == []  # batched: nothing has left yet (the batch timeout is 2 minutes)
    spans = [s for s in flushed(http, receiver) if s["service"] == "lemonade"]
    roots = [s for s in spans if s["name"] == "POST /v1/chat/completions"]
    assert len(roots) == 2 and all(r["parent"] == "" and r["attributes"]["http.response.status_code"] == 200
                                   for r in roots)
    first, second = sorted(roots, key=lambda r: [s["name"] for s in spans].index(r["name"]))
    by_trace = {r["trace"]: [s for s in spans if s["trace"] == r["trace"] and s is not r] for r in roots}
    for root in roots:
        children = by_trace[root["trace"]]
        assert all(c["parent"] == root["id"] for c in children)
        names = {c["name"] for c in children}
        assert {"lemonade.route", "lemonade.engine"} <= names
        route = next(c for c in children if c["name"] == "lemonade.route")
        assert route["attributes"]["lemonade.model.requested"] == GEMMA_NAME
        assert route["attributes"]["lemonade.recipe"] == "llamacpp"
        engine = next(c for c in children if c["name"] == "lemonade.engine")
        attrs = engine["attributes"]
        assert attrs["gen_ai.request.model"] == GEMMA_NAME and attrs["llm.model_name"] == GEMMA_NAME
        assert attrs["gen_ai.system"] == "llamacpp" and attrs["openinference.span.kind"] == "LLM"
        assert "Name three colors." in attrs["input.value"] and "Name three colors." in attrs["gen_ai.input.messages"]
    # The first request loaded Gemma: a load span. The second one was streamed: a stream span with
    # the chunks relayed and the tokens counted.
    loads = [s for s in spans if s["name"] == "lemonade.load"]
    assert len(loads) == 1 and loads[0]["attributes"]["lemonade.model"] == GEMMA_NAME
    plain = next(s for s in spans if s["name"] == "lemonade.engine" and "output.value" in s["attributes"])
    assert plain["attributes"]["output.value"] == done.choices[0].message.content
    assert 0 < plain["attributes"]["gen_ai.usage.output_tokens"] <= 6
    assert plain["attributes"]["llm.token_count.total"] == plain["attributes"]["llm.token_count.prompt"] + \
        plain["attributes"]["llm.token_count.completion"]
    stream = next(s for s in spans if s["name"] == "lemonade.stream")
    assert stream["attributes"]["lemonade.stream.chunks"] >= 2
    assert 0 < stream["attributes"]["gen_ai.usage.output_tokens"] <= 6


def test_failures_are_error_spans(http, receiver):
    resp = http.post("/v1/chat/completions", json={"model": "no-such-model", "messages": CHAT})
    assert resp.status_code == 404
    spans = flushed(http, receiver)
    route = next(s for s in spans if s["name"] == "lemonade.route")
    assert route["error"] and "no-such-model" in route["status_message"]
    root = next(s for s in spans if s["name"] == "POST /v1/chat/completions")
    assert root["attributes"]["http.response.status_code"] == 404


def test_hidden_inputs_and_turning_off(http, oai, receiver):
    assert http.post("/internal/set", json={"telemetry": {"hide_inputs": True}}).status_code == 200
    assert http.get("/v1/health").json()["telemetry"] == {"enabled": True, "captures": ["outputs", "thinking"]}
    oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=2)
    engine = next(s for s in flushed(http, receiver) if s["name"] == "lemonade.engine")
    assert "input.value" not in engine["attributes"] and "gen_ai.input.messages" not in engine["attributes"]
    assert json.loads(engine["attributes"]["gen_ai.output.messages"])[0]["role"] == "assistant"
    assert http.post("/internal/set", json={"telemetry": {"enabled": False}}).status_code == 200
    assert http.get("/v1/health").json()["telemetry"] == {"enabled": False}
    assert http.post("/v1/chat/completions", json={"model": "no-such-model", "messages": CHAT}).status_code == 404
    assert flushed(http, receiver) == []  # off: that request left no span
