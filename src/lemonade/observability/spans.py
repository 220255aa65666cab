"""One inference request as one span, in Lemonade's shape (guide-configuration-README.md, telemetry).

A chat completion, completion, response, embedding, rerank or classification is one `SERVER` span
named for what was asked (`chat.completions`, `completions`, `responses`, `embeddings`,
`reranking`, `classify`), started when the request arrives and ended when its answer (or stream)
is done; a refusal (unknown model, bad body, an engine's error) ends it with `ERROR` status and
the message the client got. Nothing else of a request becomes a span: these are what collectors
such as Phoenix show as LLM calls.

Its attributes follow the configured semantics: OpenInference (`openinference.span.kind`,
`llm.model_name`, `input.value`/`output.value`, `llm.input_messages.N.message.*`,
`llm.token_count.*` and the `<prefix>.usage.*` keys, `user.id`, `session.id`) and/or OpenTelemetry
GenAI (`gen_ai.*`). `hide_inputs`/`hide_outputs` replace captured text with `[REDACTED]`;
`hide_thinking` strips reasoning tags from the output (otherwise their variants become `<think>`).

Lemonade's own attributes: `lemon.queue_time_ms`, and for an answer of a speculating llama-server
`lemon.speculation.type` (its --spec-type), `.draft_tokens`, `.accepted_tokens`, `.acceptance_rate`
(its `timings`) and `.speedup` (measured, runtime/speculation.py).

Who asked is kept too: `lemon.auth_token_hash` (a salted hash of the request's bearer token, used
only to route the span to the right `/spans/stream` listener, never exported or streamed) and
`lemon.client_session_id` (the `X-Client-Session-Id` header). A session id comes from the body's
`session_id`, else from session headers (configured ones, then well-known ones such as
`x-session-id`), prefixed `<client>/` when a client header names the caller. A caller's W3C
`traceparent` is adopted only when `telemetry.trust_incoming_trace_context` is on.

The span is the OTLP/JSON span object itself (`traceId`, `spanId`, `attributes` as key/value
pairs): the exporter encodes it as JSON or protobuf, and `/spans/stream` sends it as it is.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from lemonade.util import jsonparse

REDACTED = "[REDACTED]"
TRUNCATED = "... [TRUNCATED]"
SPAN_KIND_SERVER = 2
STATUS_OK, STATUS_ERROR = 1, 2
_SALT = secrets.token_hex(16)  # per process: a token's hash correlates spans of one run, nothing more

# A span's kind (route_table.py names each traced route's) -> the prefix of its usage attributes.
USAGE_PREFIX = {"LLM": "llm", "EMBEDDING": "embedding", "RERANKER": "reranker", "CLASSIFIER": "classifier"}

# Session and client headers clients already send (OpenCode, MCP, generic ones), after configured ones.
WELL_KNOWN_SESSION_HEADERS = ("x-opencode-session", "x-session-id", "x-client-session-id", "mcp-session-id",
                              "x-conversation-id", "session-id")
WELL_KNOWN_CLIENT_HEADERS = ("x-opencode-client", "x-client-id", "x-client-name")

THINK_PAIRS = (("<|think|>", "</|think|>"), ("<|think|>", "<turn|>"), ("<|think|>", "<|turn>"),
               ("<think>", "</think>"), ("<thought>", "</thought>"))
_THINK_OPEN = re.compile(r"<\|think\|>|<thought>")
_THINK_CLOSE = re.compile(r"</\|think\|>|</think\|>|</thought>")


def hash_token(token: str) -> str:
    return hashlib.sha256((_SALT + token).encode()).hexdigest() if token else ""


def parse_traceparent(header: str) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid W3C `traceparent`, else None.

    Version 00 has exactly four fields; a later version may append fields, which are ignored.
    Version `ff`, all-zero ids, wrong lengths and non-hex digits are invalid."""
    if not 55 <= len(header) <= 128:
        return None
    parts = header.strip().lower().split("-")
    if len(parts) < 4:
        return None
    version, trace_id, parent_id, flags = parts[:4]

    def hex_of(s: str, n: int) -> bool:
        return len(s) == n and all(c in "0123456789abcdef" for c in s)

    if not hex_of(version, 2) or version == "ff" or (version == "00" and len(parts) != 4):
        return None
    if not hex_of(trace_id, 32) or not hex_of(parent_id, 16) or not hex_of(flags, 2):
        return None
    if set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        return None
    return trace_id, parent_id


