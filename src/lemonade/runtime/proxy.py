"""Forwarding requests to a loaded engine: JSON round trips and chunk-by-chunk SSE relays.

Streams are relayed as raw chunks the moment they arrive (never re-framed or buffered); only the
last few KB are kept to read the engine's final `timings` for `/v1/stats`. A client that goes
away closes the upstream connection, which makes llama-server stop generating. An engine that
dies mid-stream produces an SSE `error` event instead of a hang. Non-streamed text generation is
asked of the engine streamed where its description says so (`Engine.streamed_for_cancel`), so
that a client hanging up stops it as well; the answer is assembled here (runtime/assemble.py).

What the proxy relays is a `Relay`, plain values (the body, its media type, what to run once it is
sent): `api/relay.py` makes the HTTP response of it, so nothing here knows the web framework.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.observability.metrics import Metrics
from lemonade.observability.spans import InferenceSpan
from lemonade.runtime.assemble import Assembly
from lemonade.runtime.engine_client import EngineClient, EngineStream
from lemonade.runtime.engine_request import EngineError, FileBody, encode, may_run_long, refuse_oversized_prompt
from lemonade.runtime.keepalive import FIRST_CHUNK_WAIT, KEEPALIVE, KEEPALIVE_INTERVAL, SSE, is_comment
from lemonade.runtime.options import RecipeOptions
from lemonade.runtime.remote_http import RemoteHttp, RemoteStream
from lemonade.runtime.request_context import ClientGone, cancelled_when_gone, request_trace
from lemonade.runtime.router import LoadedModel, Router
from lemonade.runtime.slot_affinity import text_of
from lemonade.runtime.speculation_switch import SpeculationSwitch
from lemonade.runtime.stats import Stats, cache_tokens_of

log = logging.getLogger("lemonade.proxy")
T = TypeVar("T")
TAIL_BYTES = 16384
DONE_MARK = b"data: [DONE]"  # the last event of an OpenAI-style stream: the client's answer is complete
# llama-server closes the connection after every streamed response. Were that connection put back
# in a pool, the next request could be sent on it before the close arrives and fail (a 502, seen
# with back-to-back requests after a stream). So a stream has a connection of its own, closed when
# the stream ends (engine_client.py never pools one; to a remote engine we say so).
STREAM_HEADERS = {"Content-Type": "application/json", "Connection": "close"}
COPY_TIMEOUT_S = 10.0  # a slot copy the engine has not done by then (it defers a busy slot's) is given up
ENGINE_ERRORS = (OSError,)  # refused, reset, timed out: both clients raise these (remote_http.py says why)
# A relayed stream is neither cached nor buffered on its way (X-Accel-Buffering: a reverse proxy such as nginx)
STREAM_RESPONSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Relay:
    """An engine's answer as the proxy hands it to the API: `body`, the whole answer (bytes) or a
    stream of chunks relayed as they come; `after`, an async function that must run once the answer
    has been sent, however its sending ends (a client that left included): the stats of a whole
    answer, the model and its KV room given back by a stream. The API sends the answer, then awaits
    `after` (api/relay.py)."""

    body: bytes | AsyncIterator[bytes]
    media_type: str
    after: Callable[[], Awaitable[None]] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def upstream_error(lm: LoadedModel, resp_status: int, text: str) -> EngineError:
    """The engine's own status and message, in our error shape. A string `code` of a 4xx is kept: an
    engine of ours names the client's mistake that way (e.g. `invalid_audio`); llama-server's codes
    are numbers."""
    message, code = text, None
    try:
        body = json.loads(text)
        err = body.get("error", body)
        if isinstance(err, dict):
            message, code = err.get("message", text), err.get("code")
        else:
            message = str(err)
    except (ValueError, AttributeError):
        pass
    status = resp_status if 400 <= resp_status < 600 else 500
    if lm.engine.remote:  # a cloud provider's refusal, said in terms of our server (its key is ours, not the client's)
        mapped = lm.engine.upstream_error(lm.launch, status, str(message))
        if mapped is not None:
            return EngineError(mapped[0], mapped[1], type="server_error" if mapped[0] >= 500 else
                               "invalid_request_error", code=mapped[2])
    if status < 500 and is_context_window_error(str(message)):  # OpenAI's code for it, which clients test for
        return EngineError(status, f"{lm.model.public}: {message}", type="invalid_request_error",
                           code="context_length_exceeded", extra={"status_code": status})
    keep = status < 500 and isinstance(code, str) and code
    return EngineError(status, f"{lm.model.public}: {message}", code=code if keep else "backend_error",
                       extra={"status_code": status})


def is_context_window_error(message: str) -> bool:
    """llama-server's refusal of a prompt longer than the context, in the words it (and others) use."""
    lowered = message.lower()
    return "exceeds the available context size" in lowered or "context length exceeded" in lowered


