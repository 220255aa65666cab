"""`lemonade chat [MODEL]`: the terminal chat of guide-cli-chat.md.

Interactive on a terminal: a `>` prompt, replies streamed as they come, a model's reasoning trace
dimmed above its answer, slash commands (`/help` lists them), Ctrl-C stops a reply (the HTTP
stream is closed, so the server stops generating) and leaves at an empty prompt, Ctrl-D leaves.
With stdin not a terminal, every input line is one user message and only the replies go to stdout
(one per line block; everything else goes to stderr), so `echo "hi" | lemonade chat MODEL` and
tests work.

With no MODEL, the chat model already loaded is used, else a menu offers the downloaded ones. A
model that does not chat (images, speech, transcription, embeddings, ...) is refused with the
command that does its work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape

from lemonade.cli.background import start_background
from lemonade.cli.chat import Chat
from lemonade.cli.client import ServerClient
from lemonade.cli.common import EXIT_ERROR, EXIT_USAGE, HostOpt, PortOpt, client, err, fail
from lemonade.cli.residency import do_load, load_body

CHAT_PANEL = "Chat Options"
SystemOpt = Annotated[str | None, typer.Option("--system", help="System prompt for the session",
                                               rich_help_panel=CHAT_PANEL)]
NoStreamOpt = Annotated[bool, typer.Option("--no-stream", help="Wait for the full response instead of streaming "
                                           "token by token", rich_help_panel=CHAT_PANEL)]
MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", help="Longest reply, in tokens",
                                                  rich_help_panel=CHAT_PANEL)]
TemperatureOpt = Annotated[float | None, typer.Option("--temperature", help="Sampling temperature",
                                                      rich_help_panel=CHAT_PANEL)]
RepeatOpt = Annotated[float | None, typer.Option("--repeat-penalty", help="Penalty for repeated tokens (llama.cpp; "
                                                 "1.0 = off), helps small base models", rich_help_panel=CHAT_PANEL)]
BaseOpt = Annotated[bool, typer.Option("--base", help="The model is a base model (no chat template): talk to it "
                                       "through a conversation transcript on /v1/completions",
                                       rich_help_panel=CHAT_PANEL)]
NoStartOpt = Annotated[bool, typer.Option("--no-start", help="Fail instead of starting a server")]

HELP_ROWS = (
    ("/help", "Show this help"),
    ("/exit, /quit", "Leave the chat (also Ctrl-D, or Ctrl-C at an empty prompt)"),
    ("/clear", "Clear the conversation (keeps the system prompt)"),
    ("/system <text>", "Set or replace the system prompt (clears the conversation)"),
    ("/model <name>", "Switch to another model (loads it if needed; clears the conversation)"),
    ("/load <name>", "Load a model on the server without switching to it"),
    ("/unload [name]", "Unload one model, or every loaded model"),
    ("/list, /models", "List chat models (downloaded and available to pull)"),
    ("  --all, -a", "Also list models that do not chat (audio, images, embeddings, ...)"),
    ("  --downloaded, -d", "Only models already downloaded"),
    ("/ps", "Show the loaded models"),
    ("/stats", "Show the figures of the last reply"),
    ("/think [on|off|default]", "Show or set the reasoning mode"),
    ("/multiline", "Toggle multi-line input (send with a blank line)"),
)


# ----- which models chat ------------------------------------------------------------------------

def mode_of(obj: dict[str, Any]) -> str:
    """The deployment mode of a `/v1/models` entry (its mode label, else its recipe's default)."""
    from lemonade.labels import LabelError, deployment_mode

    try:
        mode = deployment_mode(str(obj.get("id")), str(obj.get("recipe") or ""), obj.get("labels") or [])
    except LabelError:
        return "chat"  # an entry the server lists but this build cannot place: let the server say what it is
    return "chat" if mode == "collection" else mode


def elsewhere(obj: dict[str, Any]) -> str | None:
    """For a model that does not chat: which command (or web app view) does its work; None for a chat model."""
    name, mode = obj.get("id", "MODEL"), mode_of(obj)
    labels = obj.get("labels") or []
    if mode == "chat":
        return None
    if mode == "image" and "upscaling" in labels:
        return (f"{name} upscales pictures; it does not chat. Upscale one with: lemonade upscale PICTURE.png -m {name}")
    if mode == "image":
        return (f"{name} is an image model; it does not chat. Draw with: lemonade generate \"a lemon on the moon\" "
                f"-m {name}, or in the web app: lemonade open images")
    if mode == "tts":
        return (f"{name} is a text-to-speech model; it does not chat. Speak with: lemonade speak \"Hello\" -m {name}"
                f", or in the web app: lemonade open speech")
    if mode == "transcription":
        return (f"{name} is a speech-to-text model; it does not chat. Transcribe with: lemonade transcribe "
                f"recording.wav -m {name}, or live in the web app: lemonade open speech")
    endpoint = {"embeddings": "/v1/embeddings", "reranking": "/v1/reranking", "classification": "/v1/classify"}
    if mode in endpoint:
        return f"{name} is a{'n' if mode == 'embeddings' else ''} {mode} model; it does not chat. Use it through " \
               f"the API: POST {endpoint[mode]}"
    return f"{name} is a {mode} model; it does not chat, and this server does not run {mode} models."


def model_info(c: ServerClient, name: str) -> dict[str, Any]:
    """The `/v1/models/{name}` entry; an unknown model ends the command with the server's 404 message."""
    return c.get(f"/v1/models/{quote(name, safe='')}") or {}


def loaded_models(c: ServerClient) -> list[dict[str, Any]]:
    return (c.get("/v1/health") or {}).get("all_models_loaded") or []


def is_loaded(c: ServerClient, obj: dict[str, Any]) -> bool:
    name = obj.get("alias_target") or obj.get("id")
    return any(m.get("model_name") == name for m in loaded_models(c))


def ensure_loaded(c: ServerClient, obj: dict[str, Any], name: str, options: dict[str, Any] | None = None,
                  pinned: bool | None = None, save_options: bool = False) -> None:
    """Load the model unless it is loaded already and no option asks for anything new; a first load
    downloads it and installs its engine, with progress."""
    if options or pinned is not None or save_options or not is_loaded(c, obj):
        err.print(f"[green]{escape(do_load(c, load_body(name, options, pinned, save_options)))}[/green]",
                  highlight=False)


def prepare(c: ServerClient, name: str, options: dict[str, Any] | None = None, pinned: bool | None = None,
            save_options: bool = False) -> dict[str, Any]:
    """A chat model, loaded: its `/v1/models` entry. A model that does not chat ends the command with
    what to use instead."""
    obj = model_info(c, name)
    refusal = elsewhere(obj)
    if refusal:
        raise fail(refusal, EXIT_USAGE)
    ensure_loaded(c, obj, name, options, pinned, save_options)
    return obj


def _chat_models(c: ServerClient, downloaded_only: bool, include_all: bool = False) -> list[dict[str, Any]]:
    body = c.get("/v1/models", params=None if downloaded_only else {"show_all": "true"}) or {}
    models = body.get("data") or []
    return [m for m in models if include_all or mode_of(m) == "chat"]


def current_chat_model(c: ServerClient) -> str | None:
    """The chat model the server has loaded (the most recently used one)."""
    chat = [m for m in loaded_models(c) if m.get("type", "llm") == "llm"]
    return max(chat, key=lambda m: m.get("last_use") or 0)["model_name"] if chat else None


def pick_model(c: ServerClient, interactive: bool) -> str:
    """The model `lemonade chat` with no MODEL talks to: the loaded chat model, else the user's pick."""
    loaded = current_chat_model(c)
    if loaded:
        return loaded
    downloaded = [m["id"] for m in _chat_models(c, downloaded_only=True)]
    if not interactive:
        hint = f" Downloaded chat models: {', '.join(downloaded)}." if downloaded else \
            " None is downloaded yet: lemonade pull Qwen3-0.6B-GGUF, for example."
        raise fail("No chat model is loaded; name one: lemonade chat MODEL." + hint, EXIT_USAGE)
    suggested = [m["id"] for m in _chat_models(c, downloaded_only=False)
                 if not m.get("downloaded") and m.get("suggested")][:8]
    choices = downloaded + suggested
    if not choices:
        raise fail("The server lists no chat model. Pull one (lemonade pull owner/repo), then try again.")
    _take_ctrl_c()
    err.print("[bold]Select a model to chat with[/bold]", highlight=False)
    for i, name in enumerate(choices, 1):
        note = "" if name in downloaded else "  [dim](downloads first)[/dim]"
        err.print(f"  {i}. {escape(name)}{note}", highlight=False)
    while True:
        try:
            with _ctrl_c_always_reaches_input():
                answer = input("Number or name: ").strip()
        except (EOFError, KeyboardInterrupt):
            sys.stderr.write("\n")
            raise typer.Exit(EXIT_ERROR) from None
        if answer.isdigit() and 1 <= int(answer) <= len(choices):
            return choices[int(answer) - 1]
        if answer:
            return answer
        err.print(f"Give a number from 1 to {len(choices)}, or a model name.")


# ----- showing a reply -------------------------------------------------------------------------

class Replies:
    """Writes replies: the answer to stdout, everything else to stderr (dimmed on a terminal)."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive

    def show(self, chat: Chat, text: str) -> bool:
        """Stream one reply; False when the server refused or failed the turn."""
        import openai

        pieces = chat.send(text)
        spinner = err.status("Generating…") if self.interactive else None
        if spinner is not None:
            spinner.start()
        thinking = answering = False
        try:
            for kind, piece in pieces:
                if spinner is not None:
                    spinner.stop()
                    spinner = None
                if kind == "reasoning":
                    if not thinking:
                        err.print("[magenta]▍[/magenta] [dim italic]thinking…[/dim italic]", highlight=False)
                        thinking = True
                    err.print(escape(piece), end="", style="dim italic", highlight=False)
                    continue
                if kind == "runaway":
                    sys.stdout.write("\n")
                    err.print("[dim](stopped: the reply kept repeating itself)[/dim]", highlight=False)
                    continue
                if thinking and not answering:
                    err.print("\n", end="")  # the answer starts below the reasoning
                answering = True
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            err.print("[dim](stopped)[/dim]", highlight=False)
            return True
        except openai.APIStatusError as exc:
            sys.stdout.write("\n")
            err.print(f"[red]Error {exc.status_code}:[/red] {escape(_message(exc))}", highlight=False)
            return False
        except openai.APIConnectionError as exc:
            sys.stdout.write("\n")
            raise fail(f"Lost the connection to the server: {exc}") from None
        except openai.APIError as exc:  # an error event in the middle of a stream
            sys.stdout.write("\n")
            err.print(f"[red]Error:[/red] {escape(_message(exc))}", highlight=False)
            return False
        finally:
            if spinner is not None:
                spinner.stop()
            pieces.close()  # ends the HTTP stream now (Ctrl-C) and files the reply in the history
        if thinking and not answering:
            err.print("")
        sys.stdout.write("\n")
        sys.stdout.flush()
        if self.interactive and chat.last.completion_tokens:
            err.print(f"[dim]— {chat.last.summary()} —[/dim]", highlight=False)
        return True


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(exc)


# ----- input -----------------------------------------------------------------------------------

def _setup_line_editing() -> None:
    """readline: history, Ctrl-U clears the line (its default), and so does Esc (GNU readline)."""
    try:
        import readline
    except ImportError:
        return
    if "libedit" not in (readline.__doc__ or ""):
        readline.parse_and_bind(r'"\e": kill-whole-line')


def _take_ctrl_c() -> None:
    """On a terminal, Ctrl-C is the chat's (stop a reply, cancel a buffer, leave at an empty prompt),
    also when the chat was started with SIGINT ignored: a background job of a shell without job
    control (`cmd &` in a script), `nohup`, some launchers and CI runners. Python installs its
    KeyboardInterrupt handler only when SIGINT is not ignored at start, so without this the user's
    Ctrl-C would do nothing at all."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _ctrl_c_always_reaches_input() -> Iterator[None]:
    """While `input()` waits on a terminal, a no-op SIGALRM every 0.2 s.

    Why: CPython's readline loop writes the prompt, then blocks in `select()` on stdin, and checks
    Python's signal handlers only when that `select()` is interrupted. A Ctrl-C that lands in between
    (the prompt already on screen, `select()` not yet entered: a busy machine, or a script typing as
    soon as it sees the prompt) is recorded and then ignored until the next key press; measured with 3
    busy cores, 18 of 40 such Ctrl-Cs were lost. The timer's interruption makes readline run the
    handlers, so that Ctrl-C acts within 0.2 s; the line being edited is left as it is.
    """
    if not hasattr(signal, "setitimer"):  # Windows: no readline either
        yield
        return
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Prompt:
    """User input: a `>` prompt on a terminal, plain lines from a pipe. `None` at the end."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive
        self.multiline = False
        self._piped: Iterator[str] | None = None if interactive else (line.rstrip("\r\n") for line in sys.stdin)
        if interactive:
            _take_ctrl_c()
            _setup_line_editing()

    def bar(self, model: str) -> None:
        width = min(err.width, 100)
        label = f" {model} "
        hint = "? /help for shortcuts"
        dashes = max(2, width - 8 - len(label) - len(hint))
        err.print(f"\n  [bright_black]───[/bright_black][bold cyan]{escape(label)}[/bold cyan]"
                  f"[bright_black]{'─' * dashes}[/bright_black]  [dim]{hint}[/dim]", highlight=False)
        keys = ("Send: blank line · Clear line: Esc / Ctrl-U · Ctrl-C: cancel buffer (exits if empty)"
                if self.multiline else "Clear line: Esc / Ctrl-U · Stop response or exit: Ctrl-C")
        err.print(f"  [dim]{keys}[/dim]\n", highlight=False)

    def read(self) -> str | None:
        if self._piped is not None:
            return next(self._piped, None)
        lines: list[str] = []
        while True:
            try:
                with _ctrl_c_always_reaches_input():
                    line = input("  . " if lines else "  > ")
            except EOFError:
                sys.stderr.write("\n")
                return None
            except KeyboardInterrupt:
                sys.stderr.write("\n")
                if lines:
                    err.print("  [dim]multi-line buffer cleared[/dim]", highlight=False)
                    return ""
                return None
            if not self.multiline or (not lines and line.lstrip().startswith("/")):  # a command is one line
                return line
            if not line.strip():
                return "\n".join(lines)
            lines.append(line)


# ----- the REPL --------------------------------------------------------------------------------

class Repl:
    """The conversation loop and its slash commands."""

    def __init__(self, c: ServerClient, chat: Chat, interactive: bool) -> None:
        self.c, self.chat, self.interactive = c, chat, interactive
        self.prompt = Prompt(interactive)
        self.replies = Replies(interactive)
        self.commands: dict[str, Callable[[str], bool | None]] = {
            "/help": self.help, "/?": self.help, "/exit": self.exit, "/quit": self.exit, "/bye": self.exit,
            "/clear": self.clear, "/system": self.system, "/model": self.model, "/load": self.load,
            "/unload": self.unload, "/list": self.list, "/models": self.list, "/ps": self.ps, "/stats": self.stats,
            "/think": self.think, "/reasoning": self.think, "/reason": self.think, "/multiline": self.multiline,
        }

    def info(self, text: str) -> None:
        err.print(f"  [dim]{escape(text)}[/dim]", highlight=False)

    def run(self) -> int:
        """Runs the conversation; returns how many turns failed."""
        failed = 0
        if self.interactive:
            err.print("  Welcome to [bold yellow]Lemonade chat[/bold yellow] [dim]— local LLMs, in your "
                      "terminal.[/dim] Type a message, [dim]/help[/dim] for commands, [dim]/exit[/dim] to quit.",
                      highlight=False)
        while True:
            if self.interactive:
                self.prompt.bar(self.chat.model)
            line = self.prompt.read()
            if line is None:
                return failed
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                name, _, arg = text.partition(" ")
                handler = self.commands.get(name.lower())
                if handler is None:
                    self.info(f"Unknown command: {name} (try /help)")
                    continue
                try:
                    if handler(arg.strip()) is False:
                        return failed
                except typer.Exit:  # a refused request: its message is printed; the chat goes on
                    continue
                continue
            failed += not self.replies.show(self.chat, line if self.prompt.multiline else text)

    # ----- slash commands (False ends the chat) -----
    def help(self, arg: str) -> None:
        err.print("\n  [bold]Slash commands[/bold]", highlight=False)
        for cmd, desc in HELP_ROWS:
            err.print(f"    [cyan]{escape(cmd):<26}[/cyan][dim]{escape(desc)}[/dim]", highlight=False)
        err.print("\n  [dim]Anything not starting with '/' is sent as a user message. Esc / Ctrl-U clears the line. "
                  "Ctrl-C stops a streaming response, cancels a multi-line buffer, or exits at an empty "
                  "prompt.[/dim]\n", highlight=False)

    def exit(self, arg: str) -> bool:
        return False

    def clear(self, arg: str) -> None:
        self.chat.clear()
        self.info("Conversation cleared.")

    def system(self, arg: str) -> None:
        self.chat.switch(system=arg)
        self.info("System prompt " + ("set" if arg else "removed") + "; conversation cleared.")

    def model(self, arg: str) -> None:
        if not arg:
            self.info(f"Chatting with {self.chat.model}. Switch with: /model <name>")
            return
        obj = prepare(self.c, arg)
        self.chat.switch(model=obj.get("id", arg))
        self.info(f"Switched to {self.chat.model}; conversation cleared.")

    def load(self, arg: str) -> None:
        if not arg:
            self.info("Usage: /load <name>")
            return
        prepare(self.c, arg)

    def unload(self, arg: str) -> None:
        result = self.c.post("/v1/unload", {"model_name": arg} if arg else None) or {}
        self.info(f"{result.get('message') or 'Unloaded'} ({arg or 'all models'})")

    def list(self, arg: str) -> None:
        flags = arg.split()
        unknown = [f for f in flags if f not in ("--all", "-a", "--downloaded", "-d")]
        if unknown:
            self.info(f"Unknown option: {unknown[0]} (accepted: --all, --downloaded)")
            return
        include_all = "--all" in flags or "-a" in flags
        downloaded_only = "--downloaded" in flags or "-d" in flags
        loaded = {m.get("model_name") for m in loaded_models(self.c)}
        everything = _chat_models(self.c, downloaded_only, include_all=True)
        shown = [m for m in everything if include_all or mode_of(m) == "chat"]
        for m in shown:
            tags = [t for t, on in (("loaded", m["id"] in loaded), ("active", m["id"] == self.chat.model)) if on]
            tags.append(m.get("recipe") or "")
            mark = "[green]●[/green]" if m.get("downloaded") else "[bright_black]○[/bright_black]"
            name = f"[bold cyan]{escape(m['id'])}[/bold cyan]" if m["id"] == self.chat.model else escape(m["id"])
            err.print(f"    {mark} {name}  [dim]({escape(', '.join(t for t in tags if t))})[/dim]", highlight=False)
        hidden = len(everything) - len(shown)
        foot = f"{len(shown)} {'model' if include_all else 'chat model'}{'' if len(shown) == 1 else 's'}"
        self.info(foot + (f" · {hidden} that do not chat hidden (/list --all)" if hidden else ""))

    def ps(self, arg: str) -> None:
        loaded = loaded_models(self.c)
        if not loaded:
            self.info("No models loaded.")
        for m in loaded:
            tags = ["active"] if m.get("model_name") == self.chat.model else []
            tags += [str(m[k]) for k in ("type", "recipe", "device") if m.get(k)]
            err.print(f"    {escape(str(m.get('model_name')))}  [dim]({escape(', '.join(tags))})[/dim]",
                      highlight=False)

    def stats(self, arg: str) -> None:
        last = self.chat.last
        self.info(last.summary() if last.completion_tokens else "No reply yet.")

    def think(self, arg: str) -> None:
        value = arg.lower()
        if value in ("on", "true", "1", "yes"):
            self.chat.think = True
        elif value in ("off", "false", "0", "no"):
            self.chat.think = False
        elif value in ("default", "auto", "reset"):
            self.chat.think = None
        elif value:
            self.info("Usage: /think [on|off|default]")
            return
        state = {True: "on (the model is asked to reason)", False: "off (thinking traces suppressed)",
                 None: "the model's default"}[self.chat.think]
        self.info(f"Reasoning: {state}.")

    def multiline(self, arg: str) -> None:
        self.prompt.multiline = not self.prompt.multiline
        self.info("Multi-line input " + ("on: send with a blank line." if self.prompt.multiline else "off."))


def converse(c: ServerClient, chat: Chat) -> None:
    """Run the REPL for `chat`; a non-interactive session whose turn failed exits non-zero."""
    interactive = sys.stdin.isatty()
    try:
        failed = Repl(c, chat, interactive).run()
    except BrokenPipeError:  # `... | lemonade chat M | head -1`: the reader is gone, which is fine
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    if failed and not interactive:  # scripts must see that a turn failed
        raise typer.Exit(EXIT_ERROR)


def server_for_chat(host: str | None, port: int | None, no_start: bool) -> ServerClient:
    """The server to talk to; one is started in the background when none runs (unless --no-start)."""
    c = client(host, port)
    if not c.is_running():
        if no_start:
            raise c.not_running()
        start_background(c)
    return c


def chat(
    model: Annotated[str | None, typer.Argument(help="Model to chat with (default: the loaded chat model, else "
                                                     "a menu of the downloaded ones)")] = None,
    system: SystemOpt = None, no_stream: NoStreamOpt = False, max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None, repeat_penalty: RepeatOpt = None, base: BaseOpt = False,
    no_start: NoStartOpt = False, host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Chat with a model in the terminal (starts a server in the background when none runs)."""
    c = server_for_chat(host, port, no_start)
    name = model or pick_model(c, sys.stdin.isatty())
    obj = prepare(c, name)
    converse(c, Chat(c, obj.get("id", name) if model is None else name, system, max_tokens, temperature,
                     repeat_penalty, base, stream=not no_stream))


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
