"""A non-streamed completion built from the engine's stream of chunks.

Why: llama-server (b11312) notices that the client of a non-streamed request left only when its
wait for results times out, and that wait restarts whenever a result of *any* task arrives; with
other requests running, a request whose client hung up goes on generating for minutes. A stream
is written token by token, so closing it stops the engine at its next token. The proxy therefore
asks the engine for a stream and folds the chunks into the object llama-server returns when not
streaming (`Assembly`): same fields, same values, `timings` included (/v1/stats and Ollama's
durations read them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

HEAD = ("id", "object", "created", "model", "system_fingerprint")  # taken from the first chunk
# Taken from the last chunk that carries them. `__verbose` (asked with `verbose: true`) tells which
# stop word ended the answer (the Anthropic layer's `stop_sequence`).
FIGURES = ("usage", "timings", "__verbose")


@dataclass
class _Call:
    """One tool call, put together from its deltas (the id, type and name come once, arguments in pieces)."""

    id: str = ""
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, delta: dict[str, Any]) -> None:
        self.id = delta.get("id") or self.id
        self.type = delta.get("type") or self.type
        fn = delta.get("function") or {}
        self.name += fn.get("name") or ""
        self.arguments.append(fn.get("arguments") or "")

    def result(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": "".join(self.arguments)}}


@dataclass
class _Choice:
    """One choice: chat chunks carry a `delta`, text completion chunks a `text`."""

    chat: bool = False
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    logprobs: list[Any] | None = None  # None: the chunks had no `logprobs` field (chat without logprobs)

    def add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("finish_reason") is not None:
            self.finish_reason = chunk["finish_reason"]
        if "logprobs" in chunk:
            self.logprobs = (self.logprobs or []) + ((chunk["logprobs"] or {}).get("content") or [])
        delta = chunk.get("delta")
        if delta is None:
            self.content.append(chunk.get("text") or "")
            return
        self.chat = True
        self.role = delta.get("role") or self.role
        self.content.append(delta.get("content") or "")
        self.reasoning.append(delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:
            self.calls.setdefault(call.get("index", len(self.calls)), _Call()).add(call)

    def result(self, index: int) -> dict[str, Any]:
        # Text completions always have `logprobs` (null when not asked); chat only when asked.
        logprobs = {"content": self.logprobs} if self.logprobs else None
        if not self.chat:
            return {"index": index, "text": "".join(self.content), "logprobs": logprobs,
                    "finish_reason": self.finish_reason}
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content)}
        if reasoning := "".join(self.reasoning):
            message["reasoning_content"] = reasoning
        if self.calls:
            message["tool_calls"] = [self.calls[i].result() for i in sorted(self.calls)]
        out: dict[str, Any] = {"index": index, "message": message, "finish_reason": self.finish_reason}
        if self.logprobs is not None:
            out["logprobs"] = logprobs
        return out


class Assembly:
    """The SSE lines of one streamed chat or text completion, folded into its non-streamed answer.

    With several choices (`n` > 1, a list of prompts) `usage`, `timings` and `__verbose` are those
    of the last task to finish, where llama-server's non-streamed answer reports the first task's.
    In a stream, `__verbose` has the generated text and tokens empty (they came in the chunks).
    """

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.figures: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.error: dict[str, Any] | None = None  # the engine's error event, as {"error": {...}}

    def feed(self, line: bytes) -> None:
        """One line of the stream; anything but a `data:` JSON object (pings, `[DONE]`) is skipped."""
        if not line.startswith(b"data:"):
            return
        try:
            event = json.loads(line[5:])
        except ValueError:
            return  # `[DONE]`
        if not isinstance(event, dict):
            return  # llama-server opens a stream of several prompts with `data: null`
        if "error" in event:
            self.error = event
            return
        if not self.head:
            self.head = {key: event[key] for key in HEAD if key in event}
        self.figures.update({key: event[key] for key in FIGURES if event.get(key) is not None})
        for chunk in event.get("choices") or []:
            self.choices.setdefault(chunk.get("index", 0), _Choice()).add(chunk)

    def error_status(self) -> int:
        """The HTTP status llama-server would have answered the error with (its `code`)."""
        err = (self.error or {}).get("error")
        code = err.get("code") if isinstance(err, dict) else None
        return code if isinstance(code, int) and 400 <= code < 600 else 500

    def answer(self) -> dict[str, Any]:
        head = {**self.head, "object": str(self.head.get("object", "")).removesuffix(".chunk")}
        return {**head, "choices": [self.choices[i].result(i) for i in sorted(self.choices)], **self.figures}
