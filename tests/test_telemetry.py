"""Issues 16 and 31, telemetry: each inference request is one span, in Lemonade's shape, exported over
OTLP/HTTP as protobuf or JSON.

The receiver is real: an HTTP server on loopback that decodes each `ExportTraceServiceRequest` with
`opentelemetry-proto` (the collector's own message types), or as OTLP/JSON, and keeps the spans and
the headers they came with. It can refuse (any status), or hold a batch until told to answer, which
is how the exporter's retries, drops and batching are observed without timing anything.

Served requests go to the real Gemma 3 270M through the official openai client. Requests for a model
that does not exist are error spans and need no engine: most of the rules (sessions, trace context,
privacy, the exporter) are checked with those.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from lemonade.observability.spans import InferenceSpan, RequestOrigin, parse_traceparent
from tests.helpers import GEMMA_NAME, Server, ServerFactory

CHAT = [{"role": "user", "content": "Name three colors."}]
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
WAIT = 30.0  # upper bound for a span that is due (a busy machine); never a timing that is asserted


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _json_value(v: dict[str, Any]) -> Any:
    return next(iter(v.values())) if v else None


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf or JSON."""

    daemon_threads = True

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []  # {"headers", "content_type", "spans", "service"}
        self.cond = threading.Condition()
        self.refuse: list[int] = []  # statuses to answer, one per request, before accepting again
        self.hold: threading.Event | None = None  # while set to an unset Event: requests wait here
        self.holding = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def spans(self) -> list[dict[str, Any]]:
        with self.cond:
            return [s for b in self.batches if b["status"] == 200 for s in b["spans"]]

    def wait_spans(self, count: int, timeout: float = WAIT) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.spans()) < count and time.monotonic() < deadline:
                self.cond.wait(0.1)
            return self.spans()

    def reset(self) -> None:
        with self.cond:
            self.batches, self.refuse, self.hold = [], [], None
            self.holding.clear()


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        content_type = self.headers["Content-Type"]
        if content_type == "application/x-protobuf":
            request = ExportTraceServiceRequest.FromString(body)
            spans, service = [], None
            for resource in request.resource_spans:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name")
                spans += [{"name": s.name, "kind": s.kind, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                           "parent": s.parent_span_id.hex(),
                           "attributes": {a.key: _value(a.value) for a in s.attributes},
                           "error": s.status.code == 2, "status_message": s.status.message}
                          for scope in resource.scope_spans for s in scope.spans]
        else:
            request = json.loads(body)
            spans, service = [], None
            for resource in request["resourceSpans"]:
                service = {a["key"]: _json_value(a["value"]) for a in resource["resource"]["attributes"]}[
                    "service.name"]
                spans += [{"name": s["name"], "kind": s["kind"], "trace": s["traceId"], "id": s["spanId"],
                           "parent": s.get("parentSpanId", ""),
                           "attributes": {a["key"]: _json_value(a["value"]) for a in s["attributes"]},
                           "error": s["status"]["code"] == 2, "status_message": s["status"].get("message", "")}
                          for scope in resource["scopeSpans"] for s in scope["spans"]]
        hold = self.server.hold
        if hold is not None:
            self.server.holding.set()
            hold.wait(WAIT)
        with self.server.cond:
            status = self.server.refuse.pop(0) if self.server.refuse else 200
            self.server.batches.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                        "content_type": content_type, "spans": spans, "service": service,
                                        "status": status})
            self.server.cond.notify_all()
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(status)
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


def telemetry_config(receiver: Receiver, **otlp: Any) -> dict[str, Any]:
    # One span per batch, right away (send_batch_size 1): each test sees its spans as soon as they end.
    return {"telemetry": {"enabled": True, "otlp": {"endpoint": receiver.endpoint, "send_batch_size": 1, **otlp}}}


