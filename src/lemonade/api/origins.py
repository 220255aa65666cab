"""Which web pages may talk to the server, and under which host names it answers.

Lemonade's origin policy (guide-configuration-README.md, "Allowed Origins"): requests without an
`Origin` header (curl, SDKs, the CLI) are not browsers and pass. A browser page may call the
server when its origin is a loopback one (`localhost`, `127.0.0.1`, `[::1]`, `*.localhost`, any
port), a desktop app's own scheme (`app://`, `vscode-webview://`, `file://`, ...), the server
itself, or listed in `LEMONADE_ALLOWED_ORIGINS` (`*` allows every origin, with a warning). The
opaque `null` origin (sandboxed iframes) only when listed. Every other origin gets 403, on API
calls, preflights and WebSockets alike (no cross-site WebSocket hijacking).

The `Host` header is checked too, against DNS rebinding: a page on `evil.example` whose name is
re-pointed at 127.0.0.1 is "same origin" for the browser, but it sends `Host: evil.example`. The
server answers to IP addresses, `localhost` names, this machine's host name and the hosts of the
allowed origins.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from lemonade.api.errors import error_body, error_family

log = logging.getLogger("lemonade.server")
Scope = MutableMapping[str, Any]  # as Starlette's

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WEB_SCHEMES = ("http", "https")
PREFLIGHT_MAX_AGE = "600"
HOST_VERDICTS_KEPT = 256


def _split_host(host: str) -> str:
    """`example.com:8080` -> `example.com`; `[::1]:13305` -> `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def is_loopback_name(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OriginPolicy:
    def __init__(self, allowed: str | None) -> None:
        entries = [e.strip().rstrip("/") for e in (allowed or "").split(",") if e.strip()]
        self.any_origin = "*" in entries
        self.listed = {e.lower() for e in entries if e != "*"}
        if self.any_origin:
            log.warning("LEMONADE_ALLOWED_ORIGINS=* lets every web site you visit call this server; set "
                        "LEMONADE_API_KEY unless this machine is isolated")
        for entry in self.listed:
            parts = urlsplit(entry)
            if parts.scheme == "http" and parts.hostname and not is_loopback_name(parts.hostname):
                log.warning("Allowed origin %s is plain HTTP on a remote host: prefer https://", entry)
        self.hosts = {p.hostname for p in map(urlsplit, self.listed) if p.hostname}
        machine = socket.gethostname().lower()  # (not getfqdn: a DNS lookup could stall the start offline)
        self.hosts |= {machine, machine + ".local"}
        self._host_verdicts: dict[str, bool] = {}  # Host header -> allowed; clients repeat the same one

    def host_allowed(self, host_header: str | None) -> bool:
        if self.any_origin or not host_header:
            return True  # HTTP/1.0 clients may send no Host; nothing a browser does
        verdict = self._host_verdicts.get(host_header)
        if verdict is None:
            host = _split_host(host_header)
            verdict = _is_ip(host) or is_loopback_name(host) or host in self.hosts
            if len(self._host_verdicts) < HOST_VERDICTS_KEPT:  # bounded: a client can send any Host
                self._host_verdicts[host_header] = verdict
        return verdict

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if self.any_origin or origin in self.listed:
            return True
        if origin == "null":
            return False
        parts = urlsplit(origin)
        if parts.scheme not in WEB_SCHEMES:
            return bool(parts.scheme)  # app://, vscode-webview://, file://, jan://: a desktop app's page
        if parts.hostname and is_loopback_name(parts.hostname):
            return True
        # The server's own pages (its web app opened by IP or host name) are same-origin.
        return bool(host_header and parts.netloc == host_header.strip().lower())


def refusal(policy: OriginPolicy, host: str | None, origin: str | None) -> str | None:
    """Why this Host/Origin pair is refused (the 403 message), or None when it may pass."""
    if not policy.host_allowed(host):
        return (f"Host '{host}' is not a name this server answers to (protection against DNS rebinding). Connect "
                "by IP address or localhost, or add the web page's origin to LEMONADE_ALLOWED_ORIGINS.")
    if origin is not None and not policy.origin_allowed(origin, host):
        return (f"Origin '{origin}' is not allowed to use this server. Pages on localhost and desktop apps are; "
                "add other origins to LEMONADE_ALLOWED_ORIGINS (comma-separated) when you trust them.")
    return None


VARY_ORIGIN = (b"vary", b"Origin")  # on every answer: it depends on the Origin (caches must not mix pages)


def with_vary(message: Mapping[str, Any]) -> dict[str, Any]:
    """A response start that says its answer depends on the Origin header."""
    headers = list(message.get("headers", []))
    if not any(k.lower() == b"vary" for k, _ in headers):
        headers.append(VARY_ORIGIN)
    return {**message, "headers": headers}


def with_cors(message: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """A response start for an allowed page: its CORS headers (any the app set are replaced)."""
    headers = [(k, v) for k, v in message.get("headers", [])
               if not k.lower().startswith(b"access-control-") and k.lower() != b"vary"]
    headers += [(b"access-control-allow-origin", origin.encode("latin-1")), VARY_ORIGIN,
                (b"access-control-expose-headers", b"*")]
    return {**message, "headers": headers}


async def preflight(send: Any, origin: str, requested_headers: str | None, private_network: bool = False) -> None:
    """204 to an allowed page's CORS preflight. A public page asking for a private-network server
    (Chrome's Private Network Access: `Access-Control-Request-Private-Network: true`) is told yes."""
    headers = [(b"access-control-allow-origin", origin.encode("latin-1")), VARY_ORIGIN,
               (b"access-control-allow-methods", b"GET, POST, PUT, PATCH, DELETE, OPTIONS, HEAD"),
               (b"access-control-allow-headers", (requested_headers or "*").encode("latin-1")),
               (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode())]
    if private_network:
        headers.append((b"access-control-allow-private-network", b"true"))
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def refuse(scope: Scope, receive: Any, send: Any, message: str) -> None:
    """403 (a WebSocket handshake is closed, which browsers see as 403: no cross-site hijacking)."""
    log.warning("Refused %s %s: %s", scope.get("method", "WEBSOCKET"), scope.get("path"), message)
    if scope["type"] == "websocket":
        await receive()  # websocket.connect; closing before accept answers the handshake with 403
        await send({"type": "websocket.close", "code": 1008, "reason": "origin not allowed"})
        return
    body = json.dumps(error_body(error_family(scope.get("path", "")), 403, message, "forbidden",
                                 "origin_not_allowed")).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), VARY_ORIGIN]})
    await send({"type": "http.response.body", "body": body})
