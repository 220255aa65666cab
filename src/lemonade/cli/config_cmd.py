"""`lemonade config` / `lemonade config get [KEY]` / `lemonade config set KEY=VALUE ...`.

`lemonade config` alone shows every setting as Lemonade's CLI does: a table by section, each key as
`config set` takes it (`llamacpp.args`); `config get` prints JSON (one value raw), for scripts.

With a server running, both go through it (`GET /internal/config`, `POST /internal/set`), so a
change is validated, persisted and applied live by the process that owns the file. Without one
they read and write `config.json` in the config dir directly, with the same validation
(`lemonade.config`), so a fresh machine can be configured before the first `lemonade serve`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, client, err, fail, out
from lemonade.config import Config, ConfigError, flatten, parse_cli_value, validate_tree
from lemonade.legacy_state import MigrationError, local_config_dir

config_app = typer.Typer(help="Read and change server settings (config.json), through the running server or on "
                              "disk when none runs.")


@config_app.callback(invoke_without_command=True)
def _config(ctx: typer.Context, host: HostOpt = None, port: PortOpt = None) -> None:
    """`lemonade config` alone shows every setting, by section."""
    if ctx.invoked_subcommand is None:
        typer.echo(table(current(host, port)), nl=False)


def table(values: dict[str, Any]) -> str:
    """Settings by section: `[General]` for the top-level ones, then one section per nested object,
    each key dotted as `config set` takes it; a value as `config set` would read it back."""
    sections: dict[str, dict[str, Any]] = {"General": {}}
    for key, value in flatten(values).items():
        section = key.split(".", 1)[0] if "." in key else "General"
        sections.setdefault(section, {})[key] = value
    width = max((len(k) for rows in sections.values() for k in rows), default=0) + 4
    lines = ["Server Configuration", "-" * (width + 30)]
    for name, rows in sections.items():
        if not rows:
            continue
        lines += ["", f"  [{name}]"]
        for key, value in rows.items():
            text = value if isinstance(value, str) else json.dumps(value)
            lines.append(f"  {key:<{width}}{text if text != '' else '(empty)'}")
    return "\n".join(lines) + "\n"


def current(host: str | None, port: int | None) -> dict[str, Any]:
    """Every setting: the running server's, else config.json's with the defaults (said on stderr)."""
    c = client(host, port, discover=False)
    if c.is_running():
        return c.get("/internal/config")
    try:
        config = Config(local_config_dir(), environ={})
    except (ConfigError, MigrationError) as exc:
        raise fail(str(exc)) from None
    err.print(f"[dim]No server running at {escape(c.url)}; showing {escape(str(config.path))} "
              "(with defaults).[/dim]", highlight=False)
    return config.values


def dotted(key: str) -> str:
    """`vllm_args` (a flag's spelling, as the docs use it) -> `vllm.args`; any other key as given."""
    from lemonade.config import DEFAULTS

    if "." in key or key in DEFAULTS:
        return key
    for section, value in DEFAULTS.items():
        if isinstance(value, dict) and key.startswith(section + "_") and key[len(section) + 1:] in value:
            return f"{section}.{key[len(section) + 1:]}"
    return key


def parse_assignments(pairs: list[str]) -> dict[str, Any]:
    """`["llamacpp.args=--x 1", "max_loaded_models=2", "vllm_args=..."]` -> validated nested partial object."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = dotted(key.strip())
        if not sep or not key:
            raise ConfigError(f"Expected KEY=VALUE, got '{pair}' (e.g. max_loaded_models=2)")
        value = parse_cli_value(key, raw)
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"Config key '{key}' conflicts with '{part}' given as a value")
            node = child
        node[parts[-1]] = value
    validate_tree(tree)  # the same checks the server and set_on_disk run, before anything is sent
    return tree


def lookup(values: dict[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"Unknown config key '{key}'")
        node = node[part]
    return node


def show(value: Any) -> None:
    """Strings raw (easy to use in shell scripts), everything else as JSON."""
    if isinstance(value, str):
        typer.echo(value)
    else:
        typer.echo(json.dumps(value, indent=2 if isinstance(value, dict) else None))


@config_app.command("get")
def get(key: Annotated[str | None, typer.Argument(help="Dot path, e.g. llamacpp.args; omit for everything")] = None,
        host: HostOpt = None, port: PortOpt = None) -> None:
    """Print one setting, or all of them as JSON."""
    values = current(host, port)
    try:
        show(lookup(values, key) if key else values)
    except ConfigError as exc:
        raise fail(str(exc), EXIT_USAGE) from None


@config_app.command("set", no_args_is_help=True)
def set_(assignments: Annotated[list[str], typer.Argument(help="KEY=VALUE pairs, e.g. max_loaded_models=2 "
                                                               "llamacpp.args=\"--threads 4\"")],
         host: HostOpt = None, port: PortOpt = None) -> None:
    """Change settings; all are validated first, and nothing is written if one is refused."""
    try:
        tree = parse_assignments(assignments)
    except ConfigError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    c = client(host, port, discover=False)
    if c.is_running():
        body = c.post("/internal/set", tree) or {}
        for k, v in flatten(body.get("updated") or {}).items():
            out.print(f"{escape(k)} = {escape(json.dumps(v))}", highlight=False)
        if body.get("warning"):
            err.print(f"[yellow]Warning:[/yellow] {escape(body['warning'])}", highlight=False)
        return
    from lemonade.config import set_on_disk

    try:
        folder = local_config_dir()
        changed = set_on_disk(folder, tree)
    except (ConfigError, MigrationError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    for k, v in changed.items():
        out.print(f"{escape(k)} = {escape(json.dumps(v))}", highlight=False)
    err.print(f"[dim]No server running; saved to {escape(str(folder / 'config.json'))}. "
              "It applies when the server starts.[/dim]", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
