"""`lemonade status` and `lemonade list`: what the server is doing and what it can serve."""

from __future__ import annotations

from typing import Annotated

import typer

from lemonade.cli.common import HostOpt, JsonOpt, PortOpt, err, out, print_json, require_server
from lemonade.cli.tables import crashed_table, loaded_table, models_table


def status(host: HostOpt = None, port: PortOpt = None, as_json: JsonOpt = False) -> None:
    """Is the server up, which version, which models are loaded (and which crashed)."""
    c = require_server(host, port)
    health = c.get("/v1/health")
    if as_json:
        print_json(health)
        return
    out.print(f"Lemonade server [green]running[/green] at {c.url} (version {health.get('version', '?')})",
              highlight=False)
    loaded = health.get("all_models_loaded") or []
    limits = health.get("max_models") or {}
    limit = limits.get("llm")
    if limit is not None:
        out.print(f"Models kept loaded per type: {'unlimited' if limit == -1 else limit}", highlight=False)
    if loaded:
        out.print(loaded_table(loaded))
    else:
        out.print("No models loaded. Load one with [bold]lemonade load MODEL[/bold] or chat with "
                  "[bold]lemonade run MODEL[/bold].")
    crashed = health.get("crashed_models") or []
    if crashed:
        out.print(crashed_table(crashed))


def list_models(
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Also list models that are not downloaded")] = False,
    host: HostOpt = None, port: PortOpt = None, as_json: JsonOpt = False,
) -> None:
    """Models the server can serve: name, downloaded, recipe, labels, size."""
    c = require_server(host, port)
    body = c.get("/v1/models", params={"show_all": "true"} if show_all else None)
    models = body.get("data", []) if isinstance(body, dict) else []
    if as_json:
        print_json(models)
        return
    if not models:
        out.print("No models downloaded yet. [bold]lemonade list --all[/bold] shows the catalog.")
        return
    title = "All models" if show_all else "Downloaded models"
    out.print(models_table(models, f"{title} ({len(models)})"))
    if not show_all:
        err.print("[dim]`lemonade list --all` also shows models that are not downloaded.[/dim]")


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("list")(list_models)
