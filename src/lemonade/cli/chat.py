"""One conversation with one model: what `lemonade chat` sends, and what comes back.

The chat goes through the official `openai` client against our own `/v1/chat/completions`, the
same path every other app takes, so what works here works for them. The conversation is kept and
sent back each turn; a model's reasoning trace is shown but never sent back. The REPL around it
(input, slash commands, display) is `chat_cmd.py`.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from lemonade.cli.client import ServerClient
from lemonade.cli.common import fail
from lemonade.cli.target import api_key

# A reply whose end is one short unit over and over (small base models print "#####..." or the same
# line forever) is stopped: nobody wants to wait for max_tokens of it.
RUNAWAY_UNIT = 60  # longest repeated unit looked for, in characters
RUNAWAY_SPAN = 80  # characters of repetition (and at least 6 units) before a reply counts as runaway
RUNAWAY_TAIL = 6 * RUNAWAY_UNIT  # the part of a reply the check needs


# A base model (no chat template, e.g. the quick start's Gemma 3 270M) does not know chat turns; it
# continues text. `--base` talks to it through a conversation transcript on /v1/completions, with
# a few example turns and stops at the next turn, which keeps its replies short and on topic.
BASE_PREAMBLE = ("This is a conversation between a user and a friendly, helpful assistant. The assistant answers "
                 "briefly, clearly and politely.")
BASE_SHOTS = (("Good morning!", "Good morning! How can I help you today?"),
              ("What is the capital of Italy?", "The capital of Italy is Rome."),
              ("Thanks!", "You're welcome!"))
BASE_STOPS = ["\nUser:", "\nAssistant:", "\n\n"]
BASE_DEFAULTS = {"max_tokens": 200, "temperature": 0.7, "repeat_penalty": 1.1}


def transcript(history: list[dict[str, str]]) -> str:
    """The conversation as the text a base model continues: preamble (or the system prompt),
    example turns, then every turn so far, ending where the assistant speaks next."""
    system = next((m["content"] for m in history if m["role"] == "system"), None)
    lines = [system or BASE_PREAMBLE, ""]
    for user, assistant in BASE_SHOTS:
        lines += [f"User: {user}", f"Assistant: {assistant}"]
    for m in history:
        if m["role"] in ("user", "assistant"):
            lines.append(f"{m['role'].capitalize()}: {m['content'].strip()}")
    return "\n".join(lines) + "\nAssistant:"


def runaway(text: str) -> bool:
    """Whether `text` ends in at least RUNAWAY_SPAN characters (and six units) of one repeated unit:
    its last n characters have period p. Runs once per streamed piece, so it compares slices only."""
    for period in range(1, RUNAWAY_UNIT + 1):
        n = max(RUNAWAY_SPAN, 6 * period)
        if len(text) < n:
            return False  # n only grows with the period
        tail = text[-n:]
        if tail[period:] == tail[:-period]:
            return True
    return False


@dataclass
class Turn:
    """What the last reply cost, for `/stats` and the line under each reply."""

    completion_tokens: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        rate = f"{self.completion_tokens / self.seconds:.1f} tok/s" if self.seconds > 0 else "- tok/s"
        return f"{self.completion_tokens} tokens · {rate} · {self.prompt_tokens} prompt"


class Chat:
    """One conversation with one model; `send()` gives the reply piece by piece and keeps the history.

    `think`: None leaves reasoning to the model; True/False asks for it or suppresses it (the chat
    template's `enable_thinking`, which is how Qwen 3 and similar templates honour `/no_think`)."""

    def __init__(self, c: ServerClient, model: str, system: str | None = None,
                 max_tokens: int | None = None, temperature: float | None = None,
                 repeat_penalty: float | None = None, base: bool = False, stream: bool = True) -> None:
        try:
            from openai import OpenAI
        except ImportError:
            raise fail("`lemonade chat` needs the openai package: pip install 'openai>=1.40'") from None

        key = api_key() or "lemonade"
        self.openai = OpenAI(base_url=c.url + "/v1", api_key=key, max_retries=0, timeout=None)
        self.model = model
        self.system = system
        self.base = base
        self.stream = stream
        self.think: bool | None = None
        self.last = Turn()
        wanted = {"max_tokens": max_tokens, "temperature": temperature, "repeat_penalty": repeat_penalty}
        if base:
            wanted = {k: BASE_DEFAULTS[k] if v is None else v for k, v in wanted.items()}
        self.params: dict[str, Any] = {k: v for k, v in wanted.items() if v is not None and k != "repeat_penalty"}
        self.extra: dict[str, Any] = {}
        if wanted["repeat_penalty"] is not None:  # llama.cpp's sampler option, passed through by the server
            self.extra["repeat_penalty"] = wanted["repeat_penalty"]
        self.history: list[dict[str, str]] = []
        self.clear()

    def clear(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []

    def switch(self, model: str | None = None, system: str | None = None) -> None:
        """Another model or system prompt: a new conversation."""
        if model is not None:
            self.model = model
        if system is not None:
            self.system = system or None
        self.clear()

    def _extra_body(self) -> dict[str, Any] | None:
        extra = dict(self.extra)
        if self.think is not None and not self.base:
            extra["chat_template_kwargs"] = {"enable_thinking": self.think}
        return extra or None

    def _request(self) -> Any:
        common: dict[str, Any] = {"model": self.model, "stream": self.stream, "extra_body": self._extra_body(),
                                  **self.params}
        if self.stream:
            common["stream_options"] = {"include_usage": True}
        if self.base:
            return self.openai.completions.create(prompt=transcript(self.history), stop=BASE_STOPS, **common)
        return self.openai.chat.completions.create(messages=self.history, **common)  # type: ignore[arg-type]

    def _pieces(self, response: Any) -> Iterator[tuple[str, str]]:
        """("reasoning" | "content", text) of a streamed or a whole response; usage into self.last."""
        chunks = response if self.stream else [response]
        for chunk in chunks:
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                self.last.completion_tokens = usage.completion_tokens or 0
                self.last.prompt_tokens = usage.prompt_tokens or 0
            for choice in (chunk.choices or [])[:1]:
                part = getattr(choice, "delta", None) or getattr(choice, "message", None)
                reasoning = getattr(part, "reasoning_content", None)
                if reasoning:
                    yield "reasoning", reasoning
                text = choice.text if self.base else getattr(part, "content", None)
                if text:
                    yield "content", text

    def send(self, text: str) -> Generator[tuple[str, str], None, None]:
        """Yields ("content" | "reasoning", piece), then ("runaway", "") if the reply was stopped for
        repeating itself. Closing the generator (Ctrl-C) closes the HTTP stream, which stops the
        generation on the server. The reply joins the history when done or stopped; the reasoning
        never does."""
        self.history.append({"role": "user", "content": text})
        reply: list[str] = []
        tail = ""  # the end of the reply, for the runaway check
        response: Any = None
        self.last = Turn()
        started = time.monotonic()
        try:
            response = self._request()
            for kind, piece in self._pieces(response):
                if kind == "reasoning":
                    yield kind, piece
                    continue
                if not reply and self.base:
                    piece = piece.lstrip()  # "Assistant: Hi" continues with " Hi"
                    if not piece:
                        continue
                reply.append(piece)
                yield "content", piece
                tail = (tail + piece)[-RUNAWAY_TAIL:]
                if runaway(tail):
                    yield "runaway", ""
                    break
        finally:
            if response is not None and self.stream:
                response.close()
            self.last.seconds = time.monotonic() - started
            if reply:
                if not self.last.completion_tokens:  # no usage reported (a stopped stream): one token a chunk
                    self.last.completion_tokens = len(reply)
                self.history.append({"role": "assistant", "content": "".join(reply)})
            else:  # nothing came back: forget the question too, so the turns stay paired
                self.history.pop()
