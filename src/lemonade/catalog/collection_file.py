"""Collections whose definition lives in a model registry (guide-configuration-custom-models.md,
"Share a collection"): upstream Lemonade's built-in omni collections (`LMX-Omni-*`, `RPG-HaloTales-*`)
name a repository as their `checkpoint`; the repository holds the collection file `<RepoName>.json`,
an exported `/v1/pull` body (`recipe`, `components`, and a `models` array defining each component).

A pull fetches that one file first (as a small model of its own, `file_model`), then the components it
names; components this server does not know are registered as `user.*` models from the file's
definitions, inheriting the collection's registry. The file is what lists the components, so a
collection that ships none inline has none until it is pulled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lemonade.labels import COLLECTION_RECIPES
from lemonade.model_info import ModelInfo

FILE_RECIPE = "collection-file"  # the recipe of `file_model`: a download, never loaded


class CollectionFileError(ValueError):
    """The collection file is missing something; the message names the file and what."""


def file_checkpoint(model: ModelInfo) -> str | None:
    """`owner/Repo:Repo.json` of a registry-backed collection, None for any other model."""
    if not model.is_collection or not model.checkpoint:
        return None
    repo = model.checkpoint
    return f"{repo}:{repo.rsplit('/', 1)[-1]}.json"


def file_model(model: ModelInfo) -> ModelInfo:
    """The collection file as a one-file model, so the download machinery (progress, resume, cache
    layout, offline rules) fetches it like any other file. It shares the collection's name: a pull of
    the collection and of its file are one download."""
    checkpoint = file_checkpoint(model)
    assert checkpoint is not None
    return ModelInfo(name=model.name, recipe=FILE_RECIPE, mode="collection", checkpoints={"main": checkpoint},
                     source=model.source, origin=model.origin, public=model.public)


def read_file(path: Path) -> dict[str, Any]:
    """The collection file's `components` and component definitions, checked."""
    try:
        return parse(path.read_bytes(), path.name)
    except OSError as exc:
        raise CollectionFileError(f"Cannot read the collection file {path.name}: {exc}") from None


def parse(raw: bytes, name: str) -> dict[str, Any]:
    """A collection file's text (`name` for messages) as its `recipe`, `components`, component
    `definitions` and `size` (GB, when it gives one), checked."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CollectionFileError(f"Cannot read the collection file {name}: {exc}") from None
    if not isinstance(data, dict) or data.get("recipe") not in COLLECTION_RECIPES:
        raise CollectionFileError(f"{name} is not a collection file (its 'recipe' must be one of "
                                  f"{', '.join(COLLECTION_RECIPES)})")
    components = data.get("components")
    if not isinstance(components, list) or not components or not all(isinstance(c, str) and c for c in components):
        raise CollectionFileError(f"{name}: 'components' must be a non-empty array of model names")
    models = data.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise CollectionFileError(f"{name}: 'models' must be an array of model definitions")
    definitions = {str(m.get("model_name") or m.get("id")): m for m in models}
    size = data.get("size")
    return {"recipe": data["recipe"], "components": components, "definitions": definitions,
            "size": float(size) if isinstance(size, (int, float)) and not isinstance(size, bool) else None}
