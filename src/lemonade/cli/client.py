"""The CLI's HTTP client: where the server is, how to authenticate, and friendly failures."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import typer
from rich.console import Console

from lemonade.cli.target import api_key
from lemonade.util.lazy import lazy_module

httpx = lazy_module("httpx")  # imported on first use (util/lazy.py)

console = Console()
err_console = Console(stderr=True)
DEFAULT_PORT = 13305
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")  # listen addresses, not addresses to connect to


def _refuse(what: str, value: str, example: str) -> typer.Exit:
    err_console.print(f"[red]Error:[/red] {what} must be {example} (got {value!r}). Fix or unset it.",
                      highlight=False, markup=True)
    return typer.Exit(2)


def _strip_api_prefix(url: str) -> str:
    for suffix in ("/api/v1", "/api/v0", "/v1", "/v0"):
        url = url.removesuffix(suffix)
    return url


def base_url(host: str | None = None, port: int | None = None) -> str:
    """`--host/--port`, else `LEMONADE_BASE_URL`, else `LEMONADE_HOST/PORT`, else localhost:13305.

    `LEMONADE_BASE_URL` may be http:// or https:// (a server behind a TLS proxy), with or without
    the API prefix. A host may be given as a URL too (`LEMONADE_HOST=http://127.0.0.1:8000`, as
    people paste it): its scheme is used, and its port unless `--port` names one. Anything else
    is refused here with the fix, not found out as a connect error."""
    if host is None and port is None and os.environ.get("LEMONADE_BASE_URL"):
        url = os.environ["LEMONADE_BASE_URL"].strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _refuse("LEMONADE_BASE_URL", url, f"a URL starting with http:// or https://, e.g. "
                                                    f"http://127.0.0.1:{DEFAULT_PORT}")
        return _strip_api_prefix(url)
    from_flag = host is not None
    host = (host or os.environ.get("LEMONADE_HOST") or "127.0.0.1").strip()
    scheme, url_port = "http", None
    if "://" in host:
        what = "--host" if from_flag else "LEMONADE_HOST"
        parts = urlsplit(host.rstrip("/"))
        try:
            url_port = parts.port
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _refuse(what, host, f"a host name or address (e.g. 127.0.0.1), or a URL starting with http:// "
                                      f"or https:// (e.g. http://127.0.0.1:{DEFAULT_PORT})")
        scheme, host = parts.scheme, parts.hostname
    if host in WILDCARD_HOSTS:  # a listen-everywhere address is reached on this machine's loopback
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    if not port and not url_port and os.environ.get("LEMONADE_PORT", "").strip():
        raw = os.environ["LEMONADE_PORT"].strip()
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise _refuse("LEMONADE_PORT", raw, f"a port number, e.g. {DEFAULT_PORT}")
        port = int(raw)
    return f"{scheme}://{host}:{port or url_port or DEFAULT_PORT}"


class ServerClient:
    def __init__(self, host: str | None = None, port: int | None = None, timeout: float | None = 600.0,
                 url: str | None = None) -> None:
        self.url = url or base_url(host, port)
        headers = {}
        key = api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                 event_hooks={"request": [_lemonade_prefix]})

    def not_running(self) -> typer.Exit:
        hint = (" An https:// address needs a TLS proxy in front of the server: `lemonade serve` itself speaks "
                "http://." if self.url.startswith("https://") else "")
        err_console.print(f"[red]Could not connect to Lemonade server at {self.url}: no server is running there."
                          "[/red] Start one with "
                          "[bold]lemonade serve[/bold] (or pass --host/--port, or set LEMONADE_BASE_URL)." + hint,
                          highlight=False)
        return typer.Exit(3)

    def is_running(self) -> bool:
        """Something answers HTTP there. Not only a `/live` 200: a Lemonade server behind a proxy that
        forwards only the API, or one that asks a key of every path, is running too (what it answers
        next says the rest), as Lemonade's own CLI judges it."""
        try:
            self.http.get("/live", timeout=2)
            return True
        except httpx.HTTPError:
            return False

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """JSON of a successful response; prints the server's error message and exits otherwise."""
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.ConnectError:
            raise self.not_running() from None
        except httpx.HTTPError as exc:
            err_console.print(f"[red]Request to {self.url}{path} failed:[/red] {exc}")
            raise typer.Exit(1) from None
        if resp.status_code >= 400:
            err_console.print(f"[red]Error {resp.status_code}:[/red] {error_message(resp)}")
            raise typer.Exit(1)
        return resp.json() if resp.content else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json=body, **kw)

    def sse(self, path: str, body: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event, data) pairs of a Server-Sent Events response."""
        try:
            with self.http.stream("POST", path, json=body, timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    err_console.print(f"[red]Error {resp.status_code}:[/red] {error_message(resp)}")
                    raise typer.Exit(1)
                event = "message"
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        try:
                            yield event, json.loads(data)
                        except ValueError:
                            continue
                    elif not line:
                        event = "message"
        except httpx.ConnectError:
            raise self.not_running() from None


def _lemonade_prefix(request: httpx.Request) -> None:
    """API paths go out under `/api/v1`, the prefix Lemonade's own CLI and app use (this server answers
    all four), so a proxy or server that serves only Lemonade's prefix works too."""
    if request.url.path.startswith(("/v1/", "/v0/")):
        request.url = request.url.copy_with(path="/api" + request.url.path)


def error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
