"""`lemonade load` and `lemonade unload`: explicit control of what stays in memory."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape

from lemonade.cli.client import ServerClient
from lemonade.cli.common import HostOpt, PortOpt, err, fail, out, require_server
from lemonade.cli.load_options import GENERAL, with_load_options
from lemonade.cli.progress import ProgressView
from lemonade.labels import COLLECTION_RECIPES, LabelError, deployment_mode, model_type


def load_body(model: str, options: dict[str, Any] | None = None, pinned: bool | None = None,
              save_options: bool = False) -> dict[str, Any]:
    """The `/v1/load` body; options left out stay out, so saved per-model options still apply."""
    body: dict[str, Any] = {"model_name": model, **(options or {})}
    if pinned is not None:
        body["pinned"] = pinned
    if save_options:
        body["save_options"] = True
    return body


PinnedOpt = Annotated[bool | None, typer.Option("--pinned/--unpinned", help="Pin the model in memory to prevent "
                                                "auto-eviction under capacity limits", rich_help_panel=GENERAL)]
SaveOpt = Annotated[bool, typer.Option("--save-options", help="Persist the supplied recipe options for future "
                                       "loads of this model", rich_help_panel=GENERAL)]


def do_load(c: ServerClient, body: dict[str, Any]) -> str:
    """POST /v1/load as a stream, with a progress bar: a first load may install the engine's backend
    and download the model before the engine starts. A load that cannot get a slot is announced first."""
    warning = pinned_slots_warning(c, body["model_name"])
    if warning:
        err.print(f"[yellow]Warning:[/yellow] {escape(warning)}", highlight=False)
    done: dict[str, Any] | None = None
    with ProgressView(f"Loading {body['model_name']}") as view:
        for event, data in c.sse("/v1/load", {**body, "stream": True}):
            if event == "progress":
                view.update(data)
            elif event == "complete":
                done = data
            elif event == "error":
                raise fail(f"Loading {body['model_name']} failed: {data.get('error', data)}")
    if done is None:
        raise fail(f"The server closed the load stream for {body['model_name']} without a result; see its log.")
    return str(done.get("message") or f"Loaded model: {body['model_name']}")


@with_load_options
def load(
    model: Annotated[str, typer.Argument(help="Model name (or alias)")],
    pinned: PinnedOpt = None, save_options: SaveOpt = False,
    host: HostOpt = None, port: PortOpt = None, options: dict[str, Any] | None = None,
) -> None:
    """Load a model for inference (starts its engine; installs the engine and downloads the model first
    when needed). Recipe options apply to this load only, unless --save-options."""
    c = require_server(host, port)
    message = do_load(c, load_body(model, options, pinned, save_options))
    out.print(f"[green]{escape(message)}[/green]", highlight=False)


def pinned_slots_warning(c: ServerClient, model: str) -> str | None:
    """guide-configuration-multi-model.md, "Pre-emptive Warnings": before a load, the CLI checks
    `/v1/health`; when every slot of the model's type is held by a pinned model, the load will fail
    (409 `slots_pinned_error`), and the user is told so, with the way out. None when the load can
    take a slot, or when the server does not say enough to tell (the load then speaks for itself)."""
    info, health = c.peek(f"/v1/models/{quote(model, safe='')}"), c.peek("/v1/health")
    if not isinstance(info, dict) or not isinstance(health, dict):
        return None
    loaded = health.get("all_models_loaded") or []
    wanted = [info, *(info.get("models") or [])] if info.get("recipe") in COLLECTION_RECIPES else [info]
    for entry in wanted:
        if entry.get("recipe") in COLLECTION_RECIPES or "cloud_provider" in entry \
                or any(m.get("model_name") == entry.get("id") for m in loaded):
            continue  # a collection's parts are checked one by one; cloud models and loaded ones take no slot
        try:
            mode = deployment_mode(str(entry.get("id")), str(entry.get("recipe")), entry.get("labels") or [])
        except LabelError:
            continue
        mtype = model_type(mode)
        limit = (health.get("max_models") or {}).get(mtype, -1)
        pinned = [m["model_name"] for m in loaded if m.get("pinned") and m.get("type") == mtype
                  and m.get("residency_class", "standard") == "standard"]
        if isinstance(limit, int) and limit != -1 and len(pinned) >= limit:
            return (f"all {limit} slot(s) for '{mtype}' models are occupied by pinned models ({', '.join(pinned)}), "
                    f"so loading {entry.get('id')} will fail. Free one first: lemonade unpin {pinned[0]} "
                    f"(or lemonade unload {pinned[0]}).")
    return None


def unload(
    model: Annotated[str | None, typer.Argument(help="Model to unload; omit to unload every model")] = None,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Unload one model, or all of them (stops their llama-server processes)."""
    c = require_server(host, port)
    result = c.post("/v1/unload", {"model_name": model} if model else None) or {}
    what = model or "all models"
    out.print(f"{escape(str(result.get('message') or 'Unloaded'))} ({escape(what)})", highlight=False)


def _set_pin(model: str, pinned: bool, host: str | None, port: int | None) -> None:
    c = require_server(host, port)
    c.post("/internal/pin", {"model_name": model, "pinned": pinned})
    out.print(f"{'Pinned' if pinned else 'Unpinned'} {escape(model)}", highlight=False)


def pin(model: Annotated[str, typer.Argument(help="A loaded model")], host: HostOpt = None,
        port: PortOpt = None) -> None:
    """Keep a loaded model in memory: it is never evicted to make room for another."""
    _set_pin(model, True, host, port)


def unpin(model: Annotated[str, typer.Argument(help="A loaded model")], host: HostOpt = None,
          port: PortOpt = None) -> None:
    """Let a pinned model be evicted again when another needs its slot."""
    _set_pin(model, False, host, port)


def register(app: typer.Typer) -> None:
    app.command("load")(load)
    app.command("unload")(unload)
    app.command("pin")(pin)
    app.command("unpin")(unpin)
