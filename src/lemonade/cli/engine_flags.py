"""The engine flags of `lemonade serve` (`--llamacpp`, `--llamacpp-args`), read from the engine descriptors.

Each flag a descriptor names (backends/<engine>/descriptor.py: `backend_flag`, `args_flag`, a
setting's `flag`) sets one key of the engine's config section for this run, with the descriptor's
help text, so the flags take what the config key takes and say what it says.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from lemonade.backends.descriptors import BY_SECTION
from lemonade.cli.load_options import with_options

PANEL = "Engine Options"


@dataclass(frozen=True)
class EngineFlag:
    flag: str  # without dashes: "llamacpp-args"
    section: str
    key: str  # the key of the section it sets
    type: type
    help: str

    @property
    def param(self) -> str:
        return "engine_" + self.flag.replace("-", "_")


def engine_flags() -> list[EngineFlag]:
    """Every `lemonade serve` flag the descriptors name, in registry order."""
    out = []
    for section, descriptor in BY_SECTION.items():
        defaults = descriptor.config_defaults()
        for flag, (key, help_text) in descriptor.serve_flags().items():
            out.append(EngineFlag(flag, section, key, type(defaults[key]), help_text))
    return out


def with_engine_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` gains every engine flag; it receives those given as `engines`, a partial config tree
    (`{"llamacpp": {"backend": "cpu"}}`)."""
    flags = engine_flags()
    added = [inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[f.type | None, typer.Option(
                                   f"--{f.flag}", help=f.help, rich_help_panel=PANEL, show_default=False)])
             for f in flags]

    def engines(given: dict[str, Any]) -> dict[str, dict[str, Any]]:
        tree: dict[str, dict[str, Any]] = {}
        for f in flags:
            if given[f.param] is not None:
                tree.setdefault(f.section, {})[f.key] = given[f.param]
        return tree

    return with_options(func, "engines", added, engines)
