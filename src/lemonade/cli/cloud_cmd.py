"""`lemonade cloud install|uninstall|auth|clear|list`: cloud providers on the server (guide-cli.md).

Keys typed here go to the server's memory only (`POST /v1/cloud/auth`); `list` never shows one.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_USAGE, HostOpt, JsonOpt, PortOpt, fail, out, print_json, require_server

cloud_app = typer.Typer(help="Manage cloud OpenAI-compatible providers (keys stay in the server's memory or "
                             "its environment)", no_args_is_help=True)
ProviderArg = Annotated[str, typer.Argument(help="Provider name, e.g. fireworks (the model-name prefix)")]


def _auth(state: dict[str, Any]) -> str:
    return "env var" if state.get("env_var_set") else "runtime key" if state.get("runtime_key_set") else "no key"


@cloud_app.command("install")
def install(provider: ProviderArg,
            base_url: Annotated[str, typer.Option("--base-url", help="OpenAI-compatible base URL ending in /v1")],
            api_key: Annotated[str | None, typer.Option("--api-key", help="Key kept in the server's memory")] = None,
            allow_insecure_http: Annotated[bool | None, typer.Option("--allow-insecure-http", help="Allow sending "
                                                                     "the key to an http:// URL")] = None,
            auth_header_name: Annotated[str | None, typer.Option("--auth-header-name")] = None,
            auth_header_prefix: Annotated[str | None, typer.Option("--auth-header-prefix")] = None,
            host: HostOpt = None, port: PortOpt = None) -> None:
    """Register a provider (options left out keep their current values)."""
    body: dict[str, Any] = {"backend": "cloud", "provider": provider, "base_url": base_url}
    for key, value in (("api_key", api_key), ("allow_insecure_http", allow_insecure_http),
                       ("auth_header_name", auth_header_name), ("auth_header_prefix", auth_header_prefix)):
        if value is not None:
            body[key] = value
    done = require_server(host, port).post("/v1/install", body)
    out.print(f"Installed cloud provider [bold]{escape(provider)}[/bold] ({escape(done['base_url'])}): "
              f"{done['models_discovered']} model(s) discovered, {_auth(done['auth_state'])}.", highlight=False)
    if done.get("warning"):
        out.print(f"[yellow]{escape(done['warning'])}[/yellow]", highlight=False)


@cloud_app.command("uninstall")
def uninstall(provider: ProviderArg, host: HostOpt = None, port: PortOpt = None) -> None:
    """Remove a provider and its models (an env-var key is left as it is)."""
    done = require_server(host, port).post("/v1/uninstall", {"backend": "cloud", "provider": provider})
    out.print(f"Removed cloud provider {escape(provider)} ({done['models_evicted']} model(s)).", highlight=False)


@cloud_app.command("auth")
def auth(provider: ProviderArg,
         api_key: Annotated[str | None, typer.Option("--api-key", help="The key (prompted when left out)")] = None,
         allow_insecure_http: Annotated[bool, typer.Option("--allow-insecure-http", help="Allow sending the key to "
                                                           "this provider's http:// URL (kept with it)")] = False,
         host: HostOpt = None, port: PortOpt = None) -> None:
    """Give the server a key for a provider, in its memory only."""
    if api_key is None:
        if not sys.stdin.isatty():
            raise fail("Pass --api-key KEY (no terminal to prompt on)", EXIT_USAGE)
        api_key = typer.prompt(f"API key for {provider}", hide_input=True)
    body: dict[str, Any] = {"provider": provider, "api_key": api_key}
    if allow_insecure_http:
        body["allow_insecure_http"] = True
    done = require_server(host, port).post("/v1/cloud/auth", body)
    out.print(f"Key set for {escape(provider)}: {done['models_discovered']} model(s) discovered.", highlight=False)
    if done.get("warning"):
        out.print(f"[yellow]{escape(done['warning'])}[/yellow]", highlight=False)


@cloud_app.command("clear")
def clear(provider: ProviderArg, host: HostOpt = None, port: PortOpt = None) -> None:
    """Forget the in-memory key of a provider (an env-var key stays in effect)."""
    done = require_server(host, port).request("DELETE", f"/v1/cloud/auth/{provider}")
    out.print(f"{escape(provider)}: " + ("runtime key cleared" if done["cleared_runtime_key"] else
                                          "no runtime key was set") + f"; now {_auth(done['auth_state'])}.",
              highlight=False)


@cloud_app.command("list")
def list_providers(as_json: JsonOpt = False, host: HostOpt = None, port: PortOpt = None) -> None:
    """Installed providers, their auth state and model counts (never a key)."""
    providers = (require_server(host, port).get("/v1/system-info").get("cloud") or {}).get("providers", [])
    if as_json:
        print_json(providers)
        return
    if not providers:
        out.print("No cloud providers installed. Add one: lemonade cloud install NAME --base-url URL")
        return
    for p in providers:
        out.print(f"{escape(p['name'])}  {escape(p['base_url'])}  {p['models_discovered']} model(s)  "
                  f"{_auth(p)} ({p['env_var']})", highlight=False)
        if p.get("auth_header_name") != "Authorization" or p.get("auth_header_prefix") != "Bearer ":
            out.print(f"  header: {escape(p['auth_header_name'])}: {escape(p['auth_header_prefix'])}<key>",
                      highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(cloud_app, name="cloud")
