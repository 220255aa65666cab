"""What of an engine can be tuned, in terms the rest of the server can use without naming a recipe.

`lemonade bench` varies performance parameters (threads, batch, ubatch, parallel slots, context)
and auto-tune profiles set them; both speak of "threads = 2", and this module turns that into the
recipe option that carries it (`llamacpp_args: "-t 2"`), from the engine classes' own description
(`Engine.tuning_flags`, `args_option`, `backend_option`).
"""

from __future__ import annotations

import shlex
from typing import Any

from lemonade.backends.engine import Engine
from lemonade.backends.registry import ENGINE_CLASSES, UNAVAILABLE

CTX_PARAM = "ctx_size"  # the context size is an option of its own, not a flag in the args


def _engine(recipe: str) -> type[Engine] | None:
    return next((cls for cls in ENGINE_CLASSES if cls.recipe == recipe), None)


def tuning_params(recipe: str) -> list[str]:
    """The parameters a bench grid may vary for this recipe (empty: the engine has none)."""
    cls = _engine(recipe)
    if cls is None or not cls.tuning_flags:
        return []
    out = list(cls.tuning_flags)
    if CTX_PARAM in cls.options:
        out.append(CTX_PARAM)
    return out


def backends_of(recipe: str) -> tuple[str, ...]:
    """Every backend name of a recipe (also of recipes this build cannot run)."""
    cls = _engine(recipe)
    if cls is not None:
        return tuple(cls.backends)
    spec = UNAVAILABLE.get(recipe)
    return tuple(spec[1]) if spec else ()


def backend_option(recipe: str) -> str | None:
    cls = _engine(recipe)
    return cls.backend_option if cls else None


def args_option(recipe: str) -> str | None:
    cls = _engine(recipe)
    return cls.args_option if cls else None


def params_to_options(recipe: str, params: dict[str, Any]) -> dict[str, Any]:
    """{"threads": 2, "ctx_size": 4096} -> {"llamacpp_args": "-t 2", "ctx_size": 4096}. A value of
    None means "the engine's own default" and adds nothing. Unknown parameters raise ValueError."""
    cls = _engine(recipe)
    flags = dict(cls.tuning_flags) if cls else {}
    known = tuning_params(recipe)
    argv: list[str] = []
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name not in known:
            raise ValueError(f"'{name}' is not a tuning parameter of recipe '{recipe}' "
                             f"(it has: {', '.join(known) or 'none'})")
        if value is None:
            continue
        if name == CTX_PARAM:
            out[CTX_PARAM] = value
        else:
            argv += [flags[name], str(value)]
    if argv and cls is not None and cls.args_option:
        out[cls.args_option] = shlex.join(argv)
    return out