@pytest.fixture(scope="module")
def engineless(tmp_path_factory, receiver) -> Server:
    """A server without engines: every inference request is refused (no such model), as an error span."""
    factory = ServerFactory(tmp_path_factory, None)
    yield factory(engines=(), config=telemetry_config(receiver),
                  env={"OTEL_EXPORTER_OTLP_HEADERS": "X-From-Env=env-value, Authorization=Bearer env-token"})
    factory.close()


@pytest.fixture
def fresh(engineless, receiver):
    """Each test starts from the module's settings and an empty receiver."""
    receiver.reset()
    yield engineless
    settings(engineless, **RESET)
    receiver.reset()


RESET = {"max_queue_capacity": 1000, "hide_inputs": False, "hide_outputs": False, "trust_incoming_trace_context": False,
         "session": {"headers": {"id": [], "client": []}},
         "otlp": {"protocol": "http/protobuf", "semantics": ["openinference", "otel_genai"], "headers": {},
                  "max_retries": 0, "retry_backoff_base_s": 5.0, "send_batch_size": 1, "batch_timeout_s": 1.0}}


def settings(server: Server, **telemetry: Any) -> None:
    resp = httpx.post(server.url + "/internal/set", json={"telemetry": telemetry})
    assert resp.status_code == 200, resp.text


def unknown(server: Server, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None,
            **body: Any) -> httpx.Response:
    payload = {"model": "no-such-model", "messages": CHAT, **body}
    if path.endswith("embeddings"):
        payload = {"model": "no-such-model", **body}
    resp = httpx.post(server.url + path, json=payload, headers=headers or {})
    assert resp.status_code == 404
    return resp


def one_span(receiver: Receiver) -> dict[str, Any]:
    spans = receiver.wait_spans(1)
    assert len(spans) == 1, spans
    receiver.reset()
    return spans[0]


# ----- requests that fail before any engine (no engine needed) -----------------------------------

def test_a_refused_request_is_one_error_span(fresh, receiver):
    httpx.get(fresh.url + "/v1/models")  # not inference: no span
    unknown(fresh, user="alice")
    span = one_span(receiver)
    assert span["name"] == "chat.completions" and span["kind"] == 2 and span["error"]
    assert "no-such-model" in span["status_message"] and span["parent"] == ""
    attrs = span["attributes"]
    assert attrs["openinference.span.kind"] == "LLM" and attrs["llm.model_name"] == "no-such-model"
    assert attrs["input.value"] == '[{"content":"Name three colors.","role":"user"}]'  # Lemonade's compact JSON
    assert attrs["llm.input_messages.0.message.role"] == "user"
    assert attrs["gen_ai.request.model"] == "no-such-model" and attrs["gen_ai.input.messages.0.content"] == CHAT[0][
        "content"]
    assert attrs["user.id"] == "alice" and "output.value" not in attrs
    unknown(fresh, "/api/v1/embeddings", input="some text")
    span = one_span(receiver)
    assert span["name"] == "embeddings" and span["error"]
    assert span["attributes"]["openinference.span.kind"] == "EMBEDDING"
    assert span["attributes"]["embedding.model_name"] == "no-such-model"
    assert span["attributes"]["input.value"] == "some text"
    bad = httpx.post(fresh.url + "/v1/chat/completions", json={"model": "x", "messages": "not a list"})
    assert bad.status_code in (400, 422)
    assert one_span(receiver)["error"]  # a refused body is a failed request too


def test_sessions_from_body_then_headers(fresh, receiver):
    cases = [  # (body fields, headers, expected session.id or None)
        ({"session_id": "from-body"}, {"x-session-id": "from-header", "x-client-id": "ide"}, "from-body"),
        ({}, {"x-session-id": "s-1"}, "s-1"),
        ({}, {"Mcp-Session-Id": "mcp-7"}, "mcp-7"),
        ({}, {"X-OpenCode-Session": "s-2", "X-OpenCode-Client": "cli"}, "cli/s-2"),  # namespaced by the client
        ({}, {"x-session-id": "", "x-client-id": "cli"}, None),  # empty: no session
        ({}, {"x-client-id": "cli"}, None),  # a client alone names no session
    ]
    for body, headers, expected in cases:
        unknown(fresh, headers=headers, **body)
        attrs = one_span(receiver)["attributes"]
        assert attrs.get("session.id") == expected, (body, headers)
        assert attrs.get("gen_ai.conversation.id") == expected
    settings(fresh, session={"headers": {"id": ["x-corp-session"], "client": ["x-corp-client"]}})
    unknown(fresh, headers={"x-corp-session": "c-88", "x-corp-client": "tool", "x-session-id": "ignored"})
    assert one_span(receiver)["attributes"]["session.id"] == "tool/c-88"  # configured headers come first


