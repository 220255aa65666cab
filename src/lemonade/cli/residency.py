"""`lemonade load` and `lemonade unload`: explicit control of what stays in memory."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.client import ServerClient
from lemonade.cli.common import HostOpt, PortOpt, fail, out, require_server
from lemonade.cli.progress import ProgressView

RECIPE_PANEL = "Recipe options: llamacpp"  # guide-cli.md groups the load options by recipe
CtxOpt = Annotated[int | None, typer.Option("--ctx-size", help="Context size in tokens; -1 = automatic",
                                            rich_help_panel=RECIPE_PANEL)]
ArgsOpt = Annotated[str | None, typer.Option("--llamacpp-args", help="Extra llama-server arguments, e.g. "
                                                                     "\"--threads 2 -np 2\"",
                                             rich_help_panel=RECIPE_PANEL)]
BackendOpt = Annotated[str | None, typer.Option("--llamacpp-backend",
                                                help="llama.cpp backend: auto, cpu, vulkan, rocm, cuda, metal, system",
                                                rich_help_panel=RECIPE_PANEL)]


def load_body(model: str, ctx_size: int | None = None, llamacpp_args: str | None = None,
              llamacpp_backend: str | None = None, pinned: bool | None = None,
              save_options: bool = False) -> dict[str, Any]:
    """The `/v1/load` body; options left out stay out, so saved per-model options still apply."""
    body: dict[str, Any] = {"model_name": model}
    for key, value in (("ctx_size", ctx_size), ("llamacpp_args", llamacpp_args),
                       ("llamacpp_backend", llamacpp_backend), ("pinned", pinned)):
        if value is not None:
            body[key] = value
    if save_options:
        body["save_options"] = True
    return body


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


def load(
    model: Annotated[str, typer.Argument(help="Model name (or alias)")],
    ctx_size: CtxOpt = None, llamacpp_args: ArgsOpt = None, llamacpp_backend: BackendOpt = None,
    pinned: Annotated[bool | None, typer.Option("--pinned/--unpinned", help="Never evict this model to make "
                                                                            "room for another")] = None,
    save_options: Annotated[bool, typer.Option("--save-options", help="Remember these options for this "
                                                                      "model")] = False,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Load a model into memory (starts its llama-server)."""
    c = require_server(host, port)
    message = do_load(c, load_body(model, ctx_size, llamacpp_args, llamacpp_backend, pinned, save_options))
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
