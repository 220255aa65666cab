"""The per-request rules of our ASGI layer (api/guard.py runs them all in one pass): API keys,
the body size limit, JSON as the default content type, metrics labels, header helpers."""

from __future__ import annotations

import base64
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException

from lemonade.api.errors import APIError, error_body, error_family
from lemonade.config import Config
from lemonade.route_table import route_of, split

Scope = MutableMapping[str, Any]  # as Starlette's
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


# Browsers cannot set headers on a WebSocket, so they send a key as a subprotocol: OpenAI's clients as
# `openai-insecure-api-key.<KEY>`, Lemonade's app as `bearer.<base64url(KEY), no padding>` beside its
# application protocol `lemonade-realtime` (which the server then selects).
KEY_SUBPROTOCOL = "openai-insecure-api-key."
CREDENTIAL_SUBPROTOCOL = "bearer."
APP_SUBPROTOCOL = "lemonade-realtime"
KEY_CARRIERS = (KEY_SUBPROTOCOL, CREDENTIAL_SUBPROTOCOL)


def subprotocols(scope: Scope) -> list[str]:
    return [p.strip() for p in (header(scope, b"sec-websocket-protocol") or "").split(",") if p.strip()]


def _credential(encoded: str) -> str:
    """The key in a `bearer.` subprotocol; text that matches no key when it is not base64url."""
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return CREDENTIAL_SUBPROTOCOL + encoded


def presented_key(scope: Scope) -> str | None:
    """The key a client sent: `Authorization: Bearer`, Anthropic's `x-api-key`, or on a WebSocket
    `?api_key=` or a key-carrying subprotocol (`openai-insecure-api-key.<KEY>`, `bearer.<base64url>`)."""
    auth = header(scope, b"authorization")
    if auth and auth.lower().startswith("bearer "):
        return auth[7:].strip()
    api_key = header(scope, b"x-api-key")
    if api_key:
        return api_key.strip()
    if scope["type"] == "websocket":
        query = parse_qs(scope.get("query_string", b"").decode())
        if "api_key" in query:
            return query["api_key"][0]
        for proto in subprotocols(scope):
            if proto.startswith(KEY_SUBPROTOCOL):
                return proto[len(KEY_SUBPROTOCOL):]
            if proto.startswith(CREDENTIAL_SUBPROTOCOL):
                return _credential(proto[len(CREDENTIAL_SUBPROTOCOL):])
    return None


def chosen_subprotocol(scope: Scope) -> str | None:
    """The subprotocol to accept a WebSocket with: a browser that offered some fails the handshake
    when none is chosen. `lemonade-realtime` when offered, else the first one that carries no key,
    else the key carrier itself (never echoing a key the client did not have to see again)."""
    offered = subprotocols(scope)
    if APP_SUBPROTOCOL in offered:
        return APP_SUBPROTOCOL
    plain = [p for p in offered if not p.startswith(KEY_CARRIERS)]
    return next(iter(plain or offered), None)


def key_matches(given: str | None, *keys: str | None) -> bool:
    """Whether `given` is one of `keys` (compared in constant time)."""
    return given is not None and any(k and hmac.compare_digest(given.encode(), k.encode()) for k in keys)


def is_admin(scope: Scope, api_key: str | None, admin_key: str | None) -> bool:
    """Whether the client may use `/internal/*` (and so may see filesystem paths): the admin key,
    or the API key when no admin key is set, or anyone when the server has no key at all."""
    required = admin_key or api_key
    return required is None or key_matches(presented_key(scope), required)