def test_traceparent_adopted_only_when_trusted(fresh, receiver):
    unknown(fresh, headers={"traceparent": TRACEPARENT})
    span = one_span(receiver)
    assert span["trace"] != TRACE_ID and span["parent"] == ""  # off by default: a fresh root
    settings(fresh, trust_incoming_trace_context=True)
    for protocol in ("http/protobuf", "http/json"):
        settings(fresh, otlp={"protocol": protocol})
        unknown(fresh, headers={"traceparent": TRACEPARENT})
        span = one_span(receiver)
        assert (span["trace"], span["parent"]) == (TRACE_ID, PARENT_ID), protocol
    for bad in ("not-a-valid-header", f"00-{'0' * 32}-{PARENT_ID}-01", f"00-{TRACE_ID}-{'0' * 16}-01",
                f"ff-{TRACE_ID}-{PARENT_ID}-01", f"00-{TRACE_ID}-{PARENT_ID}-01-extra"):
        unknown(fresh, headers={"traceparent": bad})
        span = one_span(receiver)
        assert span["trace"] != TRACE_ID and span["parent"] == "", bad
    unknown(fresh, headers={"traceparent": f"01-{TRACE_ID}-{PARENT_ID}-01-future"})  # later versions may add fields
    assert one_span(receiver)["parent"] == PARENT_ID


def test_traceparent_parser():
    assert parse_traceparent(TRACEPARENT) == (TRACE_ID, PARENT_ID)
    assert parse_traceparent(TRACEPARENT.upper()) == (TRACE_ID, PARENT_ID)
    assert parse_traceparent(f"00-{TRACE_ID[:-1]}g-{PARENT_ID}-01") is None
    assert parse_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-1") is None


def test_json_protocol_and_receiver_headers(fresh, receiver):
    settings(fresh, otlp={"protocol": "http/json", "headers": {
        "X-Team": " blue ", "Content-Type": "text/plain", "Content-Length": "1", "X-Bad": "a\u0000b"}})
    unknown(fresh, headers={"Authorization": "Bearer whoever"})
    assert len(receiver.wait_spans(1)) == 1
    batch = receiver.batches[0]
    assert batch["content_type"] == "application/json" and batch["service"] == "lemonade-server"
    headers = batch["headers"]
    assert headers["x-team"] == "blue" and "x-bad" not in headers  # trimmed; NUL refused
    assert headers["content-type"] == "application/json"  # the exporter's own, never overridden
    assert headers["x-from-env"] == "env-value" and headers["authorization"] == "Bearer env-token"  # OTEL_ env
    assert not [k for k in batch["spans"][0]["attributes"] if k.startswith("lemon.auth_token")]


def test_hidden_inputs(fresh, receiver):
    settings(fresh, hide_inputs=True)
    unknown(fresh)
    attrs = one_span(receiver)["attributes"]
    assert attrs["input.value"] == "[REDACTED]" and attrs["llm.input_messages.0.message.content"] == "[REDACTED]"
    assert attrs["gen_ai.input.messages.0.content"] == "[REDACTED]" and attrs["llm.model_name"] == "no-such-model"


def test_semantics_select_the_attributes(fresh, receiver):
    settings(fresh, otlp={"semantics": ["otel_genai"]})
    unknown(fresh)
    attrs = one_span(receiver)["attributes"]
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "lemonade"
    assert not [k for k in attrs if k.startswith(("llm.", "openinference.", "input."))]
    settings(fresh, otlp={"semantics": ["openinference"]})
    unknown(fresh)
    assert not [k for k in one_span(receiver)["attributes"] if k.startswith("gen_ai.")]


