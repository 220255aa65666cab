"""Command-line shapes typer (click) does not read by itself, turned into ones it does.

- Global options anywhere: `lemonade status --host H` works like `lemonade --host H status`
  (guide-cli.md, "Global Options"). A global option written after the command moves to the front,
  unless that command has an option of the same name (`serve --host` is where to listen,
  `cloud install --api-key` is the provider's key).
- Options with several values, as the guide writes them: `--components A B C` (until the next
  option), `--checkpoint ROLE VALUE` (a pair; `--checkpoint VALUE` alone still means the main one).
- An option whose value may be left out (`launch codex -p`): given the default when none follows.

Each is a rewrite of the argument list before click parses it, so click's own errors and help
stay as they are. One more thing is typer's and changed here: an option given no value is not
coerced (`skip_coercing_absent_values`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import typer.core
from typer import _click as click  # typer's own copy of click, whose classes its commands are
from typer.core import TyperCommand, TyperGroup, TyperOption

GLOBAL_OPTIONS = ("--host", "--port", "--api-key", "--discovery", "--no-discovery")
ROLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")  # a checkpoint role: main, mmproj, text_encoder, vae, ...


def _options(cmd: click.Command) -> dict[str, int]:
    """Option name -> how many values follow it, for every option `cmd` declares."""
    out: dict[str, int] = {}
    for param in cmd.params:
        if isinstance(param, TyperOption):
            takes = 0 if (param.is_flag or param.count) else max(param.nargs, 1)
            for name in (*param.opts, *param.secondary_opts):
                out[name] = takes
    return out


def _subcommands(cmd: click.Command) -> dict[str, click.Command]:
    return getattr(cmd, "commands", None) or {}


def hoist_globals(root: click.Command, args: list[str]) -> list[str]:
    """`args` with the global options found after the command moved before it."""
    takes_root = _options(root)
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":  # options given before the command
        name = args[i].split("=", 1)[0]
        i += 1 + (takes_root.get(name, 0) if "=" not in args[i] else 0)
    if i >= len(args) or args[i] not in _subcommands(root):
        return args
    cmd = _subcommands(root)[args[i]]
    own = _options(cmd)
    front, kept = args[:i], [args[i]]
    rest = args[i + 1:]
    j = 0
    while j < len(rest):
        tok = rest[j]
        if tok == "--":
            kept += rest[j:]
            break
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if tok.startswith("-") and name not in own and name in GLOBAL_OPTIONS:
            width = 1 if "=" in tok else 1 + takes_root.get(name, 0)
            front += rest[j:j + width]
            j += width
            continue
        if not tok.startswith("-") and tok in _subcommands(cmd):
            cmd = _subcommands(cmd)[tok]  # a subcommand: its options from here on
            own = _options(cmd)
        kept.append(tok)
        j += 1
        if tok.startswith("-") and "=" not in tok:  # its values are never mistaken for options or commands
            width = own.get(name, 0)
            kept += rest[j:j + width]
            j += width
    return front + kept


def expand_values(args: list[str], greedy: dict[str, str], pairs: tuple[str, ...],
                  optional: dict[str, str]) -> list[str]:
    """Rewrite multi-value and optional-value options into repeated single-value ones.

    greedy: `--components A B` -> `--component A --component B` (option -> repeatable option).
    pairs: `--checkpoint ROLE VALUE` -> `--checkpoint ROLE=VALUE` when ROLE looks like a role name.
    optional: `-p` with no value after it -> `-p DEFAULT`.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            out += args[i:]
            break
        following = [a for a in args[i + 1:i + 3]]
        if tok in greedy:
            j = i + 1
            while j < len(args) and not args[j].startswith("-"):
                out += [greedy[tok], args[j]]
                j += 1
            if j == i + 1:
                out.append(greedy[tok])  # no value: click says so
            i = j
            continue
        if tok in pairs and len(following) == 2 and not any(a.startswith("-") for a in following) \
                and ROLE.match(following[0]):
            out += [tok, f"{following[0]}={following[1]}"]
            i += 3
            continue
        if tok in optional and (not following or following[0].startswith("-")):
            out += [tok, optional[tok]]
            i += 1
            continue
        out.append(tok)
        i += 1
    return out


class RewritingCommand(TyperCommand):
    """A command whose argument list goes through `expand_values` first; subclasses say how."""

    greedy: ClassVar[dict[str, str]] = {}
    pairs: ClassVar[tuple[str, ...]] = ()
    optional: ClassVar[dict[str, str]] = {}

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_values(list(args), self.greedy, self.pairs, self.optional))


class LemonadeGroup(TyperGroup):
    """The root command: global options are read wherever they are written."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_globals(self, list(args)))


def print_help_all(ctx: click.Context) -> None:
    """`lemonade --help-all`: the help of the root command, then of every command and subcommand."""
    root = ctx.command

    def walk(cmd: click.Command, name: str, parent: click.Context | None) -> None:
        sub = click.Context(cmd, info_name=name, parent=parent)
        if parent is not None:
            click.echo(f"\n{'=' * 20} {sub.command_path} {'=' * 20}")
        text: Any = cmd.get_help(sub)  # rich help prints itself and returns nothing
        if text:
            click.echo(text)
        for sub_name, child in _subcommands(cmd).items():
            if not child.hidden:
                walk(child, sub_name, sub)

    walk(root, ctx.info_name or "lemonade", None)


def skip_coercing_absent_values() -> None:
    """An option or argument given no value (None) is passed on without typer's coercion.

    Why: typer (0.29) builds a pydantic TypeAdapter for each parameter on its first value, None
    included, although its coercion gives None back unchanged (`RuntimeParam.coerce`). So every
    command imported pydantic and built an adapter for each option left out: `lemonade status`
    spent about a third of its time so (docs/performance.md, "Start-up"). What typer does after the
    coercion (the missing-value check, the callback) still runs, and a given value is coerced by
    typer as before; tests/test_startup.py runs one app through the stock and the patched typer and
    compares every outcome. A typer without the parts this replaces is left as it is.
    """
    param = getattr(typer.core, "_TyperParameter", None)
    original = getattr(param, "process_value", None)
    runtime = getattr(getattr(typer, "_coercion", None), "RuntimeParam", None)
    if original is None or getattr(original, "skips_absent", False) or not all(
            hasattr(param, name) for name in ("get_runtime_param", "value_is_missing")) \
            or not hasattr(runtime, "coerce"):
        return

    def process_value(self: Any, ctx: click.Context, value: Any) -> Any:
        if value is not None or self.multiple or self.nargs == -1:
            return original(self, ctx, value)
        if self.required and self.value_is_missing(value):
            raise click.exceptions.MissingParameter(ctx=ctx, param=self)
        return self.callback(ctx, self, value) if self.callback is not None else value

    process_value.skips_absent = True  # type: ignore[attr-defined]
    param.process_value = process_value  # type: ignore[union-attr]
