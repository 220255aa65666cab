"""The model a request names, and models as clients see them.

`resolve` finds a model by any accepted name and `check_model` is the one check every entry point
makes of it (the right deployment mode, images only for vision models, an engine this server has;
the same model on a peer of the LAN where one serves it sooner); `engine_path` is where its engine
takes our endpoint, `context_length` the context it has or would have; `delete_model` is the one
way a model is deleted. The model object of `/v1/models` (also the job op `models`, a model's
registration answer and what a peer lists), a checkpoint as it may be shown, a collection's
components and which models this machine offers (`memory_budget`, `offered`, `unavailable_recipes`)
are here too.

Whether the caller may see a local file's absolute path is the API's to judge (`api/privacy.py`
`paths_shown`); here it is a flag.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lemonade.backends.peer.engine import PeerEngine
from lemonade.catalog import fit
from lemonade.catalog.catalog import NotFound
from lemonade.catalog.fit import MemoryBudget, too_big
from lemonade.errors import APIError, bad_request, model_not_found
from lemonade.labels import ROUTER_RECIPE
from lemonade.model_info import ModelInfo
from lemonade.routing.cost import prices
from lemonade.services import Services
from lemonade.system.devices import detect_devices

log = logging.getLogger("lemonade.server")
NOT_LOOKED_UP = object()  # "the caller has not looked the model's files up" (None: it has; there are none)
# Which of our endpoints a deployment mode serves, for "use X instead" hints.
ENDPOINT_FOR_MODE = {"chat": "/chat/completions", "embeddings": "/embeddings", "reranking": "/rerank",
                     "transcription": "/audio/transcriptions", "image": "/images/generations",
                     "tts": "/audio/speech", "classification": "/classify"}


def resolve(svc: Services, name: Any) -> ModelInfo:
    """A model by any accepted name, or 404 model_not_found."""
    if not isinstance(name, str) or not name:
        raise APIError(400, "Missing required field 'model'", code="missing_argument")
    try:
        return svc.catalog.resolve(name)
    except NotFound:
        # A loaded model answers until it is unloaded, even once its source stopped listing it (a
        # cloud model whose key was cleared: its requests then say that the key is missing).
        lm = svc.router.resident(name)
        if lm is not None:
            return lm.model
        on_peer = svc.forwarding.elsewhere(name)
        if on_peer is not None:
            return on_peer
        raise model_not_found(name) from None


def check_model(svc: Services, model: ModelInfo, mode: str, endpoint: str, *, hint: dict[str, str] | None = None,
                images: bool = False) -> ModelInfo:
    """May `model` serve this request? The one check every API family uses: not a collection, the
    right deployment mode, images only for vision models, an engine this server has. Returns the
    model that serves it: `model`, or the same model on a peer of the LAN that has it loaded while
    this server has not (runtime/forwarding.py)."""
    if model.recipe == ROUTER_RECIPE:
        raise APIError(400, f"Model {model.public} is a collection.router model: it routes /chat/completions, "
                       "/completions and /responses requests to one of its members; call one of those "
                       "endpoints, or a member directly: " + ", ".join(model.components or []),
                       code="model_mode_mismatch")
    if model.is_collection:
        raise APIError(400, f"Model {model.public} is a collection; call one of its components instead: "
                       + ", ".join(model.components or []), code="model_mode_mismatch")
    if model.mode != mode:
        use = (hint or ENDPOINT_FOR_MODE).get(model.mode)
        raise APIError(400, f"Model {model.public} is a '{model.mode}' model and cannot serve {endpoint}"
                       + (f"; use {use} instead" if use else ""), code="model_mode_mismatch")
    if images and not accepts_images(svc, model):
        raise APIError(400, f"Model {model.public} does not accept images (it has no vision projector). Use a "
                       "model with the 'vision' label, e.g. Gemma-3-4b-it-GGUF.", code="invalid_argument")
    if not svc.engines.available(model.recipe):
        raise APIError(400, f"Model {model.public} uses recipe '{model.recipe}', whose engine is not available in "
                       "this server yet.", code="model_load_refused")
    return svc.forwarding.forwarded(model, endpoint)


def accepts_images(svc: Services, model: ModelInfo) -> bool:
    """Whether the model has a vision projector (an mmproj checkpoint or file), i.e. can read images."""
    if "mmproj" in model.checkpoints or "vision" in model.labels:
        return True
    files = svc.catalog.local_files(model)
    return bool(files and files.get("mmproj"))


def engine_path(svc: Services, model: ModelInfo, endpoint: str) -> str:
    """The engine's path for our `endpoint` (its description says); 400 when it serves no such thing."""
    engine = svc.engines.get(model.recipe)
    path = engine.endpoints.get(endpoint) if engine is not None and engine.available else None
    if path is None:
        raise APIError(400, f"Model {model.public} (recipe '{model.recipe}') does not serve /{endpoint}",
                       code="invalid_argument")
    return path


