"""`lemonade status` and `lemonade list`: what the server is doing and what it can serve."""

from __future__ import annotations

import sys
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.markup import escape

from lemonade.cli.common import HostOpt, JsonOpt, PortOpt, out, print_json, require_server
from lemonade.cli.tables import crashed_table, loaded_table, model_lines


def status(host: HostOpt = None, port: PortOpt = None, as_json: JsonOpt = False) -> None:
    """Is the server up, which version, which models are loaded (and which crashed)."""
    c = require_server(host, port)
    health = c.get("/v1/health")
    if as_json:  # where it answered too, so scripts can find the server the CLI found
        print_json({"url": c.url, "port": urlsplit(c.url).port, **(health or {})})
        return
    out.print(f"Lemonade server [green]running[/green] at {c.url} (version {health.get('version', '?')})",
              highlight=False)
    loaded = health.get("all_models_loaded") or []
    limits = health.get("max_models") or {}
    limit = limits.get("llm")
    if limit is not None:
        out.print(f"Models kept loaded per type: {'unlimited' if limit == -1 else limit}", highlight=False)
    _auto_tune_lines(health)
    if loaded:
        out.print(loaded_table(loaded))
    else:
        out.print("No models loaded. Load one with [bold]lemonade load MODEL[/bold] or chat with "
                  "[bold]lemonade chat MODEL[/bold].")
    crashed = health.get("crashed_models") or []
    if crashed:
        out.print(crashed_table(crashed))


def _auto_tune_lines(health: dict) -> None:
    """The detected archetype and the auto-tune overrides each loaded model runs with."""
    tune = health.get("auto_tune")
    if not isinstance(tune, dict):
        return
    arch = (tune.get("archetype") or {}).get("id", "unknown")
    state = "on" if tune.get("enabled") else "off (auto_tune=false)"
    profiles = ", ".join(tune.get("profiles") or []) or "none"
    out.print(f"Auto-tune: {state}; hardware archetype {arch}; matching profiles: {profiles}", highlight=False)
    for err_text in tune.get("errors") or []:
        out.print(f"  [yellow]{escape(err_text)}[/yellow]", highlight=False)
    for m in health.get("all_models_loaded") or []:
        applied = m.get("auto_tune") or {}
        overrides = applied.get("overrides") or {}
        if overrides:
            text = ", ".join(f"{k}={v}" for k, v in overrides.items())
            out.print(f"  {escape(str(m.get('model_name')))}: {escape(text)} (profile {applied.get('profile')}"
                      f"{', model overlay' if applied.get('model_overlay') else ''})", highlight=False)


def list_models(
    downloaded_only: Annotated[bool, typer.Option("--downloaded", help="Show only downloaded models")] = False,
    show_all: Annotated[bool, typer.Option("--all", "-a", hidden=True, help="Every model (the default)")] = False,
    host: HostOpt = None, port: PortOpt = None, as_json: JsonOpt = False,
) -> None:
    """List all available models: Local (downloaded) and Available for Download; --downloaded for the first."""
    c = require_server(host, port)
    body = c.get("/v1/models", params=None if downloaded_only and not show_all else {"show_all": "true"})
    models = body.get("data", []) if isinstance(body, dict) else []
    if as_json:
        print_json(models)
        return
    if downloaded_only and not show_all:
        lines = model_lines(models) if models else ["No local models downloaded."]
    elif not models:
        lines = ["No models available"]
    else:
        local = [m for m in models if m.get("downloaded")]
        remote = [m for m in models if not m.get("downloaded")]
        lines = ["Local", *(model_lines(local) if local else ["No local models downloaded."]), "",
                 "Available for Download", *(model_lines(remote) if remote else ["No models available for download."])]
    sys.stdout.write("\n".join(lines) + "\n")


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("list")(list_models)
