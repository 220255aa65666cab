"""Every recipe this server knows, each with its engine description.

`ENGINE_CLASSES` are the engines this build ships: the class of each folder backends/descriptors.py
names. `UNAVAILABLE` lists the other recipes of Lemonade's catalog so that their models are listed
and refused truthfully (backend names as upstream, the options they take; the modes they would
serve are in recipes.py). Adding an engine: docs/architecture.md, "Adding an engine".
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.descriptors import DESCRIPTORS
from lemonade.backends.engine import Engine, Option, UnavailableEngine
from lemonade.recipes import RECIPES, recipe_modes

if TYPE_CHECKING:
    from lemonade.config import Config

# Each engine folder's class (`backends/<name>/engine.py`, the class its descriptor names), in the
# order of backends/descriptors.py `ENGINES`.
ENGINE_CLASSES: tuple[type[Engine], ...] = tuple(
    getattr(import_module(f"lemonade.backends.{name}.engine"), descriptor.engine_class)
    for name, descriptor in DESCRIPTORS.items())


_CTX = {"ctx_size": Option(int, "ctx_size")}
# recipe -> (modes, default first; backends; options)
UNAVAILABLE: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict[str, Option]]] = {
    "flm": (RECIPES["flm"].modes, ("npu",), _CTX),
    "ryzenai-llm": (RECIPES["ryzenai-llm"].modes, ("npu",), _CTX),
    "acestep": (RECIPES["acestep"].modes, ("default",), {}),
    "thinksound": (RECIPES["thinksound"].modes, ("default",), {}),
    "trellis": (RECIPES["trellis"].modes, ("default",), {}),
}


class Engines:
    """The engine descriptions bound to one server's cache dir and config."""

    def __init__(self, cache_dir: Path, config: Config) -> None:
        self._engines: dict[str, Engine] = {cls.recipe: cls(cache_dir, config) for cls in ENGINE_CLASSES}
        for recipe, (modes, backends, options) in UNAVAILABLE.items():
            self._engines.setdefault(recipe, UnavailableEngine(cache_dir, config, recipe, modes, backends, options))

    def get(self, recipe: str) -> Engine | None:
        return self._engines.get(recipe)

    def replace(self, engine: Engine) -> None:
        """Serve `engine.recipe` with this description instead (the fast test layer's engine stand-in,
        tests/standin, speaks llama-server's protocol in place of llama-server)."""
        self._engines[engine.recipe] = engine

    def __iter__(self) -> Iterator[Engine]:
        return iter(self._engines.values())

    def available(self, recipe: str) -> bool:
        engine = self._engines.get(recipe)
        return engine is not None and engine.available

    def system_info(self) -> dict[str, Any]:
        """The `recipes` object of `/v1/system-info`."""
        return {engine.recipe: engine.system_info() for engine in self}


def recipe_options(recipe: str) -> dict[str, Option]:
    """The options a recipe's engine takes (the router's common ones are not included)."""
    for cls in ENGINE_CLASSES:
        if cls.recipe == recipe:
            return dict(cls.options)
    spec = UNAVAILABLE.get(recipe)
    return dict(spec[2]) if spec else {}


def all_option_names() -> set[str]:
    names = {k for cls in ENGINE_CLASSES for k in cls.options}
    return names | {k for spec in UNAVAILABLE.values() for k in spec[2]}


def args_options() -> dict[str, str]:
    """`*_args` option -> its server-wide config key, for every engine that has one."""
    out: dict[str, str] = {}
    for recipe in recipe_modes():
        for key, opt in recipe_options(recipe).items():
            if key.endswith("_args") and opt.config_key:
                out[key] = opt.config_key
    return out