def context_length(svc: Services, model: ModelInfo, options: dict[str, Any] | None = None,
                   files: dict[str, list[Path]] | None | object = NOT_LOOKED_UP) -> int | None:
    """The context a model has: for a loaded model the engine's own figure (tokens one request may
    use), else what its options (`options`, or the effective ones) would give, automatic sizing
    resolved; None when unknown. `files`: the
    model's files when the caller has looked them up already."""
    loaded = svc.router.resident(model.name)
    if loaded is not None and options is None and loaded.context_length is not None:
        return loaded.context_length
    engine = svc.engines.get(model.recipe)
    if engine is None or model.is_collection:
        return None
    if options is None:
        options = svc.options.resolve(model.name, model.recipe, for_load=False)
    if files is NOT_LOOKED_UP:
        files = svc.catalog.local_files(model)
    return engine.context_length(options, files)  # type: ignore[arg-type]


def component_names(svc: Services, model: ModelInfo) -> list[str]:
    """The canonical ids of a collection's components (stored as the names they were given)."""
    found = [svc.catalog.find(c) for c in model.components or []]
    return [c.name for c in found if c is not None]


def memory_budget(svc: Services) -> MemoryBudget | None:
    """What size of model this machine offers (catalog/fit.py); None when `disable_model_filtering`
    is set. Blocking the first time (device detection): call it in a thread."""
    if svc.config.get("disable_model_filtering"):
        return None
    return fit.memory_budget(detect_devices(), bool(svc.config.get("enable_dgpu_gtt")), svc.router.budget().cap_bytes)


def unavailable_recipes(svc: Services, budget: MemoryBudget | None) -> dict[str, str]:
    """Recipes none of whose built-in models this server offers (each too big for it, none
    downloaded), with the reason (Lemonade's `/v1/system-info` `unavailable_recipes`; models of
    cloud providers come and go, so their recipe is never listed)."""
    if budget is None:
        return {}
    by_recipe: dict[str, list[ModelInfo]] = {}
    for model in svc.catalog.all(rescan=False):
        engine = svc.engines.get(model.recipe)
        if model.origin == "builtin" and not model.is_collection and engine is not None and not engine.remote:
            by_recipe.setdefault(model.recipe, []).append(model)
    out = {}
    for recipe, models in sorted(by_recipe.items()):
        if not any(offered(svc, m, budget) for m in models):
            smallest = min((m.size or 0.0) for m in models)
            out[recipe] = (f"each of its {len(models)} models needs more memory than this server offers (the "
                           f"smallest about {smallest:.1f} GB; models up to {budget.max_model_gb:.1f} GB fit)")
    return out


def offered(svc: Services, model: ModelInfo, budget: MemoryBudget | None) -> bool:
    """Whether listings show `model`: everything but a built-in too big for this machine that is
    not downloaded (a downloaded one stays visible, so it can be used or deleted)."""
    return budget is None or too_big(model, budget) is None or svc.catalog.is_downloaded(model)


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
    context = context_length(svc, model, files=files)
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


async def delete_model(svc: Services, model: ModelInfo) -> bool:
    """Delete a model, the one way `/v1/delete`, Ollama's `/api/delete` and `lemonade delete` do it:
    files in the extra models dir are the user's and are refused (naming the path); a user
    collection loses only its entry (its components stay); anything else is unloaded, its
    download stopped, its files removed, and a `user.` model unregistered. False when there was
    nothing to delete (each API family words that its own way)."""
    if model.origin == "extra" or model.local_files is not None:
        paths = [str(p) for ps in (model.local_files or {}).values() for p in ps]
        where = ", ".join(paths) or svc.config.get("extra_models_dir")
        raise bad_request(f"Model {model.public} is a file of yours in the extra models directory ({where}); "
                          "Lemonade only deletes models it downloaded. Delete the file yourself if you no "
                          "longer want it.", code="model_not_deletable")
    engine = svc.engines.get(model.recipe)
    if model.recipe == PeerEngine.recipe:
        raise bad_request(f"Model {model.definition['upstream_id']} lives on peer {model.definition['peer']}, not "
                          "on this server: delete it there", code="model_not_deletable")
    if engine is not None and engine.remote:
        provider = model.definition.get("cloud_provider", "")
        raise bad_request(f"Model {model.public} is served by cloud provider '{provider}' and has no files here; "
                          f"remove the provider instead: lemonade cloud uninstall {provider}",
                          code="model_not_deletable")
    if model.is_collection:
        if model.origin != "user":
            raise bad_request(f"Model {model.public} is a built-in collection and cannot be deleted",
                              code="model_not_deletable")
        svc.catalog.unregister(model.name)
        if model.recipe == ROUTER_RECIPE:
            svc.router.prune_helpers()  # the helpers only its policy called leave with it
        return True
    await svc.router.unload(model.name)
    removed = await svc.downloads.delete(model)
    if model.origin == "user":
        svc.catalog.unregister(model.name)
        removed = True
    svc.downloads.updates_available.discard(model.name)
    if removed:
        log.info("Deleted %s", model.name)
    return removed