def test_retries_and_refusals(fresh, receiver):
    """A 503 is tried again (max_retries); a 400 is not: that batch is dropped, the next one goes."""
    settings(fresh, otlp={"max_retries": 2, "retry_backoff_base_s": 0.01})
    receiver.refuse = [503, 503]
    unknown(fresh, user="retried")
    spans = receiver.wait_spans(1)
    assert [b["status"] for b in receiver.batches] == [503, 503, 200]
    assert spans[0]["attributes"]["user.id"] == "retried"
    receiver.reset()
    receiver.refuse = [400]
    unknown(fresh, user="refused")
    unknown(fresh, user="next")
    spans = receiver.wait_spans(1)
    assert [b["status"] for b in receiver.batches] == [400, 200]  # no retry of a client error
    assert spans[0]["attributes"]["user.id"] == "next"


def test_a_full_queue_drops_its_oldest_spans(fresh, receiver):
    """While one batch is with the receiver, the queue holds at most max_queue_capacity spans: the
    oldest waiting ones make room for newer ones."""
    settings(fresh, max_queue_capacity=2)
    receiver.hold = threading.Event()
    unknown(fresh, user="u0")
    assert receiver.holding.wait(WAIT)  # u0's batch is being received
    for i in range(1, 5):
        unknown(fresh, user=f"u{i}")
    receiver.hold.set()
    spans = receiver.wait_spans(3)
    assert [s["attributes"]["user.id"] for s in spans] == ["u0", "u3", "u4"]


def test_batches_by_size_and_on_flush(fresh, receiver):
    settings(fresh, otlp={"send_batch_size": 3, "batch_timeout_s": 3600})
    unknown(fresh, user="a")
    unknown(fresh, user="b")
    unknown(fresh, user="c")
    receiver.wait_spans(3)
    assert [len(b["spans"]) for b in receiver.batches] == [3]  # one request for the three
    receiver.reset()
    unknown(fresh, user="d")
    assert receiver.batches == []  # waits for its batch (an hour, here)
    flushed = httpx.post(fresh.url + "/internal/telemetry/flush")
    assert flushed.status_code == 200 and flushed.json() == {"status": "flushed"}
    assert [s["attributes"]["user.id"] for s in receiver.spans()] == ["d"]  # sent before the flush answered


def test_settings_are_checked(fresh):
    for body, field in [({"enabled": "yes"}, "enabled"), ({"otlp": {"protocol": "http/xml"}}, "protocol"),
                        ({"otlp": {"max_retries": -1}}, "max_retries"), ({"otlp": {"max_retries": "3"}}, "max_retries"),
                        ({"otlp": {"retry_backoff_base_s": -1}}, "retry_backoff_base_s"),
                        ({"otlp": {"semantics": ["openinference", "custom"]}}, "semantics"),
                        ({"otlp": {"headers": "Bearer x"}}, "headers"), ({"unknown_field": True}, "unknown_field"),
                        ({"otlp": {"unknown_otlp_field": 1}}, "unknown_otlp_field"),
                        ({"session": {"headers": {"id": "x-session"}}}, "session.headers.id"),
                        ({"max_attribute_length": 0}, "max_attribute_length")]:
        resp = httpx.post(fresh.url + "/internal/set", json={"telemetry": body})
        assert resp.status_code == 400 and field in resp.json()["error"]["message"], (body, resp.text)


