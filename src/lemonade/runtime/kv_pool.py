"""Admission to an engine whose slots share one KV cache, so that concurrent requests never overflow it.

With a unified KV cache (llama-server `-kvu`, the shipped profiles' `-np 8 -kvu`, and llama-server's
own default of 4 automatic slots) every request may use the whole context, but all of them together
share it. When the requests being served need more cells than the cache has, llama-server fails
*every* request in progress with "Context size has been exceeded" (tools/server: no request can be
finished, so none is). Eight long prompts sent at once would all fail, although each fits alone.

So requests to such an engine reserve the tokens they may need before they are sent: an upper bound
first (a token covers at least one byte of text, plus what the chat template adds per message, plus
the answer's budget), counted exactly by the engine's tokenizer only when the bound does not fit what
is free. A request that does not fit waits, first come first served, until earlier ones finish. One
that could not fit even alone is not held back: the engine answers it with its own refusal.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("lemonade.kv")

TEMPLATE_TOKENS_PER_MESSAGE = 16  # role markers and separators a chat template adds around each message
TEMPLATE_TOKENS = 64              # the template's own frame (BOS, generation prompt, a default system turn)
# The answer's reservation when the request sets no limit: it may run to the end of the context, but
# reserving all of it would serialise every unlimited request; most answers are far shorter.
DEFAULT_ANSWER_TOKENS = 1024
BUDGET_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def text_of(body: dict[str, Any]) -> str:
    """The text a request puts into the prompt: messages (text parts), a prompt, an input, tools."""
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for key in ("content", "text", "arguments", "input", "output", "reasoning_content"):
                walk(value.get(key))
            if isinstance(value.get("tool_calls"), list):
                walk([c.get("function") for c in value["tool_calls"] if isinstance(c, dict)])

    for key in ("messages", "prompt", "input", "instructions", "system"):
        walk(body.get(key))
    return "\n".join(parts)


def _messages(body: dict[str, Any]) -> int:
    for key in ("messages", "input"):
        if isinstance(body.get(key), list):
            return len(body[key])
    return 1


def answer_budget(body: dict[str, Any], share: int) -> int:
    """Tokens the answer may add: the request's own limit, else DEFAULT_ANSWER_TOKENS, or one slot's
    share of the cache when that is less (a small cache with many slots)."""
    for key in BUDGET_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return min(DEFAULT_ANSWER_TOKENS, share)


def overhead(body: dict[str, Any]) -> int:
    """Tokens the template adds, tool definitions included (rendered into the prompt as text: at most
    one token per byte of their JSON)."""
    tools = body.get("tools")
    tool_bytes = len(str(tools).encode("utf-8", "surrogatepass")) if tools else 0
    return TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * _messages(body) + tool_bytes


@dataclass
class _Waiter:
    need: int
    future: asyncio.Future[None]


@dataclass
class KvPool:
    """One engine's shared KV cache of `tokens` cells, and the requests holding a part of it."""

    tokens: int
    slots: int = 1
    reserved: int = 0
    _queue: collections.deque[_Waiter] = field(default_factory=collections.deque)
    waits: int = 0  # requests that had to wait for room (health, tests)

    def describe(self) -> dict[str, int]:
        """`kv_cache` of a loaded model in `/v1/health`: the shared cache and who holds or waits for it."""
        return {"tokens": self.tokens, "slots": self.slots, "reserved": self.reserved, "waiting": len(self._queue),
                "waits_total": self.waits}

    def fits(self, need: int) -> bool:
        return not self._queue and self.reserved + need <= self.tokens

    async def reserve(self, body: dict[str, Any] | None,
                      count_tokens: Callable[[str], Awaitable[int | None]]) -> int:
        """Hold room for this request; returns what was reserved (give it back with `release`).
        `count_tokens` asks the engine's tokenizer (None: it could not)."""
        if not body:
            return 0
        text = text_of(body)
        # An upper bound: no token is shorter than a byte. (A lone surrogate is refused later, with a 400.)
        prompt = len(text.encode("utf-8", "surrogatepass")) + overhead(body)
        answer = answer_budget(body, max(self.tokens // max(self.slots, 1), 1))
        need = prompt + answer
        if need <= self.tokens and self.fits(need):
            self.reserved += need
            return need
        exact = await count_tokens(text) if text else 0
        if exact is not None:
            prompt = min(prompt, exact + overhead(body))
        if prompt > self.tokens:
            return 0  # a prompt larger than the whole cache: the engine refuses it, with its own message
        need = min(prompt + answer, self.tokens)  # at most all of it: then it runs alone
        if self.fits(need):
            self.reserved += need
            return need
        waiter = _Waiter(need, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        self.waits += 1
        log.info("A request needing %d tokens of the shared KV cache waits: %d of %d are held by requests in "
                 "progress", need, self.reserved, self.tokens)
        try:
            await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(need)  # admitted just as it was cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._queue.remove(waiter)
                self._admit()
            raise
        return need

    def release(self, reserved: int) -> None:
        if reserved:
            self.reserved = max(0, self.reserved - reserved)
            self._admit()

    def _admit(self) -> None:
        """Waiters in order while they fit (the first one that does not fit holds the rest back)."""
        while self._queue and self.reserved + self._queue[0].need <= self.tokens:
            waiter = self._queue.popleft()
            if waiter.future.done():
                continue
            self.reserved += waiter.need
            waiter.future.set_result(None)
