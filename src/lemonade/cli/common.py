"""Pieces every client command shares: where the server is, consoles, small formatters.

Exit codes of the CLI: 0 success, 1 the server (or an install) reported an error, 2 bad usage or
a refused value, 3 no server running (`ServerClient.not_running`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from lemonade.cli.client import ServerClient
from lemonade.cli.target import TARGET

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_SERVER = 3


def _console(stderr: bool) -> Console:
    """A console that does not wrap table rows at 80 columns when piped (`lemonade list | grep`)."""
    probe = Console(stderr=stderr)
    if not probe.is_terminal and "COLUMNS" not in os.environ:
        return Console(stderr=stderr, width=200)
    return probe


out = _console(stderr=False)
err = _console(stderr=True)

HostOpt = Annotated[str | None, typer.Option("--host", help="Server host or URL (default: LEMONADE_HOST, else "
                                                           "LEMONADE_BASE_URL, else the configured host)")]
PortOpt = Annotated[int | None, typer.Option("--port", help="Server port (default: LEMONADE_PORT, else "
                                                           "LEMONADE_BASE_URL, else the configured port, 13305)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the server's JSON instead of a table")]


def configured_address() -> tuple[str | None, int | None]:
    """Host and port a `lemonade serve` started from this shell would use (file, then env).

    Used when neither flags nor the environment say where the server is, so a user who set
    `port` in config.json does not have to repeat it on every command.
    """
    from lemonade.config import Config, ConfigError
    from lemonade.paths import config_dir

    try:
        config = Config(config_dir(create=False))
        return config.get("host"), config.get("port") if config.user_set("port") else None
    except (ConfigError, OSError, ValueError):
        return None, None


ADDRESS_ENV = ("LEMONADE_BASE_URL", "LEMONADE_HOST", "LEMONADE_PORT")


def client(host: str | None = None, port: int | None = None, timeout: float | None = 600.0,
           discover: bool = True) -> ServerClient:
    """A client for the server this command means: its own `--host/--port`, else the global ones,
    else the environment, else config.json's address. When nothing said where (flags, environment)
    and nobody answers at the configured address, a server on this machine that announces itself
    (beacon.py) is used instead, unless `--no-discovery`. Commands that work on this machine's own
    files when no server runs (config, backends, stop) pass `discover=False`: they must never act
    on somebody else's server instead."""
    host = TARGET.host if host is None else host
    port = TARGET.port if port is None else port
    chosen = host is not None or port is not None or any(os.environ.get(k, "").strip() for k in ADDRESS_ENV)
    if not chosen:
        host, port = configured_address()
    c = ServerClient(host, port, timeout=timeout)
    if not chosen and discover and TARGET.discovery and not c.is_running():
        from lemonade.beacon import discover_local

        found = discover_local()
        if found is not None:
            err.print(f"[dim]Nothing answers at {escape(c.url)}; using the Lemonade server on this machine that "
                      f"announced itself at {escape(found.base_url)} (--no-discovery to turn this off).[/dim]",
                      highlight=False)
            c = ServerClient(url=found.base_url, timeout=timeout)
    return c


def require_server(host: str | None, port: int | None) -> ServerClient:
    """A client for a server that answers `/live`; otherwise the "start it with" message, exit 3."""
    c = client(host, port)
    if not c.is_running():
        raise c.not_running()
    return c


def fail(message: str, code: int = EXIT_ERROR) -> typer.Exit:
    err.print(f"[red]Error:[/red] {escape(message)}", highlight=False)
    return typer.Exit(code)


def print_json(data: Any) -> None:
    """JSON on stdout, plain (no colour codes) so it can be piped into `jq`."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def fmt_size(gb: Any) -> str:
    if not isinstance(gb, (int, float)):
        return "-"
    return f"{gb * 1000:.0f} MB" if gb < 1 else f"{gb:.2f} GB"


def yes_no(value: Any) -> str:
    return "yes" if value else "no"


def fmt_age(timestamp: Any) -> str:
    """'12s ago' for a Unix time (health's `last_use`)."""
    if not isinstance(timestamp, (int, float)) or timestamp <= 0:
        return "-"
    secs = max(0, int(time.time() - timestamp))
    if secs < 60:
        return f"{secs}s ago"
    if secs < 3600:
        return f"{secs // 60}m ago"
    return f"{secs // 3600}h ago"


@contextlib.contextmanager
def spinner(message: str) -> Iterator[None]:
    """A spinner on a terminal; one plain line on stderr otherwise (logs, tests, pipes)."""
    if err.is_terminal:
        with err.status(escape(message)):
            yield
    else:
        err.print(escape(message), highlight=False)
        yield
