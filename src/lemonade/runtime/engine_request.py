"""What a request becomes on its way to an engine: its bytes, whether it is asked as a stream,
and whether it can fit at all. Pure functions, kept apart from the relaying in `proxy.py`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from lemonade.errors import APIError

if TYPE_CHECKING:
    from lemonade.runtime.router import LoadedModel


class EngineError(APIError):
    """An error the engine answered with, or the engine not answering: what a stream reports in-band."""


def encode(body: dict[str, Any]) -> bytes:
    """The body as UTF-8 JSON for the engine. Text that is not Unicode (a lone UTF-16 surrogate such
    as "\\ud800", which JSON can spell) is a 400 here; the engine would answer it with a 500."""
    try:
        return json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end].encode("unicode_escape", "backslashreplace").decode()
        raise APIError(400, f"The request contains text that is not valid Unicode ({bad}, a lone UTF-16 "
                       "surrogate); send whole characters (a surrogate pair, or the character itself)",
                       code="invalid_argument") from None


@dataclass
class FileBody:
    """A request body read from a file in 256 KB pieces (an upload the HTTP layer spooled to disk), so a
    long recording reaches the engine without a copy of it in the server's memory. It is read from
    the start on every attempt (the proxy asks a restarted engine again). The pieces are read in
    worker threads; at 1 MB each thread's allocator kept a piece resident (6 MB for a 20 MB upload
    once more threads existed), at 256 KB it does not."""

    file: BinaryIO
    size: int
    chunk: int = 1 << 18

    async def chunks(self) -> AsyncIterator[bytes]:
        await asyncio.to_thread(self.file.seek, 0)
        left = self.size
        while left > 0:
            piece = await asyncio.to_thread(self.file.read, min(self.chunk, left))
            if not piece:
                return
            left -= len(piece)
            yield piece


SHORT_ANSWER_TOKENS = 16  # done in a fraction of a second: nothing worth cancelling


def may_run_long(body: dict[str, Any] | None) -> bool:
    """Whether a non-streamed generation could go on long enough for its client to give up on it.
    Only those are asked of the engine as streams (so hanging up stops them); a stream costs a
    connection of its own, a few ms that a short answer is better off without."""
    if body is None or body.get("stream"):
        return False
    budget = next((body[k] for k in ("max_tokens", "max_completion_tokens", "n_predict") if k in body), None)
    return not isinstance(budget, int) or budget < 0 or budget > SHORT_ANSWER_TOKENS


MAX_CHARS_PER_TOKEN = 256  # no vocabulary has longer tokens: more characters than this cannot fit


def _text_size(value: Any) -> int:
    """Characters of text in a prompt, messages or input (content parts included, images not)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    if isinstance(value, dict):
        return _text_size(value.get("content")) + _text_size(value.get("text"))
    return 0


def refuse_oversized_prompt(lm: LoadedModel, body: dict[str, Any] | None) -> None:
    """A prompt that cannot possibly fit the model's context is refused before it reaches the engine,
    which would otherwise tokenize all of it (minutes for tens of MB) before saying so."""
    ctx = lm.context_length
    if not body or ctx is None:
        return
    chars = sum(_text_size(body.get(key)) for key in ("messages", "prompt", "input"))
    if chars > ctx * MAX_CHARS_PER_TOKEN:
        raise EngineError(400, f"The request's text ({chars} characters) cannot fit the {ctx}-token context "
                          f"{lm.model.public} is loaded with. Shorten it, or load the model with a larger ctx_size.",
                          code="context_length_exceeded")
