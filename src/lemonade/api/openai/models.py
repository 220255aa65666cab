"""`GET /v1/models` and `GET /v1/models/{id}`: the catalog as OpenAI model objects plus Lemonade fields.

With peers (backends/peer/peers.py), the models this server does not have but a peer of the LAN serves
are listed too, as that peer lists them, with `peer` saying where they live."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from lemonade.api.privacy import paths_shown
from lemonade.backends.peer.peers import RECIPE as PEER_RECIPE
from lemonade.backends.peer.peers import Peer
from lemonade.model_info import ModelInfo
from lemonade.runtime.options import options_for
from lemonade.services import Services
from lemonade.serving.models import memory_budget, model_object, offered, resolve

router = APIRouter(tags=["models"])


IncludePaths = Annotated[bool, Query(description="Show extra-dir files by absolute path (privacy-sensitive; "
                                                 "admins see them anyway)")]


@router.get("/models")
async def list_models(request: Request, show_all: bool = Query(False, description="Include models that are not "
                                                                                   "downloaded"),
                      include_paths: IncludePaths = False) -> dict[str, Any]:
    svc: Services = request.app.state.services
    budget = await asyncio.to_thread(memory_budget, svc)  # models too big for this machine are not offered
    include_paths = paths_shown(request, include_paths)
    data = []
    for model in svc.catalog.all():
        if not offered(svc, model, budget):
            continue
        obj = model_object(svc, model, include_paths=include_paths)
        if show_all or obj["downloaded"]:
            data.append(obj)
    for alias in sorted(svc.catalog.aliases()):  # guide-configuration-custom-models.md: listed on their own
        target = svc.catalog.alias_of(alias)
        if target is not None and offered(svc, target, budget):
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
    model = resolve(svc, model_id)
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