class EngineUnreachable(EngineError):
    """The engine process did not answer at all (it died, or is dying)."""


def crash_error(lm: LoadedModel, exc: Exception) -> EngineUnreachable:
    if lm.engine.remote:
        status, message, error_code = lm.engine.unreachable(lm.launch, exc)
        return EngineUnreachable(status, message, type="server_error", code=error_code)
    if lm.exit_reason is not None:  # the router knows why (an out-of-memory kill, an exit code)
        return EngineUnreachable(502, f"The engine for {lm.model.public} ended while answering: {lm.exit_reason}",
                                 type="server_error", code="backend_crashed")
    code = lm.server.proc.returncode if lm.server.proc else None
    if code is not None:
        return EngineUnreachable(502, f"The engine for {lm.model.public} exited (code {code}) while answering; it is "
                                 "started again on the next request", type="server_error", code="backend_crashed")
    return EngineUnreachable(502, f"Lost the connection to the engine for {lm.model.public}: {exc}",
                             type="server_error", code="backend_unreachable")


def _final_event(tail: collections.deque[bytes]) -> dict[str, Any] | None:
    """The engine's closing figures in the last chunks of a stream: llama-server's `timings`, else `usage`."""
    last = b"".join(tail)
    return _last_event_with(last, b'"timings"') or _last_event_with(last, b'"usage"')


def timings_at_end(content: bytes) -> dict[str, Any] | None:
    """llama-server's `timings` object of a non-streamed answer, where it writes it (at the end), read
    without parsing the whole answer again."""
    at = content.rfind(b'"timings":', max(0, len(content) - 2048))
    if at < 0:
        return None
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        found, _ = json.JSONDecoder().raw_decode(content[at + len(b'"timings":'):].decode().lstrip())
        return found if isinstance(found, dict) else None
    return None


def _last_event_with(tail: bytes, needle: bytes) -> dict[str, Any] | None:
    """The last SSE `data:` JSON object in `tail` that contains `needle`."""
    for line in reversed(tail.split(b"\n")):
        if needle in line and line.startswith(b"data:"):
            with contextlib.suppress(ValueError):
                return json.loads(line[5:].strip())
    return None



def plain_http(url: str) -> tuple[str, str] | None:
    """(origin, path and query) of a remote engine's `http://host:port/...` URL, which our own client
    takes (runtime/engine_client.py: a peer server of the LAN); None for TLS or a URL without a port,
    which go through aiohttp."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.netloc or ":" not in parts.netloc.rsplit("]", 1)[-1]:
        return None
    return f"http://{parts.netloc}", url[len("http://") + len(parts.netloc):] or "/"


def extra_headers(headers: dict[str, str]) -> dict[str, str]:
    """A remote engine's request headers but those our own client writes itself."""
    return {k: v for k, v in headers.items() if k.lower() not in ("host", "content-type", "content-length")}


