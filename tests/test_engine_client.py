"""The lean engine client (runtime/engine_client.py) against HTTP peers on loopback that answer the
ways an engine may: kept alive or not, with a length, chunked, or up to the close, dropping a kept
connection, breaking off, or not speaking HTTP at all. The real llama-server case (one kept
connection for many requests) is in test_serving.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from lemonade.runtime.engine_client import STREAM_BUFFER, EngineClient, EngineConnectionError

Handler = Callable[[int, int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class Peer:
    """A loopback server: `handler(connection no., request no. on it, reader, writer)` answers one
    request and says whether to keep the connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, n = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                self.requests.append(head + await reader.readexactly(length))
                n += 1
                if not await self.handler(number, n, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


def answer(body: bytes, *headers: str) -> bytes:
    head = "".join(h + "\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{head}\r\n".encode() + body


async def keep_alive(_c: int, n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
    body = b'{"n": %d}' % n
    w.write(answer(body, f"Content-Length: {len(body)}"))
    await w.drain()
    return True


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_requests_share_one_kept_connection_and_send_their_body():
    async def go() -> None:
        peer = Peer(keep_alive)
        async with peer as url:
            client = EngineClient()
            for n in (1, 2, 3):
                assert await client.request("POST", url, "/v1/chat", b'{"x": 1}') == (200, b'{"n": %d}' % n)
            assert peer.connections == 1
            first = peer.requests[0]
            assert first.startswith(b"POST /v1/chat HTTP/1.1\r\n") and first.endswith(b'\r\n\r\n{"x": 1}')
            assert b"Content-Length: 8" in first and b"Content-Type: application/json" in first
            assert await client.request("GET", url, "/health") == (200, b'{"n": 4}')
            assert peer.requests[-1].endswith(b"Content-Length: 0\r\n\r\n")
            await client.aclose()
    run(go())


def test_connection_close_chunked_and_unframed_answers():
    async def handler(c: int, n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if c == 1:  # says it closes
            w.write(answer(b"{}", "Content-Length: 2", "Connection: close"))
        elif n == 1:  # chunked, kept
            w.write(answer(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "Transfer-Encoding: chunked"))
            await w.drain()
            return True
        else:  # no length: the answer ends with the connection
            w.write(answer(b'{"till": "close"}'))
        await w.drain()
        return False

    async def go() -> None:
        peer = Peer(handler)
        async with peer as url:
            client = EngineClient()
            assert await client.request("POST", url, "/a", b"{}") == (200, b"{}")
            assert await client.request("POST", url, "/a", b"{}") == (200, b"abcde")
            assert peer.connections == 2  # a new one after "Connection: close"
            # the chunked answer's connection was kept; this answer without a length ends at its close
            assert await client.request("POST", url, "/a", b"{}") == (200, b'{"till": "close"}')
            assert peer.connections == 2
            assert await client.request("POST", url, "/a", b"{}") == (200, b"abcde")
            assert peer.connections == 3
            await client.aclose()
    run(go())


def test_a_kept_connection_the_engine_dropped_unanswered_is_retried_once_on_a_new_one():
    async def handler(c: int, n: int, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if c == 1 and n == 2:
            return False  # the engine closes the kept connection without answering
        return await keep_alive(c, n, r, w)

    async def go() -> None:
        peer = Peer(handler)
        async with peer as url:
            client = EngineClient()
            assert await client.request("POST", url, "/a", b"{}") == (200, b'{"n": 1}')
            assert await client.request("POST", url, "/a", b"{}") == (200, b'{"n": 1}')  # on connection 2
            assert peer.connections == 2 and len(peer.requests) == 3
            await client.aclose()
    run(go())


def test_a_fresh_connection_closed_without_answer_or_mid_answer_is_an_error_not_a_retry():
    async def handler(c: int, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if c == 2:
            w.write(answer(b'{"cut', "Content-Length: 100"))
            await w.drain()
        return False

    async def go() -> None:
        peer = Peer(handler)
        async with peer as url:
            client = EngineClient()
            with pytest.raises(EngineConnectionError, match="before it answered"):
                await client.request("POST", url, "/a", b"{}")
            with pytest.raises(EngineConnectionError, match="middle of its answer"):
                await client.request("POST", url, "/a", b"{}")
            assert len(peer.requests) == 2
            await client.aclose()
    run(go())


def test_an_answer_that_is_not_http_is_an_error():
    async def handler(_c: int, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await w.drain()
        await asyncio.sleep(1)
        return False

    async def go() -> None:
        async with Peer(handler) as url:
            client = EngineClient()
            with pytest.raises(EngineConnectionError, match="not valid HTTP"):
                await client.request("POST", url, "/a", b"{}")
    run(go())


def test_cancelling_a_request_closes_its_connection():
    """What stops llama-server when our client hangs up: the engine sees its connection close."""
    async def never(_c: int, _n: int, r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> bool:
        await r.read(1)  # returns at the client's close
        raise ConnectionError("closed by the client")

    async def go() -> None:
        peer = Peer(never)
        async with peer as url:
            client = EngineClient()
            task = asyncio.create_task(client.request("POST", url, "/a", b"{}"))
            while not peer.requests:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(peer.closed_by_client.wait(), 5)
            assert not client._idle.get(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    run(go())


def test_nothing_listening_is_a_connection_error():
    async def go() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(OSError):
            await EngineClient().request("POST", f"http://127.0.0.1:{port}", "/a", b"{}")
    run(go())


async def chunked(pieces: list[bytes], w: asyncio.StreamWriter, pause: float = 0.0) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in pieces:
        w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await w.drain()
        await asyncio.sleep(pause)
    w.write(b"0\r\n\r\n")
    await w.drain()


def test_a_stream_is_relayed_piece_by_piece_as_the_engine_writes_it():
    events = [b"data: {\"n\": %d}\n\n" % i for i in range(5)] + [b"data: [DONE]\n\n"]

    async def handler(_c: int, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        await chunked(events, w, pause=0.05)
        return False

    async def go() -> None:
        async with Peer(handler) as url:
            client = EngineClient()
            stream = await client.stream(url, "/v1/chat/completions", b'{"stream": true}')
            assert stream.status == 200
            got, times = [], []
            async for piece in stream:
                got.append(piece)
                times.append(time.monotonic())
            assert got == events  # one piece per write: nothing held back or merged
            assert times[-1] - times[0] > 0.2
            assert not client._idle  # a stream's connection is never kept
    run(go())


def test_leaving_a_stream_early_closes_its_connection_and_a_slow_reader_holds_the_engine_back():
    big = [b"x" * 65536] * 1024  # 64 MB: more than the sockets between us hold

    async def handler(_c: int, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        await chunked(big, w)
        return False

    async def go() -> None:
        peer = Peer(handler)
        async with peer as url:
            stream = await EngineClient().stream(url, "/a", b"{}")
            total, most = 0, 0
            async for piece in stream:
                total += len(piece)
                most = max(most, stream._conn._buffered)
                await asyncio.sleep(0.002)  # a slow client
                if total >= 3 * 1024 * 1024:
                    break
            stream.close()  # what the relay's `finally` does when its client leaves
            # reading paused while the slow reader had STREAM_BUFFER waiting (plus one socket read)
            assert most <= STREAM_BUFFER + 256 * 1024
            await asyncio.wait_for(peer.closed_by_client.wait(), 5)  # the engine sees the close

    run(go())


def test_an_error_status_is_read_whole_from_a_stream():
    async def handler(_c: int, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        body = b'{"error": {"code": 400, "message": "the prompt is too long"}}'
        w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()
        return True

    async def go() -> None:
        async with Peer(handler) as url:
            stream = await EngineClient().stream(url, "/a", b"{}")
            assert stream.status == 400 and b"too long" in await stream.read()
    run(go())
