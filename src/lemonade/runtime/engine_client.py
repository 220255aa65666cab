"""The client for requests to engines on loopback: HTTP/1.1 connections, kept alive between JSON
round trips, parsed with httptools (the C parser uvicorn uses for our own requests).

Why not aiohttp here: a `max_tokens=1` request costs the engine a few milliseconds, and aiohttp's
client spent about 0.8 ms of CPU on each round trip (request and response objects, header
multidicts, stream readers, timers), and a few microseconds on every relayed token, on a 2-core
machine where every millisecond of ours is taken from the engine. This one writes the request in
one piece and takes the answer from the parser's callbacks. It does only what our engines need:
a bytes body; an answer read whole, or relayed chunk by chunk. A remote engine on plain HTTP (a
peer server of the LAN, backends/peer/engine.py) takes the same path, with its own headers and connect
timeout: forwarding is held to 2 ms a request (docs/performance.md, "Peers"). Uploads streamed from
files and TLS engines (cloud providers) stay on aiohttp (`runtime/remote_http.py`).

Closing a connection is how a request is stopped: a task cancelled while it waits (the client hung
up) closes its connection, and llama-server stops that request. Such a connection, and one that
carried a stream (llama-server closes those after the stream), never goes back to the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from lemonade.util.tcp_keepalive import REMOTE, keep_alive

# Idle connections are dropped before the engine's own idle close (llama-server: 5 s), so a kept
# connection is rarely one the engine is closing just as we write to it (and that case is retried).
IDLE_S = 2.0
CONNECT_TIMEOUT_S = 10.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# A relayed stream stops reading from the engine while this much is waiting for a slow client.
STREAM_BUFFER = 256 * 1024


class EngineConnectionError(ConnectionError):
    """The engine closed the connection, or answered something that is not HTTP."""


class _Connection(asyncio.Protocol):
    """One connection, one exchange at a time: `begin` sends a request and returns the answer's
    status once its headers are in; `next_chunk` returns the body's pieces, then None."""

    def __init__(self) -> None:
        # The loop, looked up once: Python 3.11 asks the kernel for its pid on every lookup (a
        # `getpid` system call per relayed token otherwise).
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser: httptools.HttpResponseParser | None = None
        self._head: asyncio.Future[int] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._done = False
        self._error: Exception | None = None
        self._received = False  # any byte of the current answer
        self._close_after = False
        self._framed = False  # the answer says its length (Content-Length or chunked)

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._received = True
        if self._parser is None:  # nothing asked: the engine should not be talking
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(EngineConnectionError("the engine answered with a protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(EngineConnectionError(f"the engine's answer is not valid HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._parser is None or self._done:
            return
        if self._head is not None and self._head.done() and not self._framed:
            self.on_message_complete()  # an answer without a length ends where the connection does
        else:
            self._fail(EngineConnectionError(
                "the engine closed the connection before it answered" if not self._received
                else "the engine closed the connection in the middle of its answer"))

    # --- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname in (b"content-length", b"transfer-encoding"):
            self._framed = True
        elif lname == b"connection" and value.lower() == b"close":
            self._close_after = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None and self._head is not None
        if not self._head.done():
            self._head.set_result(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > STREAM_BUFFER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._parser is not None and not self._parser.should_keep_alive():
            self._close_after = True
        self._done = True
        self._wake()

    # --- ours
    async def begin(self, head: bytes, body: bytes | None) -> int:
        assert self.transport is not None
        self._head = self._loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._chunks.clear()
        self._buffered = 0
        self._done = self._received = self._close_after = self._framed = False
        self._error = None
        self.transport.write(head + body if body else head)
        return await self._head

    async def next_chunk(self) -> bytes | None:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < STREAM_BUFFER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def read_all(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    @property
    def reusable(self) -> bool:
        return not self.closed and not self._close_after and self._done

    @property
    def untouched(self) -> bool:
        """Nothing of the answer arrived: the engine did not take the request."""
        return not self._received

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        self._wake()
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class EngineStream:
    """An engine's streamed answer: `status`, then the body chunk by chunk. Closing it (or leaving
    the iteration early) closes the connection, which stops the engine's work on it."""

    def __init__(self, conn: _Connection, status: int) -> None:
        self.status = status
        self._conn = conn

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self._conn.next_chunk()) is not None:
                yield chunk
        finally:
            self.close()

    async def read(self) -> bytes:
        try:
            return await self._conn.read_all()
        finally:
            self.close()

    def close(self) -> None:
        self._conn.close()


class EngineClient:
    """Kept-alive connections per engine address; one request per connection at a time."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._addresses: dict[str, tuple[str, int, str]] = {}
        self._closed = False

    def _address(self, base_url: str) -> tuple[str, int, str]:
        """(host, port, Host header) of an `http://host:port` base URL, parsed once."""
        found = self._addresses.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname or not parts.port:
                raise ValueError(f"not an http://host:port engine address: {base_url}")
            found = self._addresses[base_url] = (parts.hostname, parts.port, parts.netloc)
        return found

    async def request(self, method: str, base_url: str, path: str, body: bytes | None = None,
                      content_type: str = "application/json", headers: dict[str, str] | None = None,
                      connect_timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, bytes]:
        """(status, body) of one request to the engine at `base_url`, over a kept connection;
        `headers`: more header lines (never Host, Content-Type or Content-Length)."""
        host, port, conn, status = await self._begin(method, base_url, path, body, content_type, headers,
                                                     connect_timeout)
        try:
            content = await conn.read_all()
        except BaseException:
            conn.close()  # cancelled (the client left) or failed: the engine sees the close and stops
            raise
        if self._closed or not conn.reusable:
            conn.close()
        else:
            conn.idle_since = time.monotonic()
            self._idle.setdefault((host, port), deque()).append(conn)
        return status, content

    async def stream(self, base_url: str, path: str, body: bytes, headers: dict[str, str] | None = None,
                     connect_timeout: float = CONNECT_TIMEOUT_S) -> EngineStream:
        """A POST whose answer is relayed as it comes; the caller closes the stream."""
        *_, conn, status = await self._begin("POST", base_url, path, body, "application/json", headers,
                                             connect_timeout)
        return EngineStream(conn, status)

    async def _begin(self, method: str, base_url: str, path: str, body: bytes | None, content_type: str,
                     headers: dict[str, str] | None, connect_timeout: float) -> tuple[str, int, _Connection, int]:
        host, port, netloc = self._address(base_url)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {netloc}\r\nContent-Type: {content_type}\r\n{extra}"
                f"Content-Length: {len(body) if body else 0}\r\n\r\n").encode("latin-1")
        conn, reused = self._kept(host, port)
        try:
            if conn is None:
                conn = await self._connect(host, port, connect_timeout)
            try:
                return host, port, conn, await conn.begin(head, body)
            except EngineConnectionError:
                if not (reused and conn.untouched):
                    raise
                # The engine dropped the kept connection as we wrote to it: it did not take the
                # request, so asking again on a new connection cannot run it twice.
                conn.close()
                conn = await self._connect(host, port, connect_timeout)
                return host, port, conn, await conn.begin(head, body)
        except BaseException:
            if conn is not None:
                conn.close()
            raise

    def _kept(self, host: str, port: int) -> tuple[_Connection | None, bool]:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable and now - conn.idle_since < IDLE_S:
                return conn, True
            conn.close()
        return None, False

    async def _connect(self, host: str, port: int, timeout: float) -> _Connection:
        if self._closed:
            raise EngineConnectionError("the server is shutting down")
        loop = asyncio.get_running_loop()
        transport, conn = await asyncio.wait_for(loop.create_connection(_Connection, host, port), timeout)
        if host not in LOOPBACK:  # a peer on the LAN: a host gone silent ends the request (util/tcp_keepalive.py)
            keep_alive(transport.get_extra_info("socket"), *REMOTE)
        return conn

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
