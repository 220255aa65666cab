"""`lemonade run MODEL`: load a model and open it in the web app (guide-cli.md, "Options for run").

It takes `load`'s options, starts a server in the background when none runs, and opens the web app
on the view that uses the model (chat, images, speech), saying which command does the same from the
terminal. `--chat-cli` opens the terminal chat (`lemonade chat`) instead, with the chat's options.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.chat import Chat
from lemonade.cli.chat_cmd import (
    BaseOpt,
    MaxTokensOpt,
    NoStartOpt,
    NoStreamOpt,
    RepeatOpt,
    SystemOpt,
    TemperatureOpt,
    converse,
    elsewhere,
    ensure_loaded,
    mode_of,
    model_info,
    prepare,
    server_for_chat,
)
from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, err, fail, out
from lemonade.cli.load_options import with_load_options
from lemonade.cli.residency import PinnedOpt, SaveOpt

VIEW_OF_MODE = {"chat": "chat", "image": "images", "tts": "speech", "transcription": "speech"}


@with_load_options
def run(
    model: Annotated[str, typer.Argument(help="Model name (or alias), e.g. Qwen3-0.6B-GGUF")],
    chat_cli: Annotated[bool, typer.Option("--chat-cli", help="Chat in the terminal (lemonade chat) instead of "
                                           "opening the web app")] = False,
    pinned: PinnedOpt = None, save_options: SaveOpt = False,
    system: SystemOpt = None, no_stream: NoStreamOpt = False, max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None, repeat_penalty: RepeatOpt = None, base: BaseOpt = False,
    no_start: NoStartOpt = False,
    host: HostOpt = None, port: PortOpt = None, options: dict[str, Any] | None = None,
) -> None:
    """Load a model and open the web app in the browser (--chat-cli: chat in the terminal instead). Starts a
    server in the background when none runs."""
    from lemonade.util.browser import app_url, open_url

    if not chat_cli and (system or no_stream or max_tokens or temperature is not None or repeat_penalty is not None
                         or base):
        raise fail("--system, --no-stream, --max-tokens, --temperature, --repeat-penalty and --base are chat "
                   "options: add --chat-cli, or use lemonade chat.", EXIT_USAGE)
    c = server_for_chat(host, port, no_start)
    if chat_cli:
        prepare(c, model, options, pinned, save_options)
        converse(c, Chat(c, model, system, max_tokens, temperature, repeat_penalty, base, stream=not no_stream))
        return
    obj = model_info(c, model)  # an unknown model ends here, with the server's message
    ensure_loaded(c, obj, model, options, pinned, save_options)
    view = VIEW_OF_MODE.get(mode_of(obj))
    url = app_url(c.url, view)
    if open_url(url):
        out.print(f"Opened {url} in your browser.", highlight=False)
    else:
        out.print(f"No browser could be started here; open {url} yourself.", highlight=False)
    hint = elsewhere(obj)
    if hint:
        err.print(f"[dim]{escape(hint)}[/dim]", highlight=False)
    elif view == "chat":
        err.print(f"[dim]To chat in the terminal instead: lemonade chat {escape(model)}[/dim]", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
