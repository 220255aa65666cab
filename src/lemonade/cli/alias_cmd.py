"""`lemonade alias add|list|remove`: stable names that point at a model (/internal/aliases)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from lemonade.cli.common import HostOpt, JsonOpt, PortOpt, out, print_json, require_server
from lemonade.cli.tables import aliases_table

alias_app = typer.Typer(help="Model aliases: a name of your own that points at a model; re-point it at any "
                             "time and traffic switches at once.", no_args_is_help=True)


@alias_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The alias, e.g. production-llm")],
    target: Annotated[str, typer.Argument(help="The model it points at, e.g. Qwen3-0.6B-GGUF")],
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Create or re-point an alias."""
    c = require_server(host, port)
    body = c.post("/internal/aliases", {"alias": name, "target": target})
    out.print(f"Alias [bold]{name}[/bold] -> {body.get('target', target)}", highlight=False)


@alias_app.command("list")
def list_aliases(host: HostOpt = None, port: PortOpt = None, as_json: JsonOpt = False) -> None:
    """Show every alias and its target."""
    c = require_server(host, port)
    aliases = (c.get("/internal/aliases") or {}).get("aliases", [])
    if as_json:
        print_json(aliases)
        return
    if not aliases:
        out.print("No aliases. Add one with [bold]lemonade alias add NAME MODEL[/bold].")
        return
    out.print(aliases_table(aliases))


@alias_app.command("remove")
def remove(name: Annotated[str, typer.Argument(help="The alias to remove")],
           host: HostOpt = None, port: PortOpt = None) -> None:
    """Remove an alias (the model itself stays)."""
    c = require_server(host, port)
    c.request("DELETE", f"/internal/aliases/{quote(name, safe='')}")
    out.print(f"Removed alias [bold]{name}[/bold]", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(alias_app, name="alias")
