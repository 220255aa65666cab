"""HTTP through aiohttp: to remote engines (cloud providers, peers), and uploads streamed from a file to a local engine.

Everything else goes to local engines over `engine_client.py`. Two reasons for a module of its own:
aiohttp takes a quarter of a second to import, which a server that never talks to a cloud engine
should not pay at each start (it is imported on first use); and its errors leave here as the engine
client's `EngineConnectionError` (an `OSError`), so the proxy catches one family whichever client
carried a request. The original error is the `__cause__`, for messages that name it.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from lemonade.runtime.engine_client import EngineConnectionError
from lemonade.util.tcp_keepalive import REMOTE, keep_alive

if TYPE_CHECKING:
    import aiohttp

CONNECT_TIMEOUT = 10.0
KEEPALIVE_S = 2.0  # below llama-server's 5 s idle close


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's socket factory: a TCP socket with quick keep-alive probes (util/tcp_keepalive.py
    REMOTE), so a service whose machine vanished mid-answer does not hold its request for hours."""
    sock = socket.socket(family=addr_info[0], type=addr_info[1], proto=addr_info[2])
    keep_alive(sock, *REMOTE)
    return sock


class RemoteHttp:
    """One aiohttp session, created on first use inside the server's event loop. `read_timeout`:
    seconds a remote service may stay silent (before its answer starts, or between two pieces of
    it) before the request fails (`global_timeout`); None waits as long as it takes."""

    def __init__(self, read_timeout: Callable[[], float] | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._read_timeout = read_timeout

    def _timeout(self, connect: float) -> aiohttp.ClientTimeout:
        import aiohttp

        return aiohttp.ClientTimeout(total=None, connect=connect,
                                     sock_read=self._read_timeout() if self._read_timeout else None)

    def session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE_S,
                                               socket_factory=keepalive_socket),
                timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT), auto_decompress=False)
        return self._session

    async def request(self, method: str, url: str, data: bytes | AsyncIterable[bytes] | None,
                      headers: dict[str, str], connect_timeout: float = CONNECT_TIMEOUT) -> tuple[int, bytes]:
        """One round trip: (status, body)."""
        import aiohttp

        try:
            async with self.session().request(method, url, data=data, headers=headers,
                                              timeout=self._timeout(connect_timeout)) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            raise _connection_error(exc) from exc

    async def stream(self, url: str, data: bytes, headers: dict[str, str],
                     connect_timeout: float = CONNECT_TIMEOUT) -> RemoteStream:
        """A POST whose answer is read as it comes, like the engine client's `EngineStream`."""
        import aiohttp

        try:
            return RemoteStream(await self.session().post(url, data=data, headers=headers,
                                                          timeout=self._timeout(connect_timeout)))
        except aiohttp.ClientError as exc:
            raise _connection_error(exc) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class RemoteStream:
    """A streamed aiohttp answer, read the way an `EngineStream` is."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.status = resp.status
        self._resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        import aiohttp

        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise _connection_error(exc) from exc

    async def read(self) -> bytes:
        import aiohttp

        try:
            return await self._resp.read()
        except aiohttp.ClientError as exc:
            raise _connection_error(exc) from exc
        finally:
            self._resp.close()

    def close(self) -> None:
        self._resp.close()


def _connection_error(exc: Any) -> EngineConnectionError:
    return EngineConnectionError(str(exc) or type(exc).__name__)
