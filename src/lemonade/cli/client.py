"""The CLI's HTTP client: where the server is, how to authenticate, and friendly failures.

Plain JSON requests (most commands: `status`, `list`, `config`, `unload`...) go through the standard
library's `http.client`; streams, uploads and long waits through httpx. Why two: importing httpx
takes about 100 ms of CPU here (httpcore, its `_main` with click and rich, `urllib.request`), a
third of a short command such as `lemonade status`, whose goal is 0.25 s (docs/performance.md,
"Start-up"); `http.client` costs about 25 ms and is all a JSON round trip needs.
"""

from __future__ import annotations

import functools
import http.client as http_client
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import typer
from rich.console import Console

from lemonade import __version__
from lemonade.cli.target import api_key
from lemonade.route_table import PREFIXES
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:
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
    """The server's origin from a URL that may end in an API prefix (`/api/v1` before `/v1`)."""
    return next((url.removesuffix(p) for p in sorted(PREFIXES, key=len, reverse=True) if url.endswith(p)), url)


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


class NotListening(OSError):
    """Nothing accepted the connection (refused, no such host): no server runs at the address."""


class ServerClient:
    def __init__(self, host: str | None = None, port: int | None = None, timeout: float | None = 600.0,
                 url: str | None = None) -> None:
        self.url = url or base_url(host, port)
        self.headers: dict[str, str] = {}
        key = api_key()
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self._timeout = timeout

    @functools.cached_property
    def http(self) -> httpx.Client:
        """httpx, for what `request` does not do: streams, uploads, long waits."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=self._timeout,
                            event_hooks={"request": [_lemonade_prefix]})

    @property
    def timeout(self) -> float | None:
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        """Both transports' timeout (None: wait as long as it takes, e.g. a pull)."""
        self._timeout = value
        if "http" in self.__dict__:
            self.http.timeout = httpx.Timeout(value)

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
            self._exchange("GET", "/live", None, None, timeout=2)
            return True
        except (OSError, http_client.HTTPException):
            return False

    def _exchange(self, method: str, path: str, body: Any, params: dict[str, str] | None,
                  timeout: float | None) -> tuple[int, bytes]:
        """One request on a connection of its own: (status, body). `NotListening` when nothing accepts it."""
        parts = urlsplit(self.url)
        target = parts.path.rstrip("/") + api_path(path) + (f"?{urlencode(params)}" if params else "")
        kind = http_client.HTTPSConnection if parts.scheme == "https" else http_client.HTTPConnection
        conn = kind(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
        headers = {**self.headers, "Accept": "*/*", "User-Agent": f"lemonade-cli/{__version__}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise NotListening(str(exc)) from exc
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None) -> Any:
        """JSON of a successful response; prints the server's error message and exits otherwise."""
        try:
            status, content = self._exchange(method, path, body, params, self._timeout)
        except NotListening:
            raise self.not_running() from None
        except (OSError, http_client.HTTPException) as exc:
            err_console.print(f"[red]Request to {self.url}{path} failed:[/red] {str(exc) or type(exc).__name__}")
            raise typer.Exit(1) from None
        if status >= 400:
            err_console.print(f"[red]Error {status}:[/red] {error_text(content)}")
            raise typer.Exit(1)
        return json.loads(content) if content else None

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return self.request("GET", path, params=params)

    def peek(self, path: str, timeout: float = 5.0) -> Any:
        """JSON of a successful GET, or None whatever went wrong, without a word: for checks a
        command makes on the side (a warning it may print), never for what it was asked to do."""
        try:
            status, content = self._exchange("GET", path, None, None, timeout=timeout)
            return json.loads(content) if status == 200 and content else None
        except (OSError, http_client.HTTPException, ValueError):
            return None

    def post(self, path: str, body: Any = None, params: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, body, params)

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


def api_path(path: str) -> str:
    """API paths go out under `/api/v1`, the prefix Lemonade's own CLI and app use (this server answers
    all four), so a proxy or server that serves only Lemonade's prefix works too."""
    return "/api" + path if path.startswith(("/v1/", "/v0/")) else path


def _lemonade_prefix(request: httpx.Request) -> None:
    request.url = request.url.copy_with(path=api_path(request.url.path))


def error_message(resp: httpx.Response) -> str:
    return error_text(resp.read())


def error_text(content: bytes) -> str:
    """The message of an error answer: the `error.message` of a JSON body, else its first 500 characters."""
    try:
        body = json.loads(content)
    except ValueError:
        return content.decode(errors="replace")[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
