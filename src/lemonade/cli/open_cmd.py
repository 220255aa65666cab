"""`lemonade open` and `lemonade logs`: the server's web app in the default browser."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from lemonade.cli.background import start_background
from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, client, err, out
from lemonade.util.browser import VIEWS, app_url, open_url


def open_app(view: str | None, host: str | None, port: int | None) -> None:
    """Start a server in the background when none answers (as `lemonade run` does), then open the app."""
    if view is not None and view not in VIEWS:
        err.print(f"Unknown view '{escape(view)}'; one of: {', '.join(VIEWS)}")
        raise typer.Exit(EXIT_USAGE)
    c = client(host, port)
    if not c.is_running():
        start_background(c)
    url = app_url(c.url, view)
    if open_url(url):
        out.print(f"Opened {url} in your browser.", highlight=False)
    else:
        out.print(f"No browser could be started here; open {url} yourself.", highlight=False)


def open_cmd(view: Annotated[str | None, typer.Argument(help=f"The view to open: {', '.join(VIEWS)}")] = None,
             host: HostOpt = None, port: PortOpt = None) -> None:
    """Open the web app (chat, model manager, logs, ...) in your browser."""
    open_app(view, host, port)


def logs(host: HostOpt = None, port: PortOpt = None) -> None:
    """Open the server's live logs in the web app."""
    open_app("logs", host, port)


def register(app: typer.Typer) -> None:
    app.command("open")(open_cmd)
    app.command("logs")(logs)