def truncated(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marked as cut."""
    if len(text) <= limit:
        return text
    return text[:limit] if limit <= len(TRUNCATED) else text[:limit - len(TRUNCATED)] + TRUNCATED


def compact_json(value: Any) -> str:
    """JSON as Lemonade writes it in spans: keys sorted, no spaces, text as it is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def strip_thinking(text: str) -> str:
    for start, end in THINK_PAIRS:
        while (i := text.find(start)) != -1:
            j = text.find(end, i + len(start))
            if j == -1:
                text = text[:i]
                break
            keep_end = end in ("<turn|>", "<|turn>")  # a turn marker ends the thought, and stays
            text = text[:i] + text[j if keep_end else j + len(end):]
    return text.strip()


def standardize_thinking(text: str) -> str:
    return _THINK_CLOSE.sub("</think>", _THINK_OPEN.sub("<think>", text))


@dataclass
class RequestOrigin:
    """Who sent a request, read from its headers once (`request_origin`)."""

    auth_token: str = ""
    client_session_id: str = ""
    session_id: str = ""  # from session headers, `<client>/<session>` when a client header names the caller
    trace: tuple[str, str] | None = None  # adopted (trace id, parent span id)


def request_origin(headers: dict[str, str], settings: dict[str, Any]) -> RequestOrigin:
    """`headers`: lower-case names to values (first occurrence)."""
    auth = headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    trace = None
    if settings.get("trust_incoming_trace_context") and "traceparent" in headers:
        trace = parse_traceparent(headers["traceparent"])
    configured = settings.get("session", {}).get("headers", {})

    def first(names: list[str] | tuple[str, ...]) -> str:
        for name in names:
            value = headers.get(name.strip().lower(), "").strip() if name.strip() else ""
            if value:
                return value
        return ""

    session = first(configured.get("id", [])) or first(WELL_KNOWN_SESSION_HEADERS)
    client = (first(configured.get("client", [])) or first(WELL_KNOWN_CLIENT_HEADERS)) if session else ""
    return RequestOrigin(auth_token=token, client_session_id=headers.get("x-client-session-id", ""),
                         session_id=f"{client}/{session}" if client else session, trace=trace)


@dataclass
class InferenceSpan:
    """One inference request's span while it runs; `export()` makes the OTLP span at its end."""

    kind: str
    name: str
    origin: RequestOrigin
    settings: dict[str, Any]
    started_ns: int = field(default_factory=time.time_ns)
    started: float = field(default_factory=time.perf_counter)
    body: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # backend identity, request config, timings
    output: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    _stream: StreamReader | None = None

    # ----- what the request path reports ------------------------------------------------------------
    def engine(self, recipe: str, checkpoint: str, device: str | None, speculation: str | None = None) -> None:
        """The model that serves it was found (and loaded): its identity, and the wait until now.
        `speculation`: the speculative decoding its engine runs (llama.cpp's --spec-type)."""
        prefix = USAGE_PREFIX[self.kind]
        self.extra.update({f"{prefix}.backend": recipe, f"{prefix}.recipe": recipe, f"{prefix}.checkpoint": checkpoint,
                           "lemon.queue_time_ms": int((time.perf_counter() - self.started) * 1000)})
        if device:
            self.extra[f"{prefix}.device_type"] = device
        if speculation:
            self.extra["lemon.speculation.type"] = speculation

    def answer(self, content: bytes | dict[str, Any]) -> None:
        """A non-streamed answer of the engine (its JSON)."""
        if isinstance(content, (bytes, bytearray)):
            try:
                content = jsonparse.loads(content)
            except ValueError:
                return
        if not isinstance(content, dict):
            return
        if isinstance(content.get("error"), dict):
            self.fail(str(content["error"].get("message", "Request failed")))
            return
        self.count_usage(content.get("usage"), content.get("timings"))
        if self.kind == "EMBEDDING":
            data = content.get("data")
            self.output = f"Embeddings data with {len(data)} vectors." if isinstance(data, list) else compact_json(
                content)
        elif self.kind == "RERANKER":
            self.output = compact_json(content)
        elif self.kind == "LLM":
            self._llm_answer(content)

    def stream_reader(self) -> StreamReader:
        """Reads a relayed SSE stream for the span's output, tokens and timings."""
        self._stream = StreamReader(self)
        return self._stream

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = message or "Request failed"

    # ----- reading answers -------------------------------------------------------------------------
    def count_usage(self, usage: Any, timings: Any) -> None:
        """Token counts (and llama-server's timings) of an answer or a stream's event."""
        if isinstance(usage, dict):
            for ours, theirs in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens")):
                value = usage.get(ours, usage.get(theirs))
                if isinstance(value, int):
                    self.usage[ours] = value
            if isinstance(usage.get("total_tokens"), int):
                self.usage["total_tokens"] = usage["total_tokens"]
        if isinstance(timings, dict):
            if isinstance(timings.get("prompt_n"), int):
                self.usage["prompt_tokens"] = timings["prompt_n"]
            if isinstance(timings.get("predicted_n"), int):
                self.usage["completion_tokens"] = timings["predicted_n"]
            prompt_ms, predicted_ms, predicted_n = (timings.get("prompt_ms"), timings.get("predicted_ms"),
                                                    timings.get("predicted_n"))
            if isinstance(prompt_ms, (int, float)) and prompt_ms > 0:
                self.extra["ttft"] = prompt_ms / 1000.0
            if isinstance(predicted_ms, (int, float)) and predicted_ms > 0 and isinstance(predicted_n, int) \
                    and predicted_n > 0:
                self.extra["tps"] = predicted_n / (predicted_ms / 1000.0)
            drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
            if isinstance(drafted, int) and isinstance(accepted, int) and drafted > 0:  # speculative decoding
                self.extra.update({"lemon.speculation.draft_tokens": drafted,
                                   "lemon.speculation.accepted_tokens": accepted,
                                   "lemon.speculation.acceptance_rate": round(accepted / drafted, 4)})

    def _llm_answer(self, content: dict[str, Any]) -> None:
        choices = content.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            message = choice.get("message")
            if isinstance(message, dict):
                said = message.get("content")
                text = said if isinstance(said, str) else ""
                thought = message.get("reasoning_content") or message.get("thinking")
                if isinstance(thought, str) and thought:
                    text = f"<think>\n{thought}\n</think>\n{text}"
                self.output = text
                for call in message.get("tool_calls") or []:
                    if isinstance(call, dict):
                        fn = call.get("function")
                        fn = fn if isinstance(fn, dict) else {}
                        args = fn.get("arguments", "")
                        self.tool_calls.append({"id": str(call.get("id") or ""), "name": str(fn.get("name") or ""),
                                                "arguments": args if isinstance(args, str) else compact_json(args)})
            elif isinstance(choice.get("text"), str):
                self.output = choice["text"]
        elif isinstance(content.get("output"), list):  # a Responses API answer
            texts = [part.get("text", "") for item in content["output"] if isinstance(item, dict)
                     for part in item.get("content") or [] if isinstance(part, dict) and part.get("type") ==
                     "output_text"]
            self.output = "".join(t for t in texts if isinstance(t, str))

    # ----- the exported span -----------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """The finished span as an OTLP/JSON span object (its attributes include the private
        `lemon.auth_token_hash`; `public()` drops it)."""
        if self._stream is not None:
            self._stream.close()
        end_ns = self.started_ns + int((time.perf_counter() - self.started) * 1e9)
        semantics = set(self.settings.get("otlp", {}).get("semantics", ()))
        oi, genai = "openinference" in semantics, "otel_genai" in semantics
        limit = int(self.settings.get("max_attribute_length", 4096))
        attrs: list[tuple[str, Any]] = []
        body = self.body or {}
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        hide_in = bool(self.settings.get("hide_inputs"))
        request_text, messages = self._inputs(body, limit)
        user = truncated(body["user"], limit) if isinstance(body.get("user"), str) else ""
        session = body.get("session_id") if isinstance(body.get("session_id"), str) else self.origin.session_id
        session = truncated(session, limit) if session else ""
        prefix = USAGE_PREFIX[self.kind]
        if oi:
            attrs.append(("openinference.span.kind", self.kind))
            if self.kind in ("LLM", "EMBEDDING", "RERANKER"):
                attrs.append((f"{prefix}.model_name", model))
            attrs.append(("input.value", REDACTED if hide_in else request_text))
            if user:
                attrs.append(("user.id", user))
            if session:
                attrs.append(("session.id", session))
            for i, (role, text) in enumerate(messages):
                attrs += [(f"llm.input_messages.{i}.message.role", role),
                          (f"llm.input_messages.{i}.message.content", REDACTED if hide_in else text)]
        if genai:
            operation = {"EMBEDDING": "embeddings", "RERANKER": "rerank"}.get(
                self.kind, "chat" if self.name in ("chat.completions", "responses") else "completion")
            attrs += [("gen_ai.operation.name", operation), ("gen_ai.request.model", model),
                      ("gen_ai.provider.name", "lemonade"), ("gen_ai.system", "lemonade")]
            if session:
                attrs.append(("gen_ai.conversation.id", session))
            for i, (role, text) in enumerate(messages):
                attrs += [(f"gen_ai.input.messages.{i}.role", role),
                          (f"gen_ai.input.messages.{i}.content", REDACTED if hide_in else text)]
        attrs += [(k, v) for k, v in self.extra.items() if k not in ("ttft", "tps")]
        if self.origin.auth_token:
            attrs.append(("lemon.auth_token_hash", hash_token(self.origin.auth_token)))
        if self.origin.client_session_id:
            attrs.append(("lemon.client_session_id", self.origin.client_session_id))
        if self.error is None:
            attrs += self._result_attributes(oi, genai, limit)
        span: dict[str, Any] = {
            "traceId": self.origin.trace[0] if self.origin.trace else secrets.token_hex(16),
            "spanId": secrets.token_hex(8),
            "name": self.name, "kind": SPAN_KIND_SERVER,
            "startTimeUnixNano": str(self.started_ns), "endTimeUnixNano": str(end_ns),
            "attributes": [{"key": k, "value": any_value(v)} for k, v in attrs if v is not None],
            "status": {"code": STATUS_OK} if self.error is None else {"code": STATUS_ERROR, "message": self.error},
        }
        if self.origin.trace:
            span["parentSpanId"] = self.origin.trace[1]
        return span

    def _inputs(self, body: dict[str, Any], limit: int) -> tuple[str, list[tuple[str, str]]]:
        """What was asked, as text, and (for LLM spans) its messages as (role, content)."""
        messages: list[tuple[str, str]] = []
        if self.kind == "CLASSIFIER":  # screened text (PII, phishing) is never captured, only measured
            text = body.get("text", body.get("input"))
            text = text if isinstance(text, str) else ""
            return f"[classifier input: {len(text.encode())} chars, sha256={hash_token(text)}]", messages
        if self.kind == "LLM" and isinstance(body.get("messages"), list):
            for msg in body["messages"]:
                if isinstance(msg, dict):
                    content = msg.get("content")
                    text = content if isinstance(content, str) else compact_json(content) if "content" in msg else ""
                    messages.append((str(msg.get("role") or ""), truncated(text, limit)))
            return truncated(compact_json(body["messages"]), limit), messages
        if self.kind == "LLM" and isinstance(body.get("prompt"), str):
            messages.append(("user", truncated(body["prompt"], limit)))
            return truncated(body["prompt"], limit), messages
        if self.kind == "LLM" and isinstance(body.get("input"), str):  # the Responses API's plain input
            messages.append(("user", truncated(body["input"], limit)))
            return truncated(body["input"], limit), messages
        if self.kind == "EMBEDDING" and "input" in body:
            value = body["input"]
            return truncated(value if isinstance(value, str) else compact_json(value), limit), messages
        return truncated(compact_json(body), limit), messages

    def _result_attributes(self, oi: bool, genai: bool, limit: int) -> list[tuple[str, Any]]:
        hide_out = bool(self.settings.get("hide_outputs"))
        if hide_out:
            text = REDACTED
        elif self.settings.get("hide_thinking"):
            text = strip_thinking(self.output)
        else:
            text = standardize_thinking(self.output)
        shown = text
        if not shown and self.tool_calls and not hide_out:
            shown = compact_json([{"id": c["id"], "type": "function",
                                   "function": {"name": c["name"], "arguments": c["arguments"]}}
                                  for c in self.tool_calls])
        prompt, completion = self.usage.get("prompt_tokens"), self.usage.get("completion_tokens")
        total = self.usage.get("total_tokens")
        if total is None and prompt is not None and completion is not None:
            total = prompt + completion
        prefix = USAGE_PREFIX[self.kind]
        attrs: list[tuple[str, Any]] = []
        if oi:
            attrs.append(("output.value", truncated(shown, limit)))
            if self.kind == "LLM" and (text or self.tool_calls):
                attrs.append(("llm.output_messages.0.message.role", "assistant"))
                if text:
                    attrs.append(("llm.output_messages.0.message.content", truncated(text, limit)))
                for i, call in enumerate(self.tool_calls if not hide_out else []):
                    key = f"llm.output_messages.0.message.tool_calls.{i}.tool_call."
                    attrs += [(key + "id", call["id"] or None), (key + "function.name", call["name"] or None),
                              (key + "function.arguments", truncated(call["arguments"], limit) or None)]
            for name, value in (("prompt_tokens", prompt), ("completion_tokens", completion),
                                ("total_tokens", total)):
                if value is not None:
                    attrs.append((f"{prefix}.usage.{name}", value))
            for name, value in (("prompt", prompt), ("completion", completion), ("total", total)):
                if value is not None:
                    attrs.append((f"llm.token_count.{name}", value))
            if "ttft" in self.extra:
                attrs.append(("llm.performance.time_to_first_token", float(self.extra["ttft"])))
            if "tps" in self.extra:
                attrs.append(("llm.performance.tokens_per_second", float(self.extra["tps"])))
        if genai:
            if prompt is not None:
                attrs.append(("gen_ai.usage.input_tokens", prompt))
            if completion is not None:
                attrs.append(("gen_ai.usage.output_tokens", completion))
            if self.kind == "LLM" and text:
                attrs += [("gen_ai.output.messages.0.role", "assistant"),
                          ("gen_ai.output.messages.0.content", truncated(text, limit))]
            if "ttft" in self.extra:
                attrs.append(("gen_ai.performance.time_to_first_token", float(self.extra["ttft"])))
            if "tps" in self.extra:
                attrs.append(("gen_ai.usage.tokens_per_second", float(self.extra["tps"])))
        return attrs


class StreamReader:
    """Reads a relayed SSE stream (OpenAI chat or completions chunks) into its span: the text and
    reasoning deltas, tool-call pieces, usage and timings; the time to the first token is measured
    when the engine does not report it. Fed the raw chunks; lines may span chunks."""

    def __init__(self, span: InferenceSpan) -> None:
        self.span = span
        self.rest = b""
        self.text: list[str] = []
        self.thought: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.first_token: float | None = None
        self.tokens = 0
        self.closed = False

    def feed(self, chunk: bytes) -> None:
        *lines, self.rest = (self.rest + chunk).split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            return
        try:
            event = jsonparse.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if isinstance(event.get("error"), dict):
            self.span.fail(str(event["error"].get("message", "Request failed")))
            return
        kind = event.get("type")
        if isinstance(kind, str) and kind.startswith("response."):  # a Responses API stream
            if kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
                self._got(self.text, event["delta"])
            elif kind == "response.completed" and isinstance(event.get("response"), dict):
                self.span.count_usage(event["response"].get("usage"), None)
            return
        self.span.count_usage(event.get("usage"), event.get("timings"))
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        delta = choices[0].get("delta")
        delta = delta if isinstance(delta, dict) else choices[0]
        for key, into in (("content", self.text), ("text", self.text), ("reasoning_content", self.thought)):
            piece = delta.get(key)
            if isinstance(piece, str) and piece:
                self._got(into, piece)
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                slot = self.calls.setdefault(int(call.get("index", 0) or 0), {"id": "", "name": "", "arguments": ""})
                fn = call.get("function")
                fn = fn if isinstance(fn, dict) else {}
                slot["id"] = slot["id"] or str(call.get("id") or "")
                slot["name"] += str(fn.get("name") or "")
                self._got(None, str(fn.get("arguments") or ""), slot)

    def _got(self, into: list[str] | None, piece: str, call: dict[str, str] | None = None) -> None:
        """A generated piece: text (or reasoning) kept in `into`, or a tool call's arguments."""
        if call is not None:
            call["arguments"] += piece
        elif into is not None:
            into.append(piece)
        self.tokens += 1
        if self.first_token is None:
            self.first_token = time.perf_counter()

    def close(self) -> None:
        """The stream ended: the span gets what it carried (best-effort counts where it said none)."""
        if self.closed:
            return
        self.closed = True
        if self.rest:
            self._line(self.rest)
        span = self.span
        text = "".join(self.text)
        thought = "".join(self.thought)
        span.output = f"<think>\n{thought}\n</think>\n{text}" if thought else text
        span.tool_calls = [self.calls[i] for i in sorted(self.calls)]
        if "completion_tokens" not in span.usage and self.tokens:
            span.usage["completion_tokens"] = self.tokens
        if self.first_token is not None:
            span.extra.setdefault("ttft", max(self.first_token - span.started, 1e-6))
            if "tps" not in span.extra and span.usage.get("completion_tokens"):
                elapsed = max(time.perf_counter() - self.first_token, 1e-6)
                span.extra["tps"] = span.usage["completion_tokens"] / elapsed


def any_value(value: Any) -> dict[str, Any]:
    """An OTLP/JSON AnyValue."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": value}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": value if isinstance(value, str) else compact_json(value)}


def public(span: dict[str, Any]) -> dict[str, Any]:
    """The span without the private `lemon.auth_token_hash` (what leaves the server)."""
    return {**span, "attributes": [a for a in span["attributes"] if a["key"] != "lemon.auth_token_hash"]}


def token_hash_of(span: dict[str, Any]) -> str:
    return next((a["value"].get("stringValue", "") for a in span["attributes"] if a["key"] == "lemon.auth_token_hash"),
                "")


def client_session_of(span: dict[str, Any]) -> str:
    return next((a["value"].get("stringValue", "") for a in span["attributes"]
                 if a["key"] == "lemon.client_session_id"), "")
