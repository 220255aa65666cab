"""`GET /v1/models` and `GET /v1/models/{id}`: the catalog as OpenAI model objects plus Lemonade fields.

With peers (backends/peers.py), the models this server does not have but a peer of the LAN serves
are listed too, as that peer lists them, with `peer` saying where they live."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from lemonade.api.middleware import is_admin
from lemonade.backends.peers import RECIPE as PEER_RECIPE
from lemonade.backends.peers import Peer
from lemonade.model_info import ModelInfo
from lemonade.routing.cost import prices
from lemonade.runtime.options import options_for
from lemonade.services import Services

router = APIRouter(tags=["models"])


IncludePaths = Annotated[bool, Query(description="Show extra-dir files by absolute path (privacy-sensitive; "
                                                 "admins see them anyway)")]


def shown_checkpoint(model: ModelInfo, include_paths: bool = False, role: str = "main") -> str:
    """A model's checkpoint (of `role`) as clients see it. A file (or folder) on this machine (the extra
    models dir, Lemonade's local imports) is shown by its absolute path, as Lemonade does, to admins and
    when asked (`include_paths`); anyone else gets its file name, since the path names the user's folders
    (api/privacy.py)."""
    files = (model.local_files or {}).get(role)
    if include_paths or not files:
        return model.checkpoint if role == "main" else model.checkpoints[role]
    return files[0].name


def paths_shown(request: Request, include_paths: bool) -> bool:
    svc: Services = request.app.state.services
    return include_paths or is_admin(request.scope, svc.api_key, svc.admin_key)


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


@router.get("/models")
async def list_models(request: Request, show_all: bool = Query(False, description="Include models that are not "
                                                                                   "downloaded"),
                      include_paths: IncludePaths = False) -> dict[str, Any]:
    svc: Services = request.app.state.services
    budget = await asyncio.to_thread(svc.memory_budget)  # models too big for this machine are not offered
    include_paths = paths_shown(request, include_paths)
    data = []
    for model in svc.catalog.all():
        if not svc.offered(model, budget):
            continue
        obj = model_object(svc, model, include_paths=include_paths)
        if show_all or obj["downloaded"]:
            data.append(obj)
    for alias in sorted(svc.catalog.aliases()):  # guide-configuration-custom-models.md: listed on their own
        target = svc.catalog.alias_of(alias)
        if target is not None and svc.offered(target, budget):
            obj = alias_object(svc, alias, target, include_paths)
            if show_all or obj["downloaded"]:
                data.append(obj)
    listed = {obj["id"] for obj in data}
    for name, holders in svc.peers.listing().items():
        if name not in listed and svc.catalog.find(name) is None:
            data.append(peer_object(*holders[0]))
    return {"object": "list", "data": data}


def peer_object(peer: Peer, listed: dict[str, Any]) -> dict[str, Any]:
    """A peer's model as that peer lists it, saying where it lives (`peer`, its base URL) and whether
    it is loaded there."""
    shown = {k: v for k, v in listed.items() if k != "mode"}
    return {**shown, "peer": peer.url, "peer_hostname": peer.hostname, "peer_loaded": listed["id"] in peer.loaded}


def alias_object(svc: Services, alias: str, target: ModelInfo, include_paths: bool = False,
                 with_components: bool = True) -> dict[str, Any]:
    """An alias as its own entry: the target's object under the alias's id (`alias_target` names it)."""
    obj = model_object(svc, target, with_components=with_components, include_paths=include_paths)
    return {"id": alias, **{k: v for k, v in obj.items() if k != "id"}, "alias_target": target.public}


@router.get("/models/{model_id}")
async def get_model(request: Request, model_id: str,
                    include_paths: IncludePaths = False) -> dict[str, Any]:
    svc: Services = request.app.state.services
    include_paths = paths_shown(request, include_paths)
    model = svc.resolve(model_id)
    if model.recipe == PEER_RECIPE:  # a model only a peer serves
        peer = svc.peers.get(model.definition["peer"])
        listed = peer.models.get(model.definition["upstream_id"]) if peer is not None else None
        if peer is not None and listed is not None:
            return peer_object(peer, listed)
    target = svc.catalog.alias_of(model_id)
    obj = (alias_object(svc, model_id, target, include_paths, with_components=True) if target is not None
           else model_object(svc, model, with_components=True, include_paths=include_paths))
    shown = model_recipe_options(svc, model)
    if shown:
        obj["recipe_options"] = shown
    return obj


def model_recipe_options(svc: Services, model: ModelInfo) -> dict[str, Any]:
    """A model's own recipe options as Lemonade's model info shows them, lowest layer first: its
    `image_defaults` that are options of its recipe, a built-in entry's `recipe_options`, then the
    saved ones (recipe_options.json)."""
    known = options_for(model.recipe)
    shown = {k: v for k, v in (model.image_defaults or {}).items() if k in known}
    shown.update(svc.options.model_defaults(model.name))
    shown.update(svc.options.saved(model.name))
    return shown
