"""`lemonade load` and `lemonade unload`: explicit control of what stays in memory."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.client import ServerClient
from lemonade.cli.common import HostOpt, PortOpt, fail, out, require_server
from lemonade.cli.load_options import GENERAL, with_load_options
from lemonade.cli.progress import ProgressView


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
    and download the model before the engine starts."""
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
