"""Running the server process: settings layering, port check, uvicorn, clean shutdown."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import gc
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from lemonade.beacon import BeaconSender
from lemonade.config import Config, ConfigError
from lemonade.legacy_state import MigrationError, migrate_legacy_state
from lemonade.observability.logs import setup_logging
from lemonade.paths import cache_dir as default_cache_dir
from lemonade.paths import config_dir as default_config_dir
from lemonade.util.browser import app_url, local_base_url, open_url
from lemonade.util.tcp_keepalive import keep_alive

log = logging.getLogger("lemonade.server")


class PortInUse(RuntimeError):
    pass


def check_port(host: str, port: int) -> None:
    """Fail before starting anything when another process holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(f"Port {port} on {host} is already in use (another Lemonade server?). "
                                f"Stop it, or start this one with --port <other port>.") from None
            raise


def bind_websocket_port(host: str, setting: str | int, main_port: int) -> socket.socket:
    """The listening socket of the dedicated WebSocket port ("auto": one the OS picks), bound before
    the server starts so `/v1/health` can report it from the first request.

    The main port is free at this point (only checked; uvicorn binds it later), so the OS may pick
    exactly it for "auto": the main server would then fail with "address already in use". Such a
    pick is bound while the OS picks again."""
    port = 0 if setting == "auto" else int(setting)
    if port == main_port:
        raise PortInUse(f"The WebSocket port cannot be the server's port {main_port}: set websocket_port to "
                        "\"auto\" or another port.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held: list[socket.socket] = []
    try:
        while True:  # ends: a held port is never picked again (no SO_REUSEADDR on an OS-picked one)
            sock = socket.socket(family, socket.SOCK_STREAM)
            if port:  # a fixed port after a restart: past connections in TIME_WAIT must not block it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                sock.close()
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise PortInUse(f"WebSocket port {port} on {host} is already in use. Start with "
                                    "--websocket-port auto or another port.") from None
                raise
            if sock.getsockname()[1] != main_port:
                break
            held.append(sock)
    finally:
        for other in held:
            other.close()
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def warn_if_exposed(host: str, port: int, api_key: str | None) -> None:
    """guide-configuration-README.md: bound beyond loopback without LEMONADE_API_KEY, every endpoint
    (inference, model management, and /internal/* unless an admin key is set) is open to the network."""
    from lemonade.api.origins import is_loopback_name

    if api_key or is_loopback_name(host):
        return
    log.warning("Listening on %s:%d, reachable from other machines, without LEMONADE_API_KEY: anyone who can "
                "reach this port can use and manage the server. Set LEMONADE_API_KEY (and LEMONADE_ADMIN_API_KEY "
                "for /internal/*), or bind to 127.0.0.1 (lemonade config set host=127.0.0.1).", host, port)


def kept_alive_http() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools where installed) with TCP keep-alive on every connection it
    accepts (util/tcp_keepalive.py says why). A WebSocket begins as an HTTP request on the same
    connection, so the WebSockets of both ports have it too."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class KeptAlive(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                keep_alive(sock)
            super().connection_made(transport)

    return KeptAlive


def build(cli_overrides: dict[str, Any] | None = None, cache: Path | None = None,
          config_dir: Path | None = None):  # noqa: ANN201
    """Config, logging and the app, without starting to listen (also used by tests and benchmarks).
    A `cache` given without a `config_dir` keeps its config files in it too (paths.py)."""
    from lemonade.api.app import create_app
    from lemonade.services import Services

    config_dir = Path(config_dir) if config_dir else Path(cache) if cache else default_config_dir()
    cache = Path(cache) if cache else default_cache_dir()
    try:
        moved = migrate_legacy_state(cache, config_dir)
    except MigrationError as exc:
        raise ConfigError(str(exc)) from None
    config = Config(config_dir, cli_overrides)
    logs = setup_logging(config.get("log_level"))
    for line in moved.done:
        log.info("%s", line)
    for note in moved.warnings + config.notes:
        log.warning("%s", note)
    services = Services(cache, config, logs, api_key=os.environ.get("LEMONADE_API_KEY") or None,
                        admin_key=os.environ.get("LEMONADE_ADMIN_API_KEY") or None,
                        allowed_origins=os.environ.get("LEMONADE_ALLOWED_ORIGINS") or None)
    return config, services, create_app(services)


