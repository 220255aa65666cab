"""Our one ASGI layer: every per-request rule of ours, in one pass over the headers.

In order: the Host/Origin policy (403; an allowed page's preflight gets its 204 and its responses
their CORS headers, a 401 included; every answer says `Vary: Origin`), the API key (401; a request
another server of the LAN forwarded carries a peer session instead, `X-Lemonade-Peer`, which must be
one this server opened, backends/peer/auth.py, and marks the request `from_peer`), then for
HTTP: an inference request's span while tracing is on (observability/spans.py), metrics (status and
time, to the end of the response body), the body size limit (413), JSON as the default content type,
and for POSTs the disconnect watch that sets the request's `client_gone`.

Why one layer: these were six middlewares, each scanning the headers and adding a call frame to
every request and, for those that wrap `send`, to every streamed chunk. One layer reads the headers
it needs once and wraps `send` and `receive` at most once each (issue 17, docs/performance.md).
The rules themselves live where they did: api/origins.py, api/middleware.py, api/disconnect.py.
Plain ASGI (not BaseHTTPMiddleware), so streamed responses pass through untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any

from lemonade.api.disconnect import DisconnectWatch
from lemonade.api.errors import error_response
from lemonade.api.middleware import (
    ASGIApp,
    BodySizeLimit,
    Scope,
    auth_refusal,
    refuse_unauthorized,
    route_family,
    with_default_json,
)
from lemonade.api.origins import OriginPolicy, preflight, refusal, refuse, with_cors, with_vary
from lemonade.observability.telemetry import Telemetry
from lemonade.route_table import route_of
from lemonade.runtime.request_context import client_gone, from_peer, request_trace
from lemonade.util import jsonparse

ERROR_BODY_KEPT = 65536  # of an error answer, for the span's status message

PEER_HEADER = b"x-lemonade-peer"
WANTED = frozenset({b"host", b"origin", b"content-type", b"content-length", b"access-control-request-method",
                    b"access-control-request-headers", b"access-control-request-private-network", PEER_HEADER})
PEER_REFUSAL = ("This server has no such peer session: forwarded requests are taken only from servers that proved "
                "they hold the same LEMONADE_PEER_KEY (the session may also have expired, or this server restarted)")


def wanted_headers(scope: Scope) -> dict[bytes, str]:
    """The headers the rules read, first occurrence of each, in one pass."""
    found: dict[bytes, str] = {}
    for key, value in scope.get("headers", ()):
        if key in WANTED and key not in found:
            found[key] = value.decode("latin-1")
    return found


class RequestGuard:
    def __init__(self, app: ASGIApp, *, policy: OriginPolicy, api_key: str | None, admin_key: str | None,
                 body_limit: BodySizeLimit, observe: Callable[[str, str, int, float], None],
                 telemetry: Telemetry | None = None, peer_admits: Callable[[str], bool] = lambda token: False) -> None:
        self.app = app
        self.peer_admits = peer_admits  # a peer session this server opened (backends/peer/auth.py PeerGate)
        self.telemetry = telemetry  # traces only while its `enabled` flag is up (one check per request)
        self.policy = policy
        self.api_key = api_key or None
        self.admin_key = admin_key or None
        self.body_limit = body_limit
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        headers = wanted_headers(scope)
        origin = headers.get(b"origin")
        why = refusal(self.policy, headers.get(b"host"), origin)
        if why is not None:
            await refuse(scope, receive, send, why)
            return
        http = kind == "http"
        if origin is not None and http and scope.get("method") == "OPTIONS" \
                and headers.get(b"access-control-request-method"):
            await preflight(send, origin, headers.get(b"access-control-request-headers"),
                            headers.get(b"access-control-request-private-network", "").lower() == "true")
            return
        peer = headers.get(PEER_HEADER)
        if peer is not None and not scope["path"].startswith("/internal"):
            if not self.peer_admits(peer):
                await refuse_unauthorized(scope, receive, self._cors(send, origin) if http else send, PEER_REFUSAL)
                return
            token = from_peer.set(True)
            try:
                await self._admitted(scope, receive, send, headers, origin, http)
            finally:
                from_peer.reset(token)
            return
        why = auth_refusal(scope, self.api_key, self.admin_key)
        if why is not None:
            await refuse_unauthorized(scope, receive, self._cors(send, origin) if http else send, why)
            return
        await self._admitted(scope, receive, send, headers, origin, http)

    async def _admitted(self, scope: Scope, receive: Any, send: Any, headers: dict[bytes, str], origin: str | None,
                        http: bool) -> None:
        if not http:
            await self.app(scope, receive, send)
            return
        if self.telemetry is not None and self.telemetry.active and scope.get("method") == "POST":
            route = route_of(scope["path"])
            if route is not None and route.span is not None:
                await self._traced(scope, receive, send, headers, origin, route.span)
                return
        await self._http(scope, receive, send, headers, origin)

    async def _traced(self, scope: Scope, receive: Any, send: Any, headers: dict[bytes, str],
                      origin: str | None, kind_and_name: tuple[str, str]) -> None:
        """`_http` as one inference span (observability/spans.py): it keeps the request body it
        passes on, and an error answer's body. The span is finished as the response's last message
        leaves, before the client can read it: a client that has its answer may flush the exporter
        (`/internal/telemetry/flush`) and find the span sent. A response that
        never completes (an error, a client gone) finishes it on the way out."""
        assert self.telemetry is not None
        telemetry = self.telemetry
        all_headers: dict[str, str] = {}
        for key, value in scope.get("headers", ()):
            all_headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        span = telemetry.start(*kind_and_name, all_headers)
        body: list[bytes] = []
        answer: list[bytes] = []
        status = 500
        finished = False

        def finish() -> None:
            nonlocal finished
            if not finished:
                finished = True
                span.body = json_object_or_none(b"".join(body))
                if status >= 400:
                    span.fail(error_message(b"".join(answer)) or f"HTTP {status}")
                telemetry.finish(span)

        async def receive_body() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                if status >= 400 and sum(map(len, answer)) < ERROR_BODY_KEPT:
                    answer.append(message.get("body", b""))
                if not message.get("more_body", False):
                    finish()
            await send(message)

        token = request_trace.set(span)
        try:
            await self._http(scope, receive_body, send_status, headers, origin)
        except BaseException as exc:
            if not finished:
                span.fail(str(exc) or type(exc).__name__)
            raise
        finally:
            request_trace.reset(token)
            finish()

    @staticmethod
    def _cors(send: Any, origin: str | None) -> Any:
        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = with_vary(message) if origin is None else with_cors(message, origin)
            await send(message)

        return send_with_cors

    async def _http(self, scope: Scope, receive: Any, send: Any, headers: dict[bytes, str],
                    origin: str | None) -> None:
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = with_vary(message) if origin is None else with_cors(message, origin)
            await send(message)

        try:
            if self.body_limit.declared_too_large(headers.get(b"content-length")):
                response = error_response(scope["path"], self.body_limit.error(), headers={"Connection": "close"})
                await response(scope, receive, send_wrapper)
                return
            scope = with_default_json(scope, origin, headers.get(b"content-type"))
            counted = self.body_limit.counting(receive)
            if scope.get("method") != "POST":
                await self.app(scope, counted, send_wrapper)
                return
            watch = DisconnectWatch(counted)
            token = client_gone.set(watch.gone)
            try:
                await self.app(scope, watch.receive, send_wrapper)
            finally:
                client_gone.reset(token)
                watch.close()
        finally:
            self.observe(route_family(scope["path"]), scope.get("method", ""), status, time.perf_counter() - start)


def json_object_or_none(raw: bytes) -> dict[str, Any] | None:
    try:
        value = jsonparse.loads(raw) if raw.strip() else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def error_message(raw: bytes) -> str:
    """The message of an error answer in any family's shape (OpenAI, Ollama, Anthropic)."""
    body = json_object_or_none(raw)
    if body is None:
        return raw.decode(errors="replace").strip()[:1000]
    err = body.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or "")
    return str(err or body.get("message") or body.get("detail") or "")