def test_a_span_is_queued_before_its_answer_reaches_the_client(tmp_path):
    """The request guard finishes a request's span as the last byte of its answer leaves, not after:
    a client holding its answer may flush the exporter at once and find the span sent. (Finished
    afterwards, the span of a fast answer could miss a flush asked right away, and a test holding
    the receiver released it before the last span was queued.) The guard and the tracer are the
    server's own; the app inside the guard is a two-chunk answer, so the order is seen in-process."""
    import asyncio

    from lemonade.api.guard import RequestGuard
    from lemonade.api.middleware import BodySizeLimit
    from lemonade.api.origins import OriginPolicy
    from lemonade.config import Config
    from lemonade.observability.telemetry import Telemetry

    config = Config(tmp_path, environ={})
    telemetry = Telemetry(config)
    finished: list[dict[str, Any]] = []
    telemetry.listen(finished.append)

    async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"object": ', "more_body": True})
        await send({"type": "http.response.body", "body": b'"list"}'})

    guard = RequestGuard(answer, policy=OriginPolicy(None), api_key=None, admin_key=None,
                         body_limit=BodySizeLimit(config), observe=lambda *_: None, telemetry=telemetry)
    spans_when_sent: list[int] = []

    async def client_receives(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            spans_when_sent.append(len(finished))

    async def request() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"model": "m", "input": "x"}', "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": [
        (b"host", b"localhost:13305"), (b"content-type", b"application/json")], "query_string": b""}
    asyncio.run(guard(scope, request, client_receives))
    assert spans_when_sent == [0, 1]  # queued between the first chunk and the last
    assert finished[0]["name"] == "embeddings"


# ----- what a span records of an answer (the code path alone) ------------------------------------

def _finished(kind: str, name: str, body: dict[str, Any], answer: dict[str, Any], **settings: Any) -> dict[str, Any]:
    span = InferenceSpan(kind, name, RequestOrigin(), {"otlp": {"semantics": ["openinference", "otel_genai"]},
                                                       **settings})
    span.body = body
    span.answer(answer)
    data = span.export()
    return {a["key"]: next(iter(a["value"].values())) for a in data["attributes"]}


def test_embedding_rerank_and_tool_call_answers():
    embed = _finished("EMBEDDING", "embeddings", {"model": "e", "input": ["a", "b"]},
                      {"data": [{"embedding": [0.1]}, {"embedding": [0.2]}], "usage": {"prompt_tokens": 4,
                                                                                      "total_tokens": 4}})
    assert embed["output.value"] == "Embeddings data with 2 vectors." and embed["input.value"] == '["a","b"]'
    assert embed["embedding.usage.prompt_tokens"] == embed["llm.token_count.prompt"] == 4
    assert embed["embedding.usage.total_tokens"] == embed["llm.token_count.total"] == 4
    rerank = _finished("RERANKER", "reranking", {"model": "r", "query": "q", "documents": ["x"]},
                       {"results": [{"index": 0, "relevance_score": 0.5}], "usage": {"prompt_tokens": 3}})
    assert rerank["reranker.model_name"] == "r" and rerank["reranker.usage.prompt_tokens"] == 3
    assert json.loads(rerank["output.value"])["results"][0]["index"] == 0
    call = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
    llm = _finished("LLM", "chat.completions", {"model": "m", "messages": CHAT}, call)
    assert llm["llm.output_messages.0.message.tool_calls.0.tool_call.function.name"] == "get_weather"
    assert json.loads(llm["output.value"])[0]["function"]["arguments"] == '{"city":"Paris"}'
    assert llm["llm.token_count.total"] == 14
    thought = {"choices": [{"message": {"content": "Hi.", "reasoning_content": "Greet."}}]}
    assert _finished("LLM", "chat.completions", {"model": "m", "messages": CHAT}, thought)["output.value"] == \
        "<think>\nGreet.\n</think>\nHi."
    hidden = _finished("LLM", "chat.completions", {"model": "m", "messages": CHAT}, thought, hide_thinking=True)
    assert hidden["output.value"] == "Hi."
    assert _finished("LLM", "chat.completions", {"model": "m", "messages": CHAT}, thought,
                     hide_outputs=True)["output.value"] == "[REDACTED]"