def auth_refusal(scope: Scope, api_key: str | None, admin_key: str | None) -> str | None:
    """Why the request may not pass the API-key check (the 401 message), or None when it may.

    `LEMONADE_API_KEY` guards API routes, `LEMONADE_ADMIN_API_KEY` guards `/internal/*`; the admin
    key is accepted wherever the API key is; `/metrics` accepts either key and is open when no API
    key is set (lemonade.md, GET /metrics). Routes the table marks `open` need no key.
    """
    path: str = scope.get("path", "")
    if scope["type"] == "http" and scope.get("method") == "OPTIONS":
        return None  # CORS preflight carries no credentials
    route = route_of(path)
    if route is not None and route.open:
        return None
    if path.startswith("/internal"):
        if is_admin(scope, api_key, admin_key):
            return None
    elif api_key is None or key_matches(presented_key(scope), api_key, admin_key):
        return None
    elif scope["type"] == "websocket" and presented_key(scope) is None and route is not None \
            and route.auth_in_messages:
        return None  # connects anonymously and sends {"type": "auth"} (api/lemonade/spans.py); a wrong key is refused
    return ("Invalid or missing API key. Send it as 'Authorization: Bearer <key>'"
            + (" (the admin key for /internal routes)." if path.startswith("/internal") else "."))


async def refuse_unauthorized(scope: Scope, receive: Any, send: Any, message: str) -> None:
    if scope["type"] == "websocket":
        await receive()  # the websocket.connect event
        await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
        return
    body = json.dumps(error_body(error_family(scope["path"]), 401, message, "authentication_error",
                                 "invalid_api_key")).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})


def route_family(path: str) -> str:
    """The `family` label of an HTTP request's metrics: its route's (route_table.py), a bounded set.
    A path no HTTP route serves (a 404) counts as `internal` under /internal, Ollama's under /api/,
    else Lemonade's."""
    route = route_of(path)
    if route is not None and not route.websocket:
        return route.metrics_family
    if path.startswith("/internal"):
        return "internal"
    return "ollama" if split(path)[0] == "ollama" else "lemonade"


def with_default_json(scope: Scope, origin: str | None, content_type: str | None) -> Scope:
    """Treat a POST body without a JSON content type (e.g. `curl -d '{...}'`) as JSON, for clients
    that are not browsers.

    llama-server and Lemonade accept such requests, and the spec's curl examples rely on it;
    multipart uploads keep their own content type. Browsers (they send Origin) keep theirs: read
    as JSON, a cross-site "simple" text/plain POST would pass without a CORS preflight.
    """
    if scope.get("method") in ("POST", "PUT", "PATCH") and origin is None and (
            content_type is None or content_type.startswith(("application/x-www-form-urlencoded", "text/plain"))):
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        return dict(scope, headers=headers + [(b"content-type", b"application/json")])
    return scope


class BodySizeLimit:
    """413 for a request body over `max_request_body_mb`, before it is held in memory.

    Why: every JSON route reads its whole body, so without a cap one client can make the server
    allocate whatever it sends. A declared `Content-Length` over the limit is refused before any
    byte is read (`declared_too_large`); a chunked body is counted as it arrives and refused once
    it passes the limit (`counting`). The limit follows `/internal/set` without a restart.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.limit_mb = int(config.get("max_request_body_mb"))
        config.on_change(self._changed)

    def _changed(self, changed: dict[str, Any]) -> None:
        if "max_request_body_mb" in changed:  # the effective value: an env var or flag still wins
            self.limit_mb = int(self.config.get("max_request_body_mb"))

    def error(self) -> APIError:
        return APIError(413, f"Request body too large: the limit is {self.limit_mb} MB (config key "
                        "max_request_body_mb, env LEMONADE_MAX_REQUEST_BODY_MB)", code="request_too_large")

    def declared_too_large(self, content_length: str | None) -> bool:
        return content_length is not None and content_length.isdigit() \
            and int(content_length) > self.limit_mb * 1024 * 1024

    def counting(self, receive: Any) -> Callable[[], Awaitable[dict[str, Any]]]:
        limit = self.limit_mb * 1024 * 1024
        received = 0

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read, so the error handler answers in the route's shape
                    # (an HTTPException: FastAPI turns any other exception from the read into a 400).
                    raise HTTPException(413, self.error().message)
            return message

        return counted
