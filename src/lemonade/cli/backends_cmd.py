"""`lemonade backends [install|uninstall RECIPE:BACKEND]`: engines on this machine.

With a server running everything goes through it (`/v1/system-info`, `/v1/install` with SSE
progress, `/v1/uninstall`, which unloads the models using the backend first). Without one, the
same `BackendInstaller` runs in this process: a fresh machine must be able to install llama.cpp
before the server is ever started, and see the same progress.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_ERROR, EXIT_USAGE, HostOpt, JsonOpt, PortOpt, client, err, fail, out, print_json
from lemonade.cli.progress import ProgressView
from lemonade.cli.tables import backend_rows, backends_table

backends_app = typer.Typer(help="Engine backends: list their states, install or uninstall them.")
SpecArg = Annotated[str, typer.Argument(metavar="RECIPE:BACKEND", help="e.g. llamacpp:cpu")]


def parse_spec(spec: str) -> tuple[str, str]:
    recipe, sep, backend = spec.partition(":")
    if not sep or not recipe.strip() or not backend.strip():
        raise fail(f"Expected RECIPE:BACKEND (e.g. llamacpp:cpu), got '{spec}'", EXIT_USAGE)
    return recipe.strip(), backend.strip()


def _local_engines() -> Any:
    """The engine descriptions of this machine's cache dir, for when no server runs."""
    from lemonade.backends.registry import Engines
    from lemonade.config import Config
    from lemonade.paths import cache_dir, config_dir

    return Engines(cache_dir(), Config(config_dir(create=False)))


def _local_engine(recipe: str) -> Any:
    engine = _local_engines().get(recipe)
    if engine is None:
        raise fail(f"Unknown recipe '{recipe}'. Run `lemonade backends` to see the recipes.", EXIT_USAGE)
    return engine


def supported_only(recipes: dict[str, Any], hidden: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """`recipes` without the backends this machine cannot run (and recipes left with none), and without
    the `hidden` ones: recipes none of whose models this server offers (`/v1/system-info`
    `unavailable_recipes`, as upstream's CLI hides them)."""
    out: dict[str, Any] = {}
    for recipe, info in recipes.items():
        if not isinstance(info, dict) or recipe in hidden:
            continue
        backends = {b: st for b, st in (info.get("backends") or {}).items() if (st or {}).get("state") != "unsupported"}
        if backends:
            out[recipe] = {**info, "backends": backends}
    return out


@backends_app.callback(invoke_without_command=True)
def show(ctx: typer.Context, host: HostOpt = None, port: PortOpt = None, as_json: JsonOpt = False,
         show_all: Annotated[bool, typer.Option("--all", help="Also list the recipes and backends this machine "
                                                "cannot run, and recipes whose models are all too big for "
                                                "the memory the server may use")] = False) -> None:
    """Recipes and backends this machine supports, with their state (installed, installable, ...); --all
    lists every recipe and backend."""
    if ctx.invoked_subcommand is not None:
        return
    c = client(host, port, discover=False)
    hidden: list[str] = []
    if c.is_running():
        info = c.get("/v1/system-info") or {}
        recipes = info.get("recipes") or {}
        hidden = [r for r in info.get("unavailable_recipes") or [] if isinstance(r, str)]
    else:
        from lemonade.paths import cache_dir

        err.print(f"[dim]No server running at {escape(c.url)}; showing the backends in "
                  f"{escape(str(cache_dir()))}.[/dim]", highlight=False)
        recipes = _local_engines().system_info()
    if not show_all:
        recipes = supported_only(recipes, hidden)
    if as_json:
        print_json(backend_rows(recipes))
        return
    out.print(backends_table(recipes))


@backends_app.command("install")
def install(spec: SpecArg,
            force: Annotated[bool, typer.Option("--force", help="Reinstall even when up to date; install a backend "
                                                "this machine has no device for")] = False,
            host: HostOpt = None, port: PortOpt = None) -> None:
    """Install a backend (llamacpp:cpu downloads or builds llama.cpp; a no-op when installed)."""
    recipe, backend = parse_spec(spec)
    c = client(host, port, discover=False)
    title = f"Installing {recipe}:{backend}"
    if c.is_running():
        done: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        with ProgressView(title + f" through the server at {c.url}") as view:
            for event, data in c.sse("/v1/install", {"recipe": recipe, "backend": backend, "stream": True,
                                                     "force": force}):
                if event == "progress":
                    view.update(data)
                elif event == "complete":
                    done = data
                elif event == "error":
                    error = data
                    break
        if error is not None:  # the message carries the build log's tail and where the full log is
            raise fail(f"Installing {recipe}:{backend} failed:\n{error.get('error', error)}")
        if done is None:
            raise fail(f"The server closed the install stream for {recipe}:{backend} without a result; "
                       "see `lemonade backends` and the server log.")
        version = done.get("version")
    else:
        from lemonade.backends.engine import InstallError, fetch_refusal
        from lemonade.paths import backends_dir, cache_dir

        engine = _local_engine(recipe)
        try:
            engine.check_request(backend, force)
            refusal = fetch_refusal(engine.config, recipe, backend)
            if refusal and (force or engine.needs_install(backend)):
                raise fail(refusal)
            with ProgressView(f"{title} into {backends_dir(cache_dir()) / recipe} (no server running)") as view:
                result = engine.install(backend, view.update, force)
        except InstallError as exc:
            raise fail(f"Installing {recipe}:{backend} failed:\n{exc}") from None
        except KeyboardInterrupt:
            raise fail("Interrupted; nothing was installed. Run the same command again to resume the build.",
                       EXIT_ERROR) from None
        version = result.get("version")
    out.print(f"[green]{escape(recipe)}:{escape(backend)} is installed[/green]"
              + (f" (version {escape(str(version))})" if version else ""), highlight=False)


@backends_app.command("uninstall")
def uninstall(spec: SpecArg, host: HostOpt = None, port: PortOpt = None) -> None:
    """Remove an installed backend (models using it are unloaded first)."""
    recipe, backend = parse_spec(spec)
    c = client(host, port, discover=False)
    if c.is_running():
        result = c.post("/v1/uninstall", {"recipe": recipe, "backend": backend}) or {}
    else:
        from lemonade.backends.engine import InstallError

        try:
            engine = _local_engine(recipe)
            engine.check_request(backend)
            result = engine.uninstall(backend)
        except InstallError as exc:
            raise fail(str(exc)) from None
    message = result.get("message") or f"Uninstalled {recipe}:{backend}"
    out.print(escape(message), highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(backends_app, name="backends")