def _streamed(name: str, events: list[dict[str, Any]], cut: int = 7) -> dict[str, Any]:
    """The span of a relayed SSE stream, fed in pieces cut across its lines (as chunks arrive)."""
    span = InferenceSpan("LLM", name, RequestOrigin(), {"otlp": {"semantics": ["openinference"]}})
    span.body = {"model": "m", "messages": CHAT}
    raw = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
    reader = span.stream_reader()
    for i in range(0, len(raw), cut):
        reader.feed(raw[i:i + cut])
    data = span.export()
    return {a["key"]: next(iter(a["value"].values())) for a in data["attributes"]}


def test_stream_reading():
    chat = _streamed("chat.completions", [
        {"choices": [{"delta": {"reasoning_content": "Think."}}]},
        {"choices": [{"delta": {"content": "Hel"}}]}, {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}])
    assert chat["output.value"] == "<think>\nThink.\n</think>\nHello" and chat["llm.usage.completion_tokens"] == 3
    assert chat["llm.performance.time_to_first_token"] > 0 and chat["llm.token_count.total"] == 8
    def call(**piece: Any) -> dict[str, Any]:
        return {"choices": [{"delta": {"tool_calls": [{"index": 0, **piece}]}}]}

    tools = _streamed("chat.completions", [call(id="c1", function={"name": "f", "arguments": ""}),
                                           call(function={"arguments": '{"a":'}), call(function={"arguments": "1}"})])
    assert tools["llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments"] == '{"a":1}'
    assert tools["llm.usage.completion_tokens"] == 3  # no usage reported: the pieces counted
    responses = _streamed("responses", [
        {"type": "response.created", "response": {}}, {"type": "response.output_text.delta", "delta": "Hi"},
        {"type": "response.output_text.delta", "delta": " there"},
        {"type": "response.completed", "response": {"usage": {"input_tokens": 4, "output_tokens": 2}}}])
    assert responses["output.value"] == "Hi there" and responses["llm.usage.prompt_tokens"] == 4
    failed = InferenceSpan("LLM", "chat.completions", RequestOrigin(), {"otlp": {"semantics": []}})
    failed.stream_reader().feed(b'event: error\ndata: {"error": {"message": "engine gone"}}\n\n')
    assert failed.export()["status"] == {"code": 2, "message": "engine gone"}


# ----- served requests (the real engine) ------------------------------------------------------------

@pytest.fixture(scope="module")
def served(module_servers, gemma_dir, receiver) -> Server:
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)}, config=telemetry_config(receiver))


def test_served_requests(served, receiver):
    receiver.reset()
    oai = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    done = oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=6, temperature=0)
    plain = one_span(receiver)
    chunks = list(oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=6, temperature=0,
                                              stream=True))
    streamed = one_span(receiver)
    text = oai.completions.create(model=GEMMA_NAME, prompt="Once upon a time", max_tokens=4)
    completion = one_span(receiver)

    assert plain["name"] == streamed["name"] == "chat.completions" and completion["name"] == "completions"
    for span in (plain, streamed, completion):
        attrs = span["attributes"]
        assert not span["error"] and attrs["llm.model_name"] == GEMMA_NAME and attrs["llm.recipe"] == "llamacpp"
        assert attrs["llm.performance.time_to_first_token"] > 0 and attrs["llm.performance.tokens_per_second"] > 0
        assert attrs["llm.token_count.completion"] == attrs["llm.usage.completion_tokens"] > 0
        assert attrs["gen_ai.usage.output_tokens"] == attrs["llm.usage.completion_tokens"]
    attrs = plain["attributes"]
    assert attrs["output.value"] == done.choices[0].message.content
    assert attrs["llm.usage.prompt_tokens"] == done.usage.prompt_tokens
    assert attrs["llm.usage.completion_tokens"] == done.usage.completion_tokens
    assert attrs["llm.token_count.total"] == done.usage.prompt_tokens + done.usage.completion_tokens
    assert attrs["gen_ai.output.messages.0.content"] == done.choices[0].message.content
    assert streamed["attributes"]["output.value"] == "".join(c.choices[0].delta.content or "" for c in chunks
                                                             if c.choices)
    assert completion["attributes"]["output.value"] == text.choices[0].text
    assert completion["attributes"]["input.value"] == "Once upon a time"