class Proxy:
    """Requests to loaded engines. Built once per server from the few collaborators it needs."""

    def __init__(self, router: Router, remote: RemoteHttp, client: EngineClient,
                 options: RecipeOptions, stats: Stats, metrics: Metrics, speculation: SpeculationSwitch) -> None:
        self.router = router
        self.remote = remote  # cloud engines, and uploads streamed from files
        self.client = client  # JSON round trips to local engines
        self.options = options
        self.stats = stats
        self.metrics = metrics
        self.speculation = speculation  # speculative decoding per model: measured, switched (speculation_switch.py)
        # The model (and its engine's path) to ask when a remote engine failed a request before any of
        # its answer left: another peer, or this server's own model (runtime/forwarding.py; services.py wires it).
        self.instead: Callable[[ModelInfo, str, EngineError], tuple[ModelInfo, str] | None] = lambda *_: None

    def _options(self, model: ModelInfo) -> Callable[[], dict[str, Any]]:
        return lambda: self.options.resolve(model.name, model.recipe)

    def _account(self, model: ModelInfo, endpoint: str, body: dict[str, Any] | None) -> None:
        if body is None:
            return
        speedup = self.speculation.after(model, body)
        tokens_in, tokens_out = self.stats.record_llamacpp(body, speedup)
        self.metrics.record_inference(model.public, endpoint, tokens_in, tokens_out, cache_tokens_of(body))
        span = request_trace.get()
        if span is not None and speedup is not None:
            span.extra["lemon.speculation.speedup"] = speedup

    async def _call(self, lm: LoadedModel, method: str, path: str, body: dict[str, Any] | None,
                    raw: bytes | FileBody | Framed | None = None, content_type: str = "application/json") -> bytes:
        """One round trip to the engine; its failures become client-facing errors. A client that
        hangs up meanwhile cancels the engine request (closing its connection stops llama-server)."""
        refuse_oversized_prompt(lm, body)
        held = await self._reserve(lm, body)
        try:
            content = await self._send(lm, method, path, body, raw, content_type)
            if held.slot is not None:
                held.timings = timings_at_end(content)
            return content
        finally:
            held.release(lm)

    async def _reserve(self, lm: LoadedModel, body: dict[str, Any] | None) -> Held:
        """The slot the request goes to (the one holding its conversation: runtime/slot_affinity.py),
        and room in the engine's shared KV cache for it (runtime/kv_pool.py: waits while earlier
        requests hold it)."""
        held = Held()
        if not body:
            return held
        if lm.affinity is not None:
            held.text = text_of(body)
            named = body.get("id_slot")  # the client's own choice: it waits for that slot as ours do
            named = named if isinstance(named, int) and not isinstance(named, bool) and named >= 0 else None
            held.slot = await cancelled_when_gone(lm.affinity.acquire(held.text, named))
            if held.slot is not None and named is None:
                body["id_slot"] = held.slot
                if lm.launch.prefix_copy:
                    await self._copy_prefix(lm, held)
            if held.slot is not None:
                lm.affinity.sending(held.slot, held.text, bool(body.get("stream")))
        if lm.kv is not None:
            try:
                held.tokens = await cancelled_when_gone(lm.kv.reserve(body, lambda text: self._count_tokens(lm, text)))
            except BaseException:
                held.give_back(lm)
                raise
        return held

    async def _copy_prefix(self, lm: LoadedModel, held: Held) -> None:
        """A new conversation whose beginning another (idle) slot holds gets that slot's state first, so
        the engine reads only what follows the common part (runtime/slot_affinity.py, `donor`)."""
        assert lm.affinity is not None and held.slot is not None
        try:
            donor = await cancelled_when_gone(lm.affinity.lend_donor(held.text, held.slot))
        except BaseException:
            held.give_back(lm)
            raise
        if donor is None:
            return
        try:
            tokens = await cancelled_when_gone(asyncio.wait_for(
                lm.engine.share_slot(lm.launch, self.client, donor, held.slot), COPY_TIMEOUT_S))
        except (*ENGINE_ERRORS, ValueError) as exc:  # the request is then read in full: nothing is lost
            log.debug("Copying slot %d of %s into slot %d failed: %s", donor, lm.name, held.slot, exc)
            tokens = 0
        except BaseException:
            held.give_back(lm)
            raise
        finally:
            lm.affinity.release(donor, lm.affinity.held.get(donor, ""))
        if tokens:
            log.debug("Slot %d of %s starts from slot %d's %d tokens", held.slot, lm.name, donor, tokens)

    async def _crash(self, lm: LoadedModel, exc: Exception) -> EngineUnreachable:
        """The error for a request whose engine went away: once the router has seen the process end
        (a moment at most), it says why, an out-of-memory kill or an RPC worker gone included."""
        if not lm.engine.remote:
            await self.router.confirm_crash(lm, wait=1.0)
            await self.router.explained(lm)  # what else ended it (an RPC worker gone), a moment at most
        return crash_error(lm, exc)

    async def _count_tokens(self, lm: LoadedModel, text: str) -> int | None:
        """Tokens of `text` by the engine's own tokenizer (None: it did not say)."""
        try:
            status, content = await self.client.request("POST", lm.base_url, "/tokenize",
                                                        encode({"content": text, "add_special": False}))
            tokens = json.loads(content).get("tokens") if status == 200 else None
        except (*ENGINE_ERRORS, ValueError, AttributeError):
            return None
        return len(tokens) if isinstance(tokens, list) else None

    async def _send(self, lm: LoadedModel, method: str, path: str, body: dict[str, Any] | None,
                    raw: bytes | FileBody | Framed | None, content_type: str) -> bytes:
        streamed = lm.engine.streamed_for_cancel.get(path) if may_run_long(body) else None
        data: Any = raw if raw is not None else encode(body) if body is not None else None
        headers = {"Content-Type": content_type}
        if isinstance(raw, FileBody):
            raw = Framed(b"", raw, b"")
        if isinstance(raw, Framed):  # streamed in parts, with its length (engines read Content-Length)
            data = raw
            headers["Content-Length"] = str(len(raw))
        url = lm.base_url + path
        if lm.engine.remote:
            url, body, headers = lm.engine.outbound(lm.launch, path, body, headers)
            data = raw if raw is not None else encode(body) if body is not None else None

        async def round_trip() -> tuple[int, bytes]:
            if data is None or isinstance(data, bytes):
                if not lm.engine.remote:
                    return await self.client.request(method, lm.base_url, path, data, content_type)
                lean = plain_http(url) if lm.engine.lean_client else None
                if lean is not None:
                    return await self.client.request(method, *lean, data, content_type, extra_headers(headers),
                                                     lm.engine.connect_timeout)
            return await self.remote.request(method, url, data, headers, lm.engine.connect_timeout)

        span = request_trace.get()
        if span is not None:
            trace_engine(span, lm)
        try:
            status, content = await cancelled_when_gone(
                round_trip() if streamed is None else self._assembled(lm, path, {**(body or {}), **streamed}))
        except ClientGone:
            log.info("%s: the client went away; the engine request was cancelled", lm.name)
            raise
        except ENGINE_ERRORS as exc:
            raise await self._crash(lm, exc) from None
        finally:
            lm.last_progress = time.monotonic()
        if status != 200:
            raise upstream_error(lm, status, content.decode(errors="replace"))
        if span is not None:
            span.answer(content)
        return content

    async def _assembled(self, lm: LoadedModel, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """A non-streamed request sent to the engine streamed; the answer is built from the chunks
        (runtime/assemble.py says why). Cancelled, it closes the stream, which stops the engine."""
        resp = await self.client.stream(lm.base_url, path, encode(body))
        try:
            if resp.status != 200:
                return resp.status, await resp.read()
            assembly = Assembly()
            rest = b""
            async for chunk in resp:
                lm.last_progress = time.monotonic()
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    assembly.feed(line)
            assembly.feed(rest)
            if assembly.error is not None:
                return assembly.error_status(), json.dumps(assembly.error).encode()
            return 200, json.dumps(assembly.answer()).encode()
        finally:
            resp.close()

    async def _with_fallback(self, model: ModelInfo, path: str, ask: Callable[[ModelInfo, str], Awaitable[T]]) -> T:
        """`ask(model, path)`; a remote engine that failed it before answering gives way to the model
        `instead` names, asked at its own engine's path; each model once."""
        tried = {model.name}
        while True:
            try:
                return await ask(model, path)
            except EngineError as exc:
                other = self.instead(model, path, exc)
                if other is None or other[0].name in tried:
                    raise
                log.info("%s: %s; asking %s instead", model.public, exc.message, other[0].public)
                model, path = other
                tried.add(model.name)

    async def _round_trip(self, model: ModelInfo, path: str, body: dict[str, Any]) -> bytes:
        return await self._with_fallback(model, path, lambda m, p: self._round_trip_once(m, p, body))

    async def _round_trip_once(self, model: ModelInfo, path: str, body: dict[str, Any]) -> bytes:
        """POST to the model's engine; an engine found dead is started again once and asked again."""
        await self.speculation.before(model, body, self._options(model))
        for attempt in range(2):
            async with self.router.use(model, self._options(model)) as lm:
                try:
                    return await self._call(lm, "POST", path, body)
                except EngineUnreachable:
                    if attempt or not await self.router.confirm_crash(lm):
                        raise
        raise AssertionError("unreachable")

    async def post_json(self, model: ModelInfo, path: str, body: dict[str, Any], endpoint: str,
                        lm: LoadedModel | None = None) -> dict[str, Any]:
        """One request/response round trip; returns the engine's JSON."""
        if lm is None:
            data = json.loads(await self._round_trip(model, path, body))
        else:
            async with self.router.hold(lm):
                data = json.loads(await self._call(lm, "POST", path, body))
        self._account(model, endpoint, data)
        return data

    async def get_json(self, lm: LoadedModel, path: str) -> Any:
        async with self.router.hold(lm):
            return json.loads(await self._call(lm, "GET", path, None))

    async def post_raw(self, model: ModelInfo, path: str, data: bytes | FileBody | dict[str, Any],
                       content_type: str) -> bytes:
        """A non-JSON body (e.g. audio; fields in `path`'s query; a `FileBody` is streamed from its file),
        or a JSON one (a dict) whose answer is not JSON (speech), to the model's engine, in the shape
        the engine takes (`Engine.encode_raw`); returns its answer in ours (`Engine.decode_raw`)."""
        return await self._with_fallback(model, path, lambda m, p: self._post_raw_once(m, p, data, content_type))

    async def _post_raw_once(self, model: ModelInfo, path: str, data: bytes | FileBody | dict[str, Any],
                             content_type: str) -> bytes:
        for attempt in range(2):
            async with self.router.use(model, self._options(model)) as lm:
                try:
                    if isinstance(data, dict):
                        content = await self._call(lm, "POST", path, data)
                    else:
                        engine_path, head, tail, engine_type = lm.engine.encode_raw(path, content_type, lm.launch)
                        body = Framed(head, data, tail) if head or tail else data
                        content = await self._call(lm, "POST", engine_path, None, raw=body, content_type=engine_type)
                    return lm.engine.decode_raw(path, content)
                except EngineUnreachable:
                    if attempt or not await self.router.confirm_crash(lm):
                        raise
                except EngineError as exc:
                    raise lm.engine.raw_error(path, exc) from None
        raise AssertionError("unreachable")

    async def forward(self, model: ModelInfo, path: str, body: dict[str, Any], endpoint: str) -> Relay:
        """Non-streamed: relay the engine's bytes as they are; its stats are read once they are sent
        (the client's wait ends before that parse, and before the next request is read), or before
        when the request is traced (its span ends as the answer leaves, with the figures read)."""
        content = await self._round_trip(model, path, body)

        async def account() -> None:
            with contextlib.suppress(ValueError):
                self._account(model, endpoint, json.loads(content))

        if request_trace.get() is not None:  # a span ends as the answer leaves: what it is told comes first
            await account()
            return Relay(content, "application/json")
        return Relay(content, "application/json", after=account)

    async def stream(self, model: ModelInfo, path: str, body: dict[str, Any], endpoint: str,
                     transform: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None = None,
                     media_type: str = SSE, in_band_errors: bool = True) -> Relay:
        """Streamed: relay the engine's SSE chunk by chunk. `transform` may re-shape the byte stream.

        A client that asked for a stream reads the engine's errors as a stream too (context overflow,
        an engine that is gone): one `error` event, re-shaped by `transform` into its API's own error
        event, never a bare JSON body that an SSE parser skips. Admission errors (unknown model,
        queue full with Retry-After, every slot pinned) keep their HTTP status, and so does every error
        when `in_band_errors` is False (a raw byte stream such as audio, which has no error event)."""
        try:
            return await self._with_fallback(
                model, path, lambda m, p: self._stream(m, p, body, endpoint, transform, media_type))
        except EngineError as exc:
            if not in_band_errors:
                raise  # a raw byte stream (audio) has no error events; nothing was sent, so the status says it
            log.warning("Streamed request to %s failed: %s", model.name, exc.message)
            span = request_trace.get()
            if span is not None:
                span.fail(exc.message)
            source = _error_events(exc)
            return Relay(transform(source) if transform else source, media_type,
                         headers=dict(STREAM_RESPONSE_HEADERS))

    async def _open_stream(self, lm: LoadedModel, path: str, body: dict[str, Any]) -> EngineStream | RemoteStream:
        if not lm.engine.remote:
            return await self.client.stream(lm.base_url, path, encode(body))
        url, sent, headers = lm.engine.outbound(lm.launch, path, body, dict(STREAM_HEADERS))
        assert sent is not None  # outbound passes a body on, it never drops one
        lean = plain_http(url) if lm.engine.lean_client else None
        if lean is not None:
            return await self.client.stream(*lean, encode(sent), extra_headers(headers), lm.engine.connect_timeout)
        return await self.remote.stream(url, encode(sent), headers, lm.engine.connect_timeout)

    async def _stream(self, model: ModelInfo, path: str, body: dict[str, Any], endpoint: str,
                      transform: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None,
                      media_type: str) -> Relay:
        await self.speculation.before(model, body, self._options(model))
        up = _Upstream(self, model, path, body)
        await up.acquire()  # admission errors (queue full, slots pinned, ...) keep their HTTP status
        # Our response starts with the engine's first chunk, not with its headers: llama-server sends
        # those before it reads the prompt, and starting a response (ours, and the client reading it)
        # meanwhile took CPU from the prompt's batch, a few ms of every stream's first token on 2 cores
        # (docs/performance.md, sixth round). A long prompt takes seconds, though, and a client or a
        # proxy with an idle timeout would give up on a silent connection (lemonade#1364): an SSE
        # stream whose engine is still silent after FIRST_CHUNK_WAIT starts without it and sends
        # keep-alives until the first chunk (`relay`); an NDJSON or audio stream has no such line.
        if media_type == SSE:
            up.waiting = asyncio.ensure_future(up.first_chunk())
            try:
                first = await up.next_after(FIRST_CHUNK_WAIT)
            except BaseException:
                up.release()
                raise
        else:
            first = await cancelled_when_gone(up.first_chunk())
        span = request_trace.get()
        reader = span.stream_reader() if span is not None else None  # the span reads what is relayed

        async def relay() -> AsyncIterator[bytes]:
            tail: collections.deque[bytes] = collections.deque()  # the last chunks, about TAIL_BYTES of them
            kept = 0
            started = False
            final: dict[str, Any] | None = None
            accounted = False
            chunk = first
            try:
                while up.waiting is not None:  # the engine reads the prompt: a keep-alive every interval
                    yield KEEPALIVE
                    chunk = await up.next_after(KEEPALIVE_INTERVAL)
                lm = up.lm
                while chunk is not None:
                    if not started:
                        started = True
                        lm.streaming += 1
                        if up.held.slot is not None and lm.affinity is not None:
                            lm.affinity.answering(up.held.slot)
                        log.debug("%s: first chunk after %.1f ms", lm.name, (time.perf_counter() - up.t0) * 1000)
                    # No copying per chunk (a 16 KB `(tail + chunk)[-16K:]` cost two copies of it per token).
                    tail.append(chunk)
                    kept += len(chunk)
                    while kept - len(tail[0]) >= TAIL_BYTES:
                        kept -= len(tail.popleft())
                    lm.last_progress = time.monotonic()
                    if not accounted and DONE_MARK in chunk:
                        # The client's answer is complete with this chunk, and the client may ask
                        # /v1/stats about it at once (the web app does): count it before it leaves, not
                        # at the engine's EOF, which can come later than that question on a busy machine.
                        accounted = True
                        final = up.asked_usage[-1] if up.asked_usage else _final_event(tail)
                        self._account(model, endpoint, final)
                        if final is not None:
                            up.held.timings = final.get("timings")
                    if reader is not None:
                        reader.feed(chunk)
                    yield chunk
                    chunk = await anext(up.chunks, None)  # type: ignore[arg-type]
            except ClientGone:
                pass  # it left while the engine read the prompt: the engine's stream is closed below
            except APIError as err:  # the engine failed or refused before its first chunk, after keep-alives
                log.warning("Streamed request to %s failed: %s", model.name, err.message)
                if span is not None:
                    span.fail(err.message)
                yield error_event(err)
            except ENGINE_ERRORS as exc:
                crash = await self._crash(up.lm, exc)
                log.error("%s", crash.message)
                if span is not None:
                    span.fail(crash.message)
                yield error_event(crash)
            finally:
                if started:
                    up.lm.streaming -= 1
                # A stream without [DONE] (other engines; a client gone first) is counted here: the
                # figures are in `tail` already.
                if not accounted:
                    final = up.asked_usage[-1] if up.asked_usage else _final_event(tail)
                    self._account(model, endpoint, final)
                if reader is not None:
                    if up.asked_usage:
                        reader.span.count_usage(up.asked_usage[-1].get("usage"), None)
                    reader.close()
                up.release()

        source = relay()
        return Relay(transform(source) if transform else source, media_type, after=up.cleanup,
                     headers=dict(STREAM_RESPONSE_HEADERS))


class _Upstream:
    """The engine side of one streamed request: the model it holds, its room in the engine's KV
    cache, the engine's answer, and the wait for that answer's first chunk."""

    def __init__(self, proxy: Proxy, model: ModelInfo, path: str, body: dict[str, Any]) -> None:
        self.proxy, self.model, self.path, self.body = proxy, model, path, body
        self.lm: LoadedModel = None  # type: ignore[assignment]  # set by acquire(), before anything else
        self.taken = False
        self.held = Held()  # the slot chosen and the KV cache tokens reserved, given back with the model
        self.resp: EngineStream | RemoteStream | None = None
        self.chunks: AsyncIterator[bytes] | None = None
        self.asked_usage: list[dict[str, Any]] = []  # usage events we asked a remote service for (not relayed)
        self.waiting: asyncio.Task[bytes | None] | None = None  # the read of a chunk, while keep-alives go out
        self.t0 = time.perf_counter()

    async def acquire(self) -> None:
        self.lm = await self.proxy.router.acquire(self.model, self.proxy._options(self.model))
        self.taken = True
        span = request_trace.get()
        if span is not None:
            trace_engine(span, self.lm)

    def release(self) -> None:
        """Stop reading, close the engine's answer (which stops its work) and give back the model and
        the KV room; once, however the request ends."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            if not waiting.done():
                waiting.cancel()
            elif not waiting.cancelled():
                waiting.exception()  # seen: a failure after the client left is nobody's to report
        self._let_go()

    async def cleanup(self) -> None:
        """Runs after the response ends, however it ends (also when the stream never started)."""
        self.release()

    def _let_go(self) -> None:
        if self.resp is not None:
            self.resp.close()
        if self.taken:
            self.taken = False
            self.held.release(self.lm)
            self.proxy.router.release(self.lm)

    async def first_chunk(self) -> bytes | None:
        """Send the request and wait for the engine's first chunk (None: an empty stream). An engine
        that dies before it has sent the client nothing of the answer, keep-alives at most, so it is
        started again and asked again, once. Its refusal is raised as an EngineError. Whatever
        fails, the model and the KV room are given back first."""
        proxy = self.proxy
        for attempt in range(2):
            if attempt:
                await self.acquire()
            lm = self.lm
            try:
                refuse_oversized_prompt(lm, self.body)
                self.held = await proxy._reserve(lm, self.body)
                resp = self.resp = await proxy._open_stream(lm, self.path, self.body)
                self.chunks = aiter(resp)
                if lm.engine.remote and lm.engine.asks_stream_usage(self.path, self.body):
                    self.asked_usage = []
                    self.chunks = _without_usage_events(self.chunks, self.asked_usage)
                if resp.status != 200:
                    raise upstream_error(lm, resp.status, (await resp.read()).decode(errors="replace"))
                return await anext(self.chunks, None)
            except ENGINE_ERRORS as exc:
                self._let_go()
                if attempt or not await proxy.router.confirm_crash(lm):
                    raise await proxy._crash(lm, exc) from None
            except BaseException:
                self._let_go()
                raise
        raise AssertionError("unreachable")

    async def next_after(self, timeout: float) -> bytes | None:
        """What `waiting` reads, if it comes within `timeout` s: then `waiting` is None and the
        chunk is returned (None: the stream ended); else `waiting` still reads and None is returned.
        A chunk of comment lines only (llama-server's own keep-alive after 30 s of silence) is not
        passed on, ours are: the wait goes on. The client leaving ends it (ClientGone)."""
        assert self.waiting is not None
        done, _ = await cancelled_when_gone(asyncio.wait((self.waiting,), timeout=timeout))
        if not done:
            return None
        chunk = self.waiting.result()
        self.waiting = None
        if chunk is not None and is_comment(chunk):
            self.waiting = asyncio.ensure_future(anext(self.chunks, None))  # type: ignore[arg-type]
            return None
        return chunk


@dataclass
class Held:
    """What a request holds of its engine while it runs: a slot chosen for it, KV cache tokens."""

    tokens: int = 0
    slot: int | None = None
    text: str = ""
    timings: dict[str, Any] | None = None  # the engine's figures for the answer (how fast it read the prompt)

    def release(self, lm: LoadedModel) -> None:
        if self.tokens and lm.kv is not None:
            lm.kv.release(self.tokens)
            self.tokens = 0
        if self.slot is not None and lm.affinity is not None:
            lm.affinity.release(self.slot, self.text, self.timings)
            self.slot = None

    def give_back(self, lm: LoadedModel) -> None:
        """Release what a request holds that never reached the engine: its slot keeps what it held."""
        if self.slot is not None and lm.affinity is not None:
            self.text = lm.affinity.held.get(self.slot, "")
        self.release(lm)


def trace_engine(span: InferenceSpan, lm: LoadedModel) -> None:
    """The request's span learns which model and engine serve it (telemetry or a span listener on)."""
    span.engine(lm.model.recipe, lm.model.checkpoint, lm.launch.device, lm.launch.speculation.kind)


def tokens_of(answer: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(prompt, generated) tokens of an engine's answer: llama-server's `timings`, else OpenAI `usage`."""
    if not isinstance(answer, dict):
        return None, None
    timings, usage = answer.get("timings"), answer.get("usage")
    if isinstance(timings, dict):
        return timings.get("prompt_n"), timings.get("predicted_n")
    if isinstance(usage, dict):
        return (usage.get("prompt_tokens", usage.get("input_tokens")),
                usage.get("completion_tokens", usage.get("output_tokens")))
    return None, None


class Framed:
    """A raw body sent between an engine's framing (`Engine.encode_raw`) without being copied: an
    async iterable of its parts (a `FileBody` read from its file), with a known length."""

    def __init__(self, head: bytes, body: bytes | FileBody, tail: bytes) -> None:
        self.head, self.body, self.tail = head, body, tail

    def __len__(self) -> int:
        body = self.body.size if isinstance(self.body, FileBody) else len(self.body)
        return len(self.head) + body + len(self.tail)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        if isinstance(self.body, FileBody):
            async for piece in self.body.chunks():
                yield piece
        else:
            yield self.body
        yield self.tail


async def _without_usage_events(chunks: AsyncIterator[bytes], kept: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    """A remote stream whose usage we asked for ourselves (`Engine.asks_stream_usage`), relayed line by
    line without its usage-only events (no choices), which are kept in `kept` instead. An event that
    carries content and usage is relayed as it is."""
    rest = b""
    async for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        out = [line + b"\n" for line in lines if not _usage_only(line, kept)]
        if out:
            yield b"".join(out)
    if rest and not _usage_only(rest, kept):
        yield rest


def _usage_only(line: bytes, kept: list[dict[str, Any]]) -> bool:
    if not line.startswith(b"data:") or b'"usage"' not in line:
        return False
    try:
        event = json.loads(line[5:].strip())
    except ValueError:
        return False
    if not isinstance(event, dict) or not isinstance(event.get("usage"), dict) or event.get("choices"):
        return False
    kept.append(event)
    return True


def error_event(err: APIError) -> bytes:
    """An error as an OpenAI-style SSE event (the Anthropic and Ollama translators re-shape it)."""
    payload = {"error": {"message": err.message, "type": err.type, "code": err.code}}
    return f"event: error\ndata: {json.dumps(payload)}\n\n".encode()


async def _error_events(err: APIError) -> AsyncIterator[bytes]:
    yield error_event(err)
