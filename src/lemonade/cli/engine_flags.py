"""The engine flags of `lemonade serve` (`--llamacpp`, `--llamacpp-args`), read from the engine descriptors.

Each flag a descriptor names (backends/<engine>/descriptor.py: `backend_flag`, `args_flag`, a
setting's `flag`) sets one key of the engine's config section for this run, with the descriptor's
help text, so the flags take what the config key takes and say what it says.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from lemonade.backends.descriptors import BY_SECTION

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
    sig = inspect.signature(func, eval_str=True)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != "engines"]
    added = [inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[f.type | None, typer.Option(
                                   f"--{f.flag}", help=f.help, rich_help_panel=PANEL, show_default=False)])
             for f in flags]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        engines: dict[str, dict[str, Any]] = {}
        for f in flags:
            value = kwargs.pop(f.param, None)
            if value is not None:
                engines.setdefault(f.section, {})[f.key] = value
        return func(**kwargs, engines=engines)

    params = [*own, *added]
    # typer reads the signature and the annotations: both are the new ones, already evaluated
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__
    return wrapper
