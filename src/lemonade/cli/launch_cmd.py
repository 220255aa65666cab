"""`lemonade launch AGENT`: start a coding agent pointed at this server, with a chat model.

The server is found (or started in the background, as `lemonade run` does), a model chosen (the
one given, else the chat model already loaded, else a downloaded one, tool-calling first) and
loaded in the background while the agent starts, and the agent is run with the environment,
arguments and config file that point it here (`agents.py`). What was chosen and why, the
environment (keys masked) and the command are printed before the agent takes the terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape
from typer.core import TyperOption

from lemonade.cli.agents import AGENTS, DEFAULT_AGENT_KEY, Agent, split_args
from lemonade.cli.background import start_background
from lemonade.cli.client import WILDCARD_HOSTS, ServerClient, error_message
from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, client, err, fail
from lemonade.cli.parsing import RewritingCommand
from lemonade.cli.target import TARGET, api_key
from lemonade.labels import MODE_ALIASES
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")  # imported on first use (util/lazy.py)

KNOWN = ", ".join(AGENTS)


def find_program(agent: Agent) -> str | None:
    """The agent's executable: on PATH, else where its installers usually put it."""
    found = shutil.which(agent.program)
    if found:
        return found
    for candidate in agent.fallback_paths:
        path = Path(candidate).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def is_chat(obj: dict[str, Any]) -> bool:
    return not any(MODE_ALIASES.get(label, "chat") != "chat" for label in obj.get("labels") or [])


def choose_model(c: ServerClient, requested: str | None) -> tuple[dict[str, Any], str]:
    """(the model's `/v1/models` object, why it was chosen)."""
    if requested:
        obj = c.get(f"/v1/models/{quote(requested, safe='')}") or {}
        if not is_chat(obj):
            raise fail(f"Model {requested} is not a chat model (labels: {', '.join(obj.get('labels') or [])}); "
                       "coding agents need one. See: lemonade list", EXIT_USAGE)
        return obj, "as asked (--model)"
    loaded = [m for m in (c.get("/v1/health") or {}).get("all_models_loaded") or [] if m.get("type") == "llm"]
    if loaded:
        name = max(loaded, key=lambda m: m.get("last_use") or 0)["model_name"]
        return c.get(f"/v1/models/{quote(name, safe='')}") or {"id": name}, "the chat model already loaded"
    models = [m for m in (c.get("/v1/models") or {}).get("data") or [] if is_chat(m) and not m.get("components")]
    if not models:
        raise fail("No chat model is downloaded yet. Pull one (e.g. lemonade pull Qwen3-0.6B-GGUF), or pass "
                   "--model NAME.")
    tools = [m for m in models if "tool-calling" in (m.get("labels") or [])]
    pick = (tools or models)[0]
    why = "a downloaded chat model with tool calling" if tools else "the first downloaded chat model"
    return pick, why + (f" (of {len(models)}; pass --model to pick another)" if len(models) > 1 else "")


def loaded_names(c: ServerClient) -> set[str]:
    return {m.get("model_name") for m in (c.get("/v1/health") or {}).get("all_models_loaded") or []}


class BackgroundLoad:
    """`POST /v1/load` in a thread: the agent starts at once while the model loads (guide-cli.md)."""

    def __init__(self, c: ServerClient, model: str) -> None:
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, args=(c, model), daemon=True)
        self.thread.start()

    def _run(self, c: ServerClient, model: str) -> None:
        try:
            resp = c.http.post("/v1/load", json={"model_name": model}, timeout=None)
            if resp.status_code >= 400:
                self.error = error_message(resp)
        except httpx.HTTPError as exc:
            self.error = str(exc)


def ask_agent() -> str:
    """The agent to launch, read from stdin (a number or a name); also works with piped input."""
    names = list(AGENTS)
    err.print("Select an agent to launch:", highlight=False)
    for i, name in enumerate(names, 1):
        err.print(f"  {i}. {name}", highlight=False)
    err.print("Number or name: ", end="", highlight=False)
    answer = sys.stdin.readline().strip()
    if answer.isdigit() and 1 <= int(answer) <= len(names):
        answer = names[int(answer) - 1]
    if not answer:
        raise fail(f"No agent chosen. Name it: lemonade launch AGENT (agents: {KNOWN})", EXIT_USAGE)
    if answer not in AGENTS:
        raise fail(f"Unknown agent '{answer}'. Known agents: {KNOWN}. Run with --help for more information.",
                   EXIT_USAGE)
    err.print(f"Selected agent: {answer}", highlight=False)
    return answer


def import_recipe(c: ServerClient, directory: str, recipe_file: str | None) -> str:
    """Import a recipe of lemonade-sdk/recipes (`--directory`, `--recipe-file`, or picked from the
    directory's listing) and return the name of the model it registered."""
    from lemonade.cli.import_cmd import _browse, fetch_recipe, import_body
    from lemonade.cli.models_cmd import run_pull

    if recipe_file is None:
        if not sys.stdin.isatty():
            raise fail("--directory without --recipe-file needs a terminal to pick a recipe; add --recipe-file "
                       "NAME.json.", EXIT_USAGE)
        picked = _browse(directory)
        if picked is None:
            raise fail("No recipe chosen; nothing launched.")
        directory, recipe_file = picked
    raw, where = fetch_recipe(directory, recipe_file)
    try:
        body, _ = import_body(raw, where)
    except ValueError as exc:
        raise fail(str(exc)) from None
    c.timeout = None
    run_pull(c, body)
    return body["model_name"]


AGENT_OPTIONS = ("model", "directory", "recipe_file", "agent_args", "provider")  # one agent's launch options
CODEX_ONLY = ("provider",)