def serve(cli_overrides: dict[str, Any] | None = None, open_app: bool = False) -> int:
    """Run the server until it is stopped; `open_app`: open the web app in a browser once it listens."""
    # Building the app creates objects that live as long as the server (FastAPI's and pydantic's
    # models, the routes, the catalog); the collector's passes over them while they were made were
    # a tenth of the start (docs/performance.md, "Start-up"). So it is off until the app is built,
    # and what exists then is frozen out of every later pass (less work per collection while serving).
    gc.disable()
    import uvicorn

    from lemonade.api.app import websocket_only

    class Quiet(uvicorn.Server):
        """uvicorn's main loop wakes every 0.1 s to see whether it should stop (and refreshes its
        Date header every tenth time); with the WebSocket port's server too, an idle Lemonade woke 20
        times a second, which a laptop pays for in battery. These wake once a second for the header
        and stop as soon as they are told (`request_exit`, or a signal through `handle_exit`)."""

        _loop: asyncio.AbstractEventLoop | None = None
        _stop: asyncio.Event | None = None

        async def main_loop(self) -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            while not await self.on_tick(0):  # tick 0: the Date header is refreshed each time
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)

        def request_exit(self) -> None:
            self.should_exit = True
            if self._loop is not None and self._stop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to wake
                    self._loop.call_soon_threadsafe(self._stop.set)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            self.request_exit()

    class Follower(Quiet):
        """The dedicated WebSocket port's server: it runs inside the main server's `serve` and stops
        with it, so it leaves the signals to the main one."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    class Server(Quiet):
        follower: tuple[Quiet, socket.socket] | None = None
        beacons: asyncio.Task[None] | None = None

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # discovery beacons while `broadcast` is on (beacon.py)
                self.beacons = asyncio.ensure_future(BeaconSender(config, host, port).run())
            if open_app and self.started:
                url = app_url(local_base_url(host, port))
                log.info("Opening the web app at %s", url)
                # a browser command may take its time to return: never on the event loop
                threading.Thread(target=open_url, args=(url,), daemon=True).start()

        async def shutdown(self, sockets: Any = None) -> None:
            if self.beacons is not None:
                self.beacons.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.beacons
            await super().shutdown(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            # A requested shutdown (Ctrl-C, SIGTERM) ends with status 0 once the engines are stopped,
            # instead of uvicorn re-raising the signal at exit.
            self._captured_signals.clear()

        async def serve(self, sockets: Any = None) -> None:
            if self.follower is None:
                await super().serve(sockets)
                return
            other, sock = self.follower
            task = asyncio.ensure_future(other.serve(sockets=[sock]))
            try:
                await super().serve(sockets)
            finally:
                other.request_exit()
                with contextlib.suppress(Exception, SystemExit):
                    await task

    try:
        config, services, app = build(cli_overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        gc.freeze()
        gc.enable()
    host, port = config.get("host"), config.get("port")
    warn_if_exposed(host, port, services.api_key)
    try:
        check_port(host, port)
        ws_sock = bind_websocket_port(host, config.get("websocket_port"), port)
    except PortInUse as exc:
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    services.websocket_port = ws_sock.getsockname()[1]
    # Last resort if the interpreter exits without running the lifespan shutdown.
    atexit.register(services.router.kill_all_now)
    log.info("Starting Lemonade on http://%s:%d", host, port)
    http = kept_alive_http()
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                   timeout_graceful_shutdown=5, ws_ping_interval=20, http=http))
    follower = Follower(uvicorn.Config(websocket_only(app, port), lifespan="off", log_level="warning",
                                       access_log=False, timeout_graceful_shutdown=5, ws_ping_interval=20,
                                       http=http))
    server.follower = (follower, ws_sock)
    services.stop_server = server.request_exit  # POST /internal/shutdown: the same way out as Ctrl-C
    log.info("WebSockets (/realtime, /logs/stream, /spans/stream) also on the dedicated port %d",
             services.websocket_port)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind (a race with another server)
        return int(exc.code or 1)
    return 0 if server.started else 1
