"""The recipes a model can name, and what each serves (openai.md "Model Labels").

Which deployment modes a recipe serves, which modes it serves only with another label, and which
weight file format it loads are the catalog's vocabulary: the label rules (labels.py), the catalog
(a bare `.gguf` in the extra models dir is a llama.cpp model) and the CLI read them here without
importing any engine. A shipped engine's entry is its descriptor's (backends/<engine>/descriptor.py,
data only), and each engine class gets its `modes`, `label_modes` and `file_format` from it
(`Engine.__init_subclass__`). Recipes whose engine this build does not ship are written here, so
that their models are listed and refused truthfully (backends/registry.py `UNAVAILABLE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lemonade.backends.descriptors import DESCRIPTORS


@dataclass(frozen=True)
class Recipe:
    modes: tuple[str, ...]  # deployment modes it serves, default first
    # Modes it serves only for models that carry a label as well: label -> those modes (a llama.cpp
    # decision model labelled `classification` + `systemone` answers /v1/systemone, llamacpp-newer.md).
    label_modes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The weight file format it loads ("gguf"): a bare file of that format in the extra models dir,
    # or a repository of such files, is a model of this recipe.
    file_format: str | None = None


# In the order `Known recipes: ...` names them: the engines this build ships, then the others.
RECIPES: dict[str, Recipe] = {
    **{d.recipe: Recipe(d.modes, d.label_modes, d.file_format) for d in DESCRIPTORS.values()},
    # not shipped by this build
    "flm": Recipe(("chat", "embeddings", "transcription")),
    "ryzenai-llm": Recipe(("chat",)),
    "acestep": Recipe(("audio-generation",)),
    "thinksound": Recipe(("audio-generation",)),
    "trellis": Recipe(("3d",)),
}


def recipe_modes() -> dict[str, tuple[str, ...]]:
    """recipe -> deployment modes it serves, default first."""
    return {name: recipe.modes for name, recipe in RECIPES.items()}


def label_modes(recipe: str) -> dict[str, tuple[str, ...]]:
    """The modes a recipe serves only with a label as well."""
    entry = RECIPES.get(recipe)
    return dict(entry.label_modes) if entry else {}


def file_format(recipe: str) -> str | None:
    """The weight file format a recipe loads, if it is a single-file format."""
    entry = RECIPES.get(recipe)
    return entry.file_format if entry else None


def recipe_for_format(file_format: str) -> str:
    """The recipe that loads weight files of `file_format` (e.g. "gguf")."""
    for name, recipe in RECIPES.items():
        if recipe.file_format == file_format:
            return name
    raise LookupError(f"No engine of this build loads {file_format} files")
