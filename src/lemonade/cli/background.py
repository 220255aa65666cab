"""A server started by the CLI itself (`lemonade run` with no server up), and `lemonade stop`.

The server runs detached in its own session, so closing the chat (or Ctrl-C in it) leaves it
serving; its output goes to `<cache>/server.log` and its pid to `<cache>/server.pid`, which is
how `lemonade stop` finds it again. Only a process whose command line is `lemonade ... serve` is
ever signalled, so a stale pid file can never kill something else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.markup import escape

from lemonade import paths
from lemonade.cli.client import ServerClient
from lemonade.cli.common import HostOpt, PortOpt, client, err, fail, out, spinner
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
    import psutil
else:  # imported on first use (util/lazy.py)
    httpx = lazy_module("httpx")
    psutil = lazy_module("psutil")

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "[::1]")
LIVE_TIMEOUT = 60.0


def pid_file(cache: Path) -> Path:
    return cache / "server.pid"


def log_file(cache: Path) -> Path:
    return cache / "server.log"


def _is_lemonade_server(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        cmd = " ".join(proc.cmdline())
        return "lemonade" in cmd and "serve" in cmd
    return False


def start_background(c: ServerClient) -> int:
    """Start `lemonade serve` for the address `c` targets, wait for `/live`; returns its pid."""
    from lemonade.paths import cache_dir

    parts = urlsplit(c.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 13305
    if host not in LOCAL_HOSTS:
        raise fail(f"No server answers at {c.url}, and it is not on this machine, so it cannot be started "
                   "from here. Start it there (lemonade serve), or point --host/--port or LEMONADE_BASE_URL at "
                   "a running one.", 3)
    if parts.scheme == "https":
        raise fail(f"No server answers at {c.url}. A server started here would speak http://, not https://: "
                   f"start your TLS proxy, or use LEMONADE_BASE_URL=http://{parts.netloc}.", 3)
    cache = cache_dir()
    log_path = log_file(cache)
    cmd = [sys.executable, "-m", "lemonade.cli.main", "serve", "--host", host, "--port", str(port)]
    detach: dict[str, Any]
    if sys.platform == "win32":
        detach = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.DETACHED_PROCESS}
    else:
        detach = {"start_new_session": True}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                close_fds=True, **detach)
    pid_file(cache).write_text(json.dumps({"pid": proc.pid, "url": c.url}))
    with spinner(f"Starting a Lemonade server at {c.url} (log: {log_path})..."):
        deadline = time.monotonic() + LIVE_TIMEOUT
        while not c.is_running():
            if proc.poll() is not None:
                pid_file(cache).unlink(missing_ok=True)
                tail = log_path.read_text(errors="replace").splitlines()[-15:]
                raise fail(f"The server exited with code {proc.returncode}. Last lines of {log_path}:\n"
                           + "\n".join(tail))
            if time.monotonic() > deadline:
                raise fail(f"The server (pid {proc.pid}) did not answer at {c.url} within {LIVE_TIMEOUT:.0f} s; "
                           f"see {log_path}.")
            time.sleep(0.1)
    err.print(f"Started a Lemonade server in the background (pid {proc.pid}, log {escape(str(log_path))}). "
              "It keeps running after this chat; stop it with [bold]lemonade stop[/bold].", highlight=False)
    return proc.pid


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 13305


def _same_cache(proc: psutil.Process, cache: Path) -> bool:
    """Whether `proc` keeps its state in `cache` (so it is "our" server, not a test's or a colleague's)."""
    try:
        env = proc.environ()
    except psutil.Error:
        return False
    try:
        return paths.cache_dir(env, create=False).resolve() == cache.resolve()
    except OSError:
        return False


def _find_by_port(port: int, cache: Path) -> psutil.Process | None:
    """The `lemonade serve` process on `port` that uses our cache dir, when the OS lets us see it."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(conn.pid)
                if _is_lemonade_server(proc) and _same_cache(proc, cache):
                    return proc
    return None


def check_server_is_ours(c: ServerClient) -> str | None:
    """None when nothing answers at `c.url`; a description of the server when it keeps its state in
    this installation's cache dir; `typer.Exit` (with a message naming it and the way out) when
    the server there belongs to someone else (another user, a test, another cache dir, another
    program on the port). Used by the quick start, which must not install into or chat through a
    server it did not start."""
    from lemonade import __version__
    from lemonade.paths import cache_dir

    if not c.is_running():
        return None
    ours = cache_dir().resolve()
    other = "Stop that server, or give this installation another port: LEMONADE_PORT=13306 scripts/quickstart.sh"
    try:
        resp = c.http.get("/v1/system-info", params={"include_paths": "true"}, timeout=10)
        info = resp.json() if resp.status_code == 200 else {}
        health = c.http.get("/v1/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        info, health = {}, {}
    theirs = info.get("cache_dir") if isinstance(info, dict) else None
    version = health.get("version", "unknown") if isinstance(health, dict) else "unknown"
    if not theirs:
        raise fail(f"Something answers at {c.url}, but it does not say which Lemonade installation it belongs "
                   f"to (version {version}). {other}")
    if Path(theirs).resolve() != ours:
        raise fail(f"The Lemonade server at {c.url} (version {version}) keeps its state in {theirs}, not in this "
                   f"installation's {ours}. {other}")
    note = "" if version == __version__ else f"; this installation is {__version__}, restart it with `lemonade stop`"
    return f"Lemonade server at {c.url}: version {version}, cache dir {theirs}{note}"


def stop(host: HostOpt = None, port: PortOpt = None,
         timeout: Annotated[float, typer.Option(help="Seconds to wait before killing it")] = 30.0) -> None:
    """Stop the local Lemonade server (and every engine it started)."""
    from lemonade.paths import cache_dir

    c = client(host, port, discover=False)
    path = pid_file(cache_dir())
    proc: psutil.Process | None = None
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        info = json.loads(path.read_text())
        candidate = psutil.Process(int(info["pid"]))
        explicit = host is not None or port is not None or bool(os.environ.get("LEMONADE_BASE_URL"))
        if _is_lemonade_server(candidate) and _same_cache(candidate, path.parent) and \
                (info.get("url") == c.url or not explicit):
            proc, c = candidate, ServerClient(*_host_port(info["url"]))
    if proc is None:
        proc = _find_by_port(urlsplit(c.url).port or 13305, cache_dir())
    if proc is None:
        path.unlink(missing_ok=True)
        if c.is_running():
            raise fail(f"A server answers at {c.url}, but it was not started from this cache dir "
                       f"({cache_dir()}); stop it where it runs (Ctrl-C).")
        out.print(f"No Lemonade server is running at {escape(c.url)}.", highlight=False)
        return
    pid = proc.pid
    with spinner(f"Stopping the Lemonade server (pid {pid})..."):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(psutil.Error):
                proc.wait(10)
        except psutil.Error:
            pass
    path.unlink(missing_ok=True)
    out.print(f"Stopped the Lemonade server (pid {pid}).", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("stop")(stop)

