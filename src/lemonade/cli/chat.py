"""`lemonade run MODEL`: make sure a server runs, load the model, chat in the terminal.

The chat goes through the official `openai` client against our own `/v1/chat/completions`, the
same path every other app takes, so what works here works for them. Tokens are printed as they
arrive; the conversation is kept and sent back each turn.

Interactive on a terminal (`/exit` or Ctrl-D leaves, `/clear` forgets the conversation, Ctrl-C
stops a reply). With stdin not a terminal, every input line is one user message and only the
replies go to stdout (one per line block), so `echo "hi" | lemonade run MODEL` and tests work.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.background import start_background
from lemonade.cli.client import ServerClient, api_key
from lemonade.cli.common import EXIT_ERROR, HostOpt, PortOpt, client, err, fail
from lemonade.cli.residency import ArgsOpt, BackendOpt, CtxOpt, do_load, load_body

HELP = "Commands: /clear forgets the conversation, /exit (or Ctrl-D) leaves, /help shows this."
# A reply whose end is one short unit over and over (small base models print "#####..." or the same
# line forever) is stopped: nobody wants to wait for max_tokens of it.
RUNAWAY_UNIT = 60  # longest repeated unit looked for, in characters
RUNAWAY_SPAN = 80  # characters of repetition (and at least 6 units) before a reply counts as runaway
RUNAWAY_TAIL = 6 * RUNAWAY_UNIT  # the part of a reply the check needs


# A base model (no chat template, e.g. the quick start's Gemma 3 270M) does not know chat turns; it
# continues text. `--base` talks to it through a conversation transcript on /v1/completions, with
# a few example turns and stops at the next turn, which keeps its replies short and on topic.
BASE_PREAMBLE = ("This is a conversation between a user and a friendly, helpful assistant. The assistant answers "
                 "briefly, clearly and politely.")
BASE_SHOTS = (("Good morning!", "Good morning! How can I help you today?"),
              ("What is the capital of Italy?", "The capital of Italy is Rome."),
              ("Thanks!", "You're welcome!"))
BASE_STOPS = ["\nUser:", "\nAssistant:", "\n\n"]
BASE_DEFAULTS = {"max_tokens": 200, "temperature": 0.7, "repeat_penalty": 1.1}


def transcript(history: list[dict[str, str]]) -> str:
    """The conversation as the text a base model continues: preamble (or the system prompt),
    example turns, then every turn so far, ending where the assistant speaks next."""
    system = next((m["content"] for m in history if m["role"] == "system"), None)
    lines = [system or BASE_PREAMBLE, ""]
    for user, assistant in BASE_SHOTS:
        lines += [f"User: {user}", f"Assistant: {assistant}"]
    for m in history:
        if m["role"] in ("user", "assistant"):
            lines.append(f"{m['role'].capitalize()}: {m['content'].strip()}")
    return "\n".join(lines) + "\nAssistant:"


def runaway(text: str) -> bool:
    """Whether `text` ends in at least RUNAWAY_SPAN characters (and six units) of one repeated unit:
    its last n characters have period p. Runs once per streamed piece, so it compares slices only."""
    for period in range(1, RUNAWAY_UNIT + 1):
        n = max(RUNAWAY_SPAN, 6 * period)
        if len(text) < n:
            return False  # n only grows with the period
        tail = text[-n:]
        if tail[period:] == tail[:-period]:
            return True
    return False


class Chat:
    """One conversation with one model; `send()` streams the reply and keeps the history."""

    def __init__(self, c: ServerClient, model: str, system: str | None = None,
                 max_tokens: int | None = None, temperature: float | None = None,
                 repeat_penalty: float | None = None, base: bool = False) -> None:
        try:
            from openai import OpenAI
        except ImportError:
            raise fail("`lemonade run` needs the openai package: pip install 'openai>=1.40'") from None

        key = api_key() or "lemonade"
        self.openai = OpenAI(base_url=c.url + "/v1", api_key=key, max_retries=0, timeout=None)
        self.model = model
        self.system = system
        self.base = base
        wanted = {"max_tokens": max_tokens, "temperature": temperature, "repeat_penalty": repeat_penalty}
        if base:
            wanted = {k: BASE_DEFAULTS[k] if v is None else v for k, v in wanted.items()}
        self.params: dict[str, Any] = {k: v for k, v in wanted.items() if v is not None and k != "repeat_penalty"}
        if wanted["repeat_penalty"] is not None:  # llama.cpp's sampler option, passed through by the server
            self.params["extra_body"] = {"repeat_penalty": wanted["repeat_penalty"]}
        self.history: list[dict[str, str]] = []
        self.clear()

    def clear(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []

    def send(self, text: str) -> Iterator[tuple[str, str]]:
        """Yields ("content" | "reasoning", piece), then ("runaway", "") if the reply was stopped for
        repeating itself; the reply joins the history when done or stopped."""
        self.history.append({"role": "user", "content": text})
        reply: list[str] = []
        tail = ""  # the end of the reply, for the runaway check
        stream: Any = None
        try:
            if self.base:
                stream = self.openai.completions.create(model=self.model, prompt=transcript(self.history),
                                                        stream=True, stop=BASE_STOPS, **self.params)
            else:
                stream = self.openai.chat.completions.create(model=self.model, messages=self.history,  # type: ignore
                                                             stream=True, **self.params)
            for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = getattr(choice, "delta", None)
                reasoning = getattr(delta, "reasoning_content", None)
                if reasoning:
                    yield "reasoning", reasoning
                piece = choice.text if self.base else delta.content  # type: ignore[union-attr]
                if piece and not reply and self.base:
                    piece = piece.lstrip()  # "Assistant: Hi" continues with " Hi"
                if piece:
                    reply.append(piece)
                    yield "content", piece
                    tail = (tail + piece)[-RUNAWAY_TAIL:]
                    if runaway(tail):
                        yield "runaway", ""
                        break
        finally:
            if stream is not None:
                stream.close()
            if reply:
                self.history.append({"role": "assistant", "content": "".join(reply)})
            else:  # nothing came back: forget the question too, so the turns stay paired
                self.history.pop()


def _print_reply(chat: Chat, text: str, interactive: bool) -> bool:
    """Stream one reply to stdout; False when the server refused or failed the turn."""
    import openai

    pieces = chat.send(text)
    try:
        for kind, piece in pieces:
            if kind == "reasoning":
                if interactive:
                    err.print(escape(piece), end="", style="dim", highlight=False)
                continue
            if kind == "runaway":
                sys.stdout.write("\n")
                err.print("[dim](stopped: the reply kept repeating itself)[/dim]", highlight=False)
                continue
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        err.print("[dim](stopped)[/dim]")
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
        pieces.close()  # ends the HTTP stream now (Ctrl-C) and files the reply in the history
    sys.stdout.write("\n")
    sys.stdout.flush()
    return True


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(exc)


def _lines(interactive: bool) -> Iterator[str]:
    """User input: prompts on a terminal, plain lines from a pipe. Ends on EOF."""
    if not interactive:
        for line in sys.stdin:
            yield line.rstrip("\r\n")
        return
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    while True:
        try:
            yield input(">>> ")
        except EOFError:
            sys.stdout.write("\n")
            return
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            err.print("[dim]Use /exit or Ctrl-D to leave.[/dim]")


def repl(chat: Chat, interactive: bool) -> int:
    """Runs the conversation; returns how many turns failed."""
    failed = 0
    if interactive:
        err.print(f"Chatting with [bold]{escape(chat.model)}[/bold]. {HELP}", highlight=False)
    for line in _lines(interactive):
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            break
        if text == "/clear":
            chat.clear()
            if interactive:
                err.print("[dim]Conversation cleared.[/dim]")
            continue
        if text in ("/help", "/?"):
            err.print(HELP)
            continue
        failed += not _print_reply(chat, text, interactive)
    return failed


def _is_loaded(c: ServerClient, model: str) -> bool:
    """Whether `model` (an alias resolves to its target) is loaded; unknown models fail here with the
    server's 404 message, before anything starts."""
    from urllib.parse import quote

    obj = c.get(f"/v1/models/{quote(model, safe='')}") or {}
    name = obj.get("alias_target") or obj.get("id", model)
    loaded = (c.get("/v1/health") or {}).get("all_models_loaded") or []
    return any(m.get("model_name") == name for m in loaded)


