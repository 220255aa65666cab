"""The recipe options `lemonade load` and `lemonade run` take (guide-cli.md, "Options for load").

One table, `FLAGS`: each command-line flag, the `/v1/load` option it sets, and the help panel it
is listed under. `with_load_options` adds them all to a command, so `load` and `run` can never
offer different sets. The general options are written here; every engine's flags (its backend, its
arguments, its model options) are derived from its descriptor (backends/<engine>/descriptor.py), as
the engine's options are, so they cannot drift apart, and `lemonade --help` imports no engine. A test
checks that every option an engine takes has its flag.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from lemonade.backends.descriptor import Descriptor
from lemonade.backends.descriptors import DESCRIPTORS

GENERAL = "General Options"


@dataclass(frozen=True)
class Flag:
    decls: tuple[str, ...]  # "--llamacpp" (or "--merge-args/--no-merge-args"), then other names
    key: str  # the /v1/load option
    type: type
    help: str
    panel: str
    metavar: str | None = None
    from_text: Callable[[str], Any] | None = None  # the option's value from the flag's text, when not the text

    @property
    def param(self) -> str:
        return "opt_" + self.key.replace("-", "_")  # `sd-cpp_backend` is no Python name

    def value(self, given: Any) -> Any:
        return self.from_text(given) if self.from_text is not None and isinstance(given, str) else given


def _flag_type(types: type | tuple[type, ...]) -> type:
    """The one type typer parses a flag's text as: a number option's widest, else text."""
    kinds = types if isinstance(types, tuple) else (types,)
    for kind in (float, int, bool):
        if kind in kinds:
            return kind
    return str


def _engine_flags(descriptor: Descriptor) -> list[Flag]:
    """An engine's load flags, from its descriptor: its backend, its arguments, the settings a model may
    set for itself, and its model options."""
    panel = descriptor.load_panel
    flags: list[Flag] = []
    if descriptor.backend_option and descriptor.section:
        flags.append(Flag((f"--{descriptor.section}", f"--{descriptor.section}-backend"), descriptor.backend_option,
                          str, descriptor.backend_help(), panel, "BACKEND"))
    if descriptor.args_option:
        flags.append(Flag((f"--{descriptor.args_option.replace('_', '-')}",), descriptor.args_option, str,
                          descriptor.args_option_help, panel, "ARGS"))
    flags += [Flag((f"--{s.option.replace('_', '-')}",), s.option, _flag_type(s.option_type), s.option_help or s.help,
                   panel, s.metavar, s.from_text) for s in descriptor.settings if s.option]
    flags += [Flag((f"--{o.name.replace('_', '-')}",), o.name, _flag_type(o.type), o.help, panel, o.metavar)
              for o in descriptor.model_options]
    return flags


FLAGS: tuple[Flag, ...] = (
    Flag(("--ctx-size",), "ctx_size", int, "Context size in tokens; -1 = automatic", GENERAL, "SIZE"),
    Flag(("--merge-args/--no-merge-args",), "merge_args", bool, "Merge the server-wide and this model's *_args "
         "(default); --no-merge-args: the model's replace the server-wide ones entirely", GENERAL),
    Flag(("--auto-evict/--no-auto-evict",), "auto_evict", bool, "Unload this model after it idles for "
         "--evict-idle-timeout (default: the server's auto_evict)", GENERAL),
    Flag(("--evict-idle-timeout",), "evict_idle_timeout", float, "Seconds idle before an auto-evicted model is "
         "unloaded", GENERAL, "SECONDS"),
    Flag(("--downsize-idle-timeout",), "downsize_idle_timeout", float, "Seconds idle before the model's dynamic "
         "memory is freed (weights stay)", GENERAL, "SECONDS"),
    Flag(("--evict-weight-factor",), "evict_weight_factor", float, "How strongly this model resists eviction "
         "(higher stays longer)", GENERAL, "FACTOR"),
    *(flag for descriptor in DESCRIPTORS.values() for flag in _engine_flags(descriptor)),
)


def with_load_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` gains every flag of `FLAGS`; it receives those given as `options` (a /v1/load dict)."""
    added = [inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[f.type | None, typer.Option(
                                   *f.decls, help=f.help, rich_help_panel=f.panel, metavar=f.metavar,
                                   show_default=False)])
             for f in FLAGS]

    def options(given: dict[str, Any]) -> dict[str, Any]:
        return {f.key: f.value(given[f.param]) for f in FLAGS if given[f.param] is not None}

    return with_options(func, "options", added, options)


def with_options(func: Callable[..., Any], into: str, added: list[inspect.Parameter],
                 collect: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """`func` gains the keyword parameters `added` (typer options); `collect` turns their values (None
    where not given) into what `func` receives as its parameter `into`."""
    sig = inspect.signature(func, eval_str=True)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != into]
    names = [p.name for p in added]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name in names}
        return func(**kwargs, **{into: collect(given)})

    params = [*own, *added]
    # typer reads the signature and the annotations: both are the new ones, already evaluated
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__
    return wrapper
