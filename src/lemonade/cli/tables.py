"""Rich tables for the server's JSON: models, loaded models, aliases, backends.

Kept apart from the commands so that what a column shows is decided in one place, and so the
commands read as "ask the server, render the answer".
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from lemonade.cli.common import fmt_age, fmt_size, yes_no

STATE_STYLES = {"installed": "green", "installable": "yellow", "update_required": "yellow",
                "unsupported": "dim"}


def _t(value: Any) -> str:
    """Cell text: escaped so names like `[foo]` are not taken for rich markup."""
    if value is None or value == "":
        return "-"
    return escape(str(value))


def model_lines(models: list[dict[str, Any]]) -> list[str]:
    """A plain-text table of models (`lemonade list`): one row per model, whose first two words are
    its id (copy-paste-able into any other command) and Yes/No for downloaded, so scripts can split it."""
    rows = [(str(m.get("id")), "Yes" if m.get("downloaded") else "No", fmt_size(m.get("size")),
             str(m.get("recipe") or "-") + (f" ({', '.join(m['labels'])})" if m.get("labels") else ""))
            for m in models]
    header = ("Model Name", "Downloaded", "Size", "Details")
    widths = [max(len(r[i]) for r in [header, *rows]) + 2 for i in range(3)]

    def line(r: tuple[str, ...]) -> str:
        return f"{r[0]:<{widths[0]}}{r[1]:<{widths[1]}}{r[2]:>{widths[2] - 2}}  {r[3]}".rstrip()

    rule = "-" * max(len(line(r)) for r in [header, *rows])
    return [line(header), rule, *(line(r) for r in rows), rule]


def loaded_table(loaded: list[dict[str, Any]]) -> Table:
    table = Table(title="Loaded models", title_justify="left")
    for col in ("Model", "Type", "Recipe", "Backend", "Device", "Context", "PID", "Pinned", "Busy", "Last use"):
        table.add_column(col, no_wrap=col == "Model", style="bold" if col == "Model" else None)
    for m in loaded:
        busy = "streaming" if m.get("is_streaming") else yes_no(m.get("is_busy"))
        table.add_row(_t(m.get("model_name")), _t(m.get("type")), _t(m.get("recipe")), _t(m.get("backend")),
                      _t(m.get("device")), _t(m.get("context_length")), _t(m.get("pid")), yes_no(m.get("pinned")),
                      busy, fmt_age(m.get("last_use")))
    return table


def crashed_table(crashed: list[dict[str, Any]]) -> Table:
    table = Table(title="Crashed models", title_justify="left", title_style="red")
    for col in ("Model", "PID", "Exit code", "When", "Message"):
        table.add_column(col, no_wrap=col == "Model")
    for m in crashed:
        table.add_row(_t(m.get("model_name")), _t(m.get("pid")), _t(m.get("exit_code")), fmt_age(m.get("time")),
                      _t(m.get("message")))
    return table


def aliases_table(aliases: list[dict[str, Any]]) -> Table:
    table = Table(title="Aliases", title_justify="left")
    table.add_column("Alias", no_wrap=True, style="bold")
    table.add_column("Target", no_wrap=True)
    table.add_column("Recipe")
    table.add_column("Downloaded")
    for a in aliases:
        table.add_row(_t(a.get("alias")), _t(a.get("target")), _t(a.get("recipe")), yes_no(a.get("downloaded")))
    return table


def backend_rows(recipes: dict[str, Any]) -> list[dict[str, Any]]:
    """Flatten `/v1/system-info` `recipes` into one row per (recipe, backend)."""
    rows = []
    for recipe, info in recipes.items():
        if not isinstance(info, dict):
            continue
        default = info.get("default_backend")
        for backend, b in (info.get("backends") or {}).items():
            rows.append({"recipe": recipe, "backend": backend, "default": backend == default, **(b or {})})
    return rows


def backends_table(recipes: dict[str, Any]) -> Table:
    table = Table(title="Backends", title_justify="left")
    table.add_column("Recipe", no_wrap=True, style="bold")
    table.add_column("Backend", no_wrap=True)
    table.add_column("State", no_wrap=True)
    table.add_column("Version", no_wrap=True)
    table.add_column("Message")
    table.add_column("Action")
    for row in backend_rows(recipes):
        state = row.get("state") or "-"
        style = STATE_STYLES.get(state, "")
        backend = _t(row["backend"]) + (" (default)" if row["default"] else "")
        table.add_row(_t(row["recipe"]), backend, f"[{style}]{escape(state)}[/{style}]" if style else escape(state),
                      _t(row.get("version")), _t(row.get("message")), _t(row.get("action")))
    return table
