"""`lemonade`: the command-line tool. Every command except `serve` is an HTTP client of the server."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import typer
from typer.models import CommandInfo, TyperInfo

from lemonade.cli.engine_flags import with_engine_flags
from lemonade.cli.help_format import plain_help
from lemonade.cli.parsing import LemonadeGroup, skip_coercing_absent_values

app = typer.Typer(help="Lemonade: local AI server and its command-line client.", no_args_is_help=True,
                  add_completion=False, cls=LemonadeGroup)

# The root help groups commands as guide-cli.md does; commands not named here go under "Commands".
PANELS = {
    "Quick Start": ("run", "chat", "launch"),
    "Server": ("serve", "status", "stop", "logs", "open", "backends", "cloud", "config", "scan", "telemetry",
               "worker"),
    "Model Management": ("list", "pull", "alias", "import", "delete", "load", "unload", "pin", "unpin", "export",
                         "check-updates"),
    "Inference": ("transcribe", "speak", "generate", "upscale"),
    "Benchmarking": ("bench",),
}


def _version(value: bool) -> None:
    if value:
        from lemonade import __version__

        typer.echo(f"lemonade {__version__}")
        raise typer.Exit()


def _help_all(ctx: typer.Context, value: bool) -> None:
    if value:
        from lemonade.cli.parsing import print_help_all

        print_help_all(ctx.find_root())
        raise typer.Exit()


@app.callback()
def _root(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the lemonade CLI version and exit"),
          help_all: bool = typer.Option(False, "--help-all", callback=_help_all, is_eager=True,
                                        help="Display help information for all subcommands"),
          host: str | None = typer.Option(None, "--host", help="Server host, or its URL (default: LEMONADE_HOST, "
                                          "else LEMONADE_BASE_URL, else 127.0.0.1); also after the command"),
          port: int | None = typer.Option(None, "--port", help="Server port (default: LEMONADE_PORT, else 13305); "
                                          "also after the command"),
          api_key: str | None = typer.Option(None, "--api-key", help="API key for the server (default: "
                                             "LEMONADE_ADMIN_API_KEY, else LEMONADE_API_KEY); also after the command"),
          discovery: bool = typer.Option(True, "--discovery/--no-discovery",
                                         help="When nothing says where the server is and none answers there, use "
                                              "one on this machine found by its UDP beacon")) -> None:
    """Lemonade: local AI server and its command-line client."""
    from lemonade.cli.target import TARGET, set_api_key

    set_api_key(api_key)
    TARGET.host, TARGET.port, TARGET.discovery = host, port, discovery


@app.command()
@with_engine_flags
def serve(
    host: str | None = typer.Option(None, help="Address to listen on (env LEMONADE_HOST)"),
    port: int | None = typer.Option(None, help="Port to listen on (env LEMONADE_PORT)"),
    websocket_port: str | None = typer.Option(None, help="Legacy dedicated WebSocket port (/realtime, /logs/stream; "
                                              "also served on --port): auto (default) or a number"),
    log_level: str | None = typer.Option(None, help="trace, debug, info, warning, error"),
    ctx_size: int | None = typer.Option(None, help="Default context size; -1 = automatic"),
    max_loaded_models: int | None = typer.Option(None, help="Models of each type kept loaded; -1 = unlimited"),
    extra_models_dir: str | None = typer.Option(None, help="Folder scanned for your own .gguf files"),
    offline: bool | None = typer.Option(None, "--offline/--online", help="Never touch the network"),
    open_app: bool = typer.Option(False, "--open", help="Open the web app in your browser once the server is up"),
    auto_tune: bool | None = typer.Option(None, "--auto-tune/--no-auto-tune",
                                          help="Apply this machine's auto-tune profile at load (default: on)"),
    broadcast: bool | None = typer.Option(None, "--broadcast/--no-broadcast",
                                          help="Send UDP discovery beacons so apps and `lemonade scan` find this "
                                               "server (default: the broadcast setting, on)"),
    engines: dict | None = None,
) -> None:
    """Start the server (foreground). Ctrl-C stops it and every engine it started."""
    # The engine flags (`--llamacpp`, `--llamacpp-args`) come from the engine descriptors: cli/engine_flags.py
    from lemonade.cli.target import TARGET
    from lemonade.server import serve as run

    host = host if host is not None else TARGET.host  # `lemonade --port 8000 serve` serves there too
    port = port if port is not None else TARGET.port

    overrides: dict = {}
    for key, value in (("host", host), ("port", port), ("websocket_port", websocket_port), ("log_level", log_level),
                       ("ctx_size", ctx_size), ("max_loaded_models", max_loaded_models),
                       ("extra_models_dir", extra_models_dir), ("offline", offline), ("auto_tune", auto_tune),
                       ("broadcast", broadcast)):
        if value is not None:
            overrides[key] = value
    overrides.update(engines or {})
    if overrides:
        from lemonade.config import ConfigError, validate_tree

        try:
            validate_tree(overrides)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    raise typer.Exit(run(overrides, open_app=open_app))


# Which module of lemonade.cli registers each command (in the order they are registered), so that
# running one command imports only its own module: `lemonade status` does not import `chat`'s or
# `bench`'s. tests/test_startup.py checks it against what the modules register.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "info": ("status", "list"),
    "residency": ("load", "unload", "pin", "unpin"),
    "run_cmd": ("run",),
    "chat_cmd": ("chat",),
    "transcribe_cmd": ("transcribe",),
    "alias_cmd": ("alias",),
    "config_cmd": ("config",),
    "backends_cmd": ("backends",),
    "background": ("stop",),
    "open_cmd": ("open", "logs"),
    "speech_cmd": ("speak",),
    "cloud_cmd": ("cloud",),
    "launch_cmd": ("launch",),
    "bench_cmd": ("bench",),
    "image_cmd": ("generate", "upscale"),
    "scan_cmd": ("scan",),
    "telemetry_cmd": ("telemetry",),
    "worker_cmd": ("worker",),  # llama.cpp RPC worker (scale-out)
    "models_cmd": ("pull", "delete", "check-updates", "export"),  # optional: see _register_commands
    "import_cmd": ("import",),
}
_VALUED_ROOT_OPTIONS = ("--host", "--port", "--api-key")
_REGISTERED: set[str] = set()


def command_in(args: list[str]) -> str | None:
    """The command an argument list runs: its first word that is neither a root option nor the
    value of one (None: no command, e.g. `lemonade --help`)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
        i += 2 if arg in _VALUED_ROOT_OPTIONS else 1
    return None