class LaunchCommand(RewritingCommand):
    """`-p` / `--provider` alone (codex): the provider named `lemonade` of the user's Codex config.

    Help as Lemonade's launch gives it: `launch --help` lists the agents, and `launch AGENT --help`
    that agent's options (`--provider` for codex alone). Every option is accepted either way."""

    optional = {"-p": "lemonade", "--provider": "lemonade"}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["launch.agent"] = next((a for a in args if a in AGENTS), None)
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        agent = ctx.meta.get("launch.agent")
        hide = set(AGENT_OPTIONS) if agent is None else set(CODEX_ONLY) if agent != "codex" else set()
        shown = [(p, p.hidden) for p in self.params if isinstance(p, TyperOption) and p.name in hide]
        for param, _ in shown:
            param.hidden = True
        try:
            super().format_help(ctx, formatter)
        finally:
            for param, hidden in shown:
                param.hidden = hidden


def agent_url(url: str, host: str | None) -> str:
    """The server's URL as an agent is given it: a wildcard listen address (`--host 0.0.0.0`), which
    the CLI itself reaches on 127.0.0.1, is written as `localhost`, as Lemonade's launch writes it."""
    given = host if host is not None else TARGET.host or os.environ.get("LEMONADE_HOST", "")
    if given.strip() in WILDCARD_HOSTS:
        return url.replace("://127.0.0.1:", "://localhost:", 1)
    return url


def launch(
    agent: Annotated[str | None, typer.Argument(help=f"Agent to launch: {KNOWN} (default: asked)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model to launch with (default: the loaded chat "
                                              "model, else a downloaded one)")] = None,
    directory: Annotated[str | None, typer.Option("--directory", help="Remote recipes directory (lemonade-sdk/"
                                                  "recipes) to import the model from, when no --model is given")]
    = None,
    recipe_file: Annotated[str | None, typer.Option("--recipe-file", help="Remote recipe JSON file name in "
                                                    "--directory")] = None,
    agent_args: Annotated[str | None, typer.Option("--agent-args", help="Custom arguments passed directly to the "
                                                   "agent, e.g. \"--resume SESSION\"")] = None,
    provider: Annotated[str | None, typer.Option("--provider", "-p", help="codex only: Use model provider name for "
                                                 "Codex config; Lemonade does not read or modify config.toml "
                                                 "(-p alone: lemonade)")] = None,
    no_start: Annotated[bool, typer.Option("--no-start", help="Fail instead of starting a server")] = False,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Launch a coding agent that uses this server and a model on it; the model loads in the background
    while the agent starts.

    Agents: claude, codex, opencode, pi. `lemonade launch AGENT --help` lists an agent's options.
    """
    if agent is not None and agent not in AGENTS:
        raise fail(f"Unknown agent '{agent}'. Known agents: {KNOWN}. Run with --help for more information.",
                   EXIT_USAGE)
    if provider is not None and agent is not None and agent != "codex":
        raise fail("--provider is only supported for 'lemonade launch codex'.", EXIT_USAGE)
    if recipe_file and not directory:
        raise fail("--recipe-file names a file of a remote recipes directory: give --directory too.", EXIT_USAGE)
    try:
        extra = split_args(agent_args)
    except ValueError as exc:
        raise fail(f"--agent-args: {exc}", EXIT_USAGE) from None
    if agent is None:
        agent = ask_agent()
        if provider is not None and agent != "codex":
            raise fail("--provider is only supported for 'lemonade launch codex'.", EXIT_USAGE)
    if model is not None:  # guide-cli.md: a given model skips the recipe import prompts (said as Lemonade says it)
        err.print("Model was provided explicitly; skipping recipe import prompts.", highlight=False)
    spec = AGENTS[agent]
    program = find_program(spec)
    if program is None:
        raise fail(f"Agent binary not found: '{spec.program}' was not found on PATH. {spec.install}")
    c = client(host, port)
    if not c.is_running():
        if no_start:
            raise c.not_running()
        start_background(c)
    if model is None and directory:
        model = import_recipe(c, directory, recipe_file)
    obj, why = choose_model(c, model)
    name = obj.get("alias_target") or obj["id"]
    loading = None if name in loaded_names(c) else BackgroundLoad(c, name)
    key = api_key() or DEFAULT_AGENT_KEY
    try:
        plan = spec.configure(agent_url(c.url, host), obj["id"], key,
                              {"provider": provider, "context": obj.get("context_length")})
    except ValueError as exc:
        raise fail(str(exc)) from None
    argv = [program, *plan.args, *extra]
    state = "loading in the background" if loading else "already loaded"
    err.print(f"Launching [bold]{agent}[/bold] with model [bold]{escape(obj['id'])}[/bold] ({escape(why)}; "
              f"{state}) against {escape(c.url)}.", highlight=False)
    for k, v in plan.shown_env.items():
        err.print(f"  {k}={escape(v)}", highlight=False)
    for path in plan.files:
        err.print(f"  wrote the {PROVIDER_LABEL} provider into {escape(str(path))}", highlight=False)
    err.print(f"  command: {escape(' '.join(argv))}", highlight=False)
    try:
        code = subprocess.call(argv, env={**os.environ, **plan.env})
    except OSError as exc:
        raise fail(f"Could not start {program}: {exc}") from None
    if loading is not None:
        loading.thread.join()
        if loading.error:
            err.print(f"[red]Loading {escape(name)} failed:[/red] {escape(loading.error)}", highlight=False)
    raise typer.Exit(code)


PROVIDER_LABEL = "Lemonade"


def register(app: typer.Typer) -> None:
    app.command("launch", cls=LaunchCommand)(launch)