def run(
    model: Annotated[str, typer.Argument(help="Model name (or alias), e.g. gemma-3-270m-q4_k_m")],
    ctx_size: CtxOpt = None, llamacpp_args: ArgsOpt = None, llamacpp_backend: BackendOpt = None,
    system: Annotated[str | None, typer.Option("--system", help="System prompt for the conversation")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Longest reply, in tokens")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="Sampling temperature")] = None,
    repeat_penalty: Annotated[float | None, typer.Option("--repeat-penalty", help="Penalty for repeated tokens "
                                                         "(llama.cpp; 1.0 = off), helps small base models")] = None,
    base: Annotated[bool, typer.Option("--base", help="The model is a base model (no chat template): talk to it "
                                       "through a conversation transcript on /v1/completions")] = False,
    no_start: Annotated[bool, typer.Option("--no-start", help="Fail instead of starting a server")] = False,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Chat with a model: starts a server in the background if none runs, loads the model, opens a chat."""
    c = client(host, port)
    if not c.is_running():
        if no_start:
            raise c.not_running()
        start_background(c)
    body = load_body(model, ctx_size, llamacpp_args, llamacpp_backend)
    if len(body) > 1 or not _is_loaded(c, model):  # a loaded model with no new options is used as it is
        err.print(f"[green]{escape(do_load(c, body))}[/green]", highlight=False)
    interactive = sys.stdin.isatty()
    try:
        failed = repl(Chat(c, model, system, max_tokens, temperature, repeat_penalty, base), interactive)
    except BrokenPipeError:  # `... | lemonade run M | head -1`: the reader is gone, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    if failed and not interactive:  # scripts must see that a turn failed
        raise typer.Exit(EXIT_ERROR)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