def _register_commands(command: str | None = None) -> None:
    """Register the client commands, which live in their own modules: only the module of `command`
    when one is named that some module registers (`serve` is this module's own), every module
    otherwise (the root help lists them all; an unknown name gets click's "No such command").
    `models_cmd` and `import_cmd` are optional (a build may leave them out)."""
    owners = [module for module, names in COMMAND_MODULES.items() if command in names]
    for module in [] if command == "serve" else owners or list(COMMAND_MODULES):
        if module in _REGISTERED or (module in ("models_cmd", "import_cmd")
                                     and importlib.util.find_spec("lemonade.cli.models_cmd") is None):
            continue
        importlib.import_module(f"lemonade.cli.{module}").register(app)
        _REGISTERED.add(module)
    panel_of = {name: panel for panel, names in PANELS.items() for name in names}
    order = {name: i for i, name in enumerate(n for names in PANELS.values() for n in names)}
    app.registered_commands.sort(key=lambda c: order.get(c.name or c.callback.__name__ if c.callback else "", 99))
    infos: list[CommandInfo | TyperInfo] = [*app.registered_commands, *app.registered_groups]
    for info_ in infos:
        name = info_.name or (info_.callback.__name__.replace("_", "-") if info_.callback else None)
        given = info_.rich_help_panel
        if (given is None or type(given).__name__ == "DefaultPlaceholder") and name in panel_of:
            info_.rich_help_panel = panel_of[name]


def main() -> None:
    skip_coercing_absent_values()
    plain_help()
    command = command_in(sys.argv[1:])
    _register_commands(command)
    if command == "bench":  # Lemonade's bench takes several values after one option: click, one a flag
        from lemonade.cli.bench_cmd import repeat_multi_values

        sys.argv[1:] = repeat_multi_values(sys.argv[1:])
    app(prog_name="lemonade")  # also when run as `python -m lemonade.cli.main`


if __name__ == "__main__":
    main()
