"""`/spans/stream` (also `/traces/stream`): inference spans, live, over a WebSocket.

Each finished inference span (observability/spans.py; the OTLP/JSON span object) is sent to the
listeners allowed to see it, whether or not `telemetry.enabled` exports it anywhere:

- the admin key (`LEMONADE_ADMIN_API_KEY`, else `LEMONADE_API_KEY`) sees every span;
- a key sees the spans of requests made with that same key;
- on a server without an API key, requests made without a key are guests' spans, and a listener
  sees them only for its own client session (`client_session_id` in the URL or the auth message,
  matched against the request's `X-Client-Session-Id` header).

The connection may open without credentials (a browser page cannot set headers); it then receives
nothing and is told to authenticate until it sends `{"type": "auth", "token": KEY}` (or `api_key`),
answered `{"type": "auth.ok"}`. A key in the URL, the Authorization header or a subprotocol
(api/middleware.py) authenticates at the handshake, where a wrong one is refused. The hash of the
request's key that routes a span is never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from lemonade.api.middleware import chosen_subprotocol, key_matches, presented_key
from lemonade.observability.spans import client_session_of, hash_token, public, token_hash_of
from lemonade.services import Services
from lemonade.util import jsonparse

log = logging.getLogger("lemonade.server")
router = APIRouter(tags=["telemetry"])
QUEUED_SPANS = 1000  # per listener; a listener that reads slower than this loses the oldest news, not the server


class SpanWatcher:
    """One `/spans/stream` connection: who it is, and which spans it may see."""

    def __init__(self, svc: Services, key: str | None, client_session: str) -> None:
        self.svc = svc
        self.client_session = client_session
        self.token = ""
        self.authenticated = False
        self.admin = False
        self._hash = ""
        if svc.api_key is None or key is not None:  # (a wrong key never got past the handshake)
            self.accept(key or "")

    def valid(self, token: str) -> bool:
        return self.svc.api_key is None or key_matches(token, self.svc.api_key, self.svc.admin_key)

    def accept(self, token: str) -> None:
        self.token, self.authenticated = token, True
        self._hash = hash_token(token)
        admin = self.svc.admin_key or self.svc.api_key
        self.admin = bool(admin) and key_matches(token, admin)

    def may_see(self, span: dict[str, Any]) -> bool:
        if not self.authenticated:
            return False
        if self.admin:
            return True
        target = token_hash_of(span)
        if target and target == self._hash:
            return True
        if target or self.svc.api_key is not None:
            return False
        return bool(self.client_session) and self.client_session == client_session_of(span)


def _error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"message": message, "type": "invalid_request_error"}}


async def spans_stream(ws: WebSocket) -> None:
    svc: Services = ws.app.state.services
    await ws.accept(subprotocol=chosen_subprotocol(ws.scope))
    watcher = SpanWatcher(svc, presented_key(ws.scope), ws.query_params.get("client_session_id", ""))
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUED_SPANS)

    def listener(span: dict[str, Any]) -> None:
        if watcher.may_see(span):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(public(span))

    remove = svc.telemetry.listen(listener) if watcher.authenticated else None
    sender = asyncio.create_task(_send(ws, queue))
    try:
        while True:
            text = await ws.receive_text()
            try:
                msg: Any = jsonparse.loads(text)
            except ValueError as exc:
                await ws.send_json(_error(f"Invalid JSON: {exc}"))
                continue
            kind = msg.get("type") if isinstance(msg, dict) else None
            if kind == "auth":
                token = str(msg.get("token") or msg.get("api_key") or "")
                token = token[7:] if token.startswith("Bearer ") else token
                if not watcher.valid(token):
                    await ws.send_json(_error("Invalid API key"))
                    continue
                watcher.accept(token)
                if isinstance(msg.get("client_session_id"), str):
                    watcher.client_session = msg["client_session_id"]
                if remove is None:
                    remove = svc.telemetry.listen(listener)
                await ws.send_json({"type": "auth.ok"})
            elif not watcher.authenticated:
                await ws.send_json(_error("Unauthorized. Please authenticate first by sending an auth message."))
            else:
                await ws.send_json(_error(f"Unknown message type: {kind}"))
    except WebSocketDisconnect:
        pass
    finally:
        if remove is not None:
            remove()
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender


async def _send(ws: WebSocket, queue: asyncio.Queue[dict[str, Any]]) -> None:
    while True:
        await ws.send_json(await queue.get())


for _path in ("/spans/stream", "/traces/stream"):
    router.add_api_websocket_route(_path, spans_stream)
