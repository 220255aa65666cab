"""Models as clients see them: the model object of `/v1/models` (also the job op `models`, a model's
registration answer and what a peer lists) and a checkpoint as it may be shown.

Whether the caller may see a local file's absolute path is the API's to judge (`api/privacy.py`
`paths_shown`); here it is a flag.
"""

from __future__ import annotations

from typing import Any

from lemonade.model_info import ModelInfo
from lemonade.routing.cost import prices
from lemonade.services import Services


def shown_checkpoint(model: ModelInfo, include_paths: bool = False, role: str = "main") -> str:
    """A model's checkpoint (of `role`) as clients see it. A file (or folder) on this machine (the extra
    models dir, Lemonade's local imports) is shown by its absolute path, as Lemonade does, to admins and
    when asked (`include_paths`); anyone else gets its file name, since the path names the user's folders
    (api/privacy.py)."""
    files = (model.local_files or {}).get(role)
    if include_paths or not files:
        return model.checkpoint if role == "main" else model.checkpoints[role]
    return files[0].name


def model_object(svc: Services, model: ModelInfo, with_components: bool = True,
                 include_paths: bool = False) -> dict[str, Any]:
    """A model as `/v1/models` lists it; a collection embeds its components' objects (`models`), in
    the list as in `/v1/models/{id}` (api-openai.md), one level deep (components are never collections)."""
    files = svc.catalog.local_files(model) if not model.is_collection else None
    downloaded = files is not None if not model.is_collection else svc.catalog.is_downloaded(model)
    obj: dict[str, Any] = {
        "id": model.public,
        "created": model.created,
        "object": "model",
        "owned_by": "lemonade",
        "checkpoint": shown_checkpoint(model, include_paths),
        "recipe": model.recipe,
    }
    if model.size is not None:
        obj["size"] = model.size
    ctx = svc.catalog.max_context_window(model, files)
    if ctx is not None:
        obj["max_context_window"] = ctx
    context = svc.context_length(model, files=files)
    if context is not None:
        obj["context_length"] = context
    obj["downloaded"] = downloaded
    obj["suggested"] = model.suggested
    obj["update_available"] = downloaded and model.name in svc.downloads.updates_available
    obj["labels"] = list(model.labels)
    if "cloud_provider" in model.definition:  # served by a cloud provider (api-openai.md); `owned_by`
        obj["cloud_provider"] = model.definition["cloud_provider"]  # stays "lemonade", as for every model
        if "context_length" in model.definition:
            obj["context_length"] = model.definition["context_length"]
    obj.update(prices(model.definition))  # USD per 1M tokens, for display (a provider's, or written on the entry)
    if len(model.checkpoints) > 1:
        obj["checkpoints"] = {**{role: shown_checkpoint(model, include_paths, role) for role in model.checkpoints},
                              "main": obj["checkpoint"]}
    if model.source != "huggingface":
        obj["source"] = model.source
    if model.origin == "user" and not model.is_collection:  # the registry it was registered from (provenance)
        obj["registry_source"] = model.source
    if model.image_defaults:
        obj["image_defaults"] = dict(model.image_defaults)
    if model.is_collection:
        # Listed by their public ids, the namespace of `id` (stored as they were given: `X` or `user.X`)
        given = list(model.components or [])
        found = [svc.catalog.find(c) for c in given]
        obj["components"] = [m.public if m is not None else c for m, c in zip(found, given, strict=True)]
        for key in ("version", "routing"):  # a collection.router's policy, as registered (and exported)
            if key in model.definition:
                obj[key] = model.definition[key]
        if model.definition.get("system_prompt"):
            obj["system_prompt"] = model.definition["system_prompt"]
        if with_components:
            obj["models"] = [model_object(svc, c, with_components=False) for c in found if c is not None]
    return obj
