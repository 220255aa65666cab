"""`--help` as Lemonade's own CLI prints it: plain text, with each option under its group's heading
("General Options:", "Llama.cpp Backend Options:", ...) and the root's commands under theirs
("Quick Start:", "Server:", ...), the groups of guide-cli.md.

Why not typer's rich panels: Lemonade's users, their scripts and its own tests read the help as
text (a heading line, then one line per flag starting with the flag), which a box drawn around each
group breaks; and the rich formatter imports rich's Markdown and traceback machinery, a third of
what `lemonade --help` took to start (docs/performance.md, "Start-up"). A group is typer's
`rich_help_panel` of the option or command, so the declarations stay as typer documents them.
"""

from __future__ import annotations

from typing import Any

from typer import _click as click  # typer's own copy of click, whose classes its commands are
from typer.core import TyperCommand, TyperGroup


def _sections(records: list[tuple[str, tuple[str, str]]], first: tuple[str, ...]) -> list[tuple[str, list]]:
    """(heading, help records) in order: the `first` headings, then the others as they appear."""
    grouped: dict[str, list[tuple[str, str]]] = {}
    for heading, record in records:
        grouped.setdefault(heading, []).append(record)
    order = [h for h in first if h in grouped] + [h for h in grouped if h not in first]
    return [(h, grouped[h]) for h in order]


def format_options(self: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """Arguments, then ungrouped options, then each group of options under its own heading."""
    records = []
    for param in self.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            plain = "Arguments" if param.param_type_name == "argument" else "Options"
            records.append((getattr(param, "rich_help_panel", None) or plain, record))
    for heading, rows in _sections(records, ("Arguments", "Options")):
        with formatter.section(heading):
            formatter.write_dl(rows)
    if isinstance(self, TyperGroup):
        format_commands(self, ctx, formatter)


def format_commands(self: TyperGroup, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """A group's visible commands under their panels' headings; the others under "Commands"."""
    commands = [(name, cmd) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
    if not commands:
        return
    limit = formatter.width - 6 - max(len(name) for name, _ in commands)
    records = [(getattr(cmd, "rich_help_panel", None) or "Commands", (name, cmd.get_short_help_str(limit)))
               for name, cmd in commands]
    for heading, rows in _sections(records, ()):
        with formatter.section(heading):
            formatter.write_dl(rows)


def plain_help() -> None:
    """Make every typer command print the plain, grouped help above (idempotent)."""
    for cls in (TyperCommand, TyperGroup):
        if getattr(cls.format_help, "plain", False):
            continue
        rich_help = cls.format_help

        def format_help(self: Any, ctx: click.Context, formatter: click.HelpFormatter,
                        _rich_help: Any = rich_help) -> None:
            self.rich_markup_mode = None  # typer's own plain path, which calls format_options below
            _rich_help(self, ctx, formatter)

        format_help.plain = True  # type: ignore[attr-defined]
        cls.format_help = format_help  # type: ignore[method-assign]
        cls.format_options = format_options  # type: ignore[method-assign]
