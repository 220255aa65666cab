"""Model management that is not downloading: register, per-model options, file inventory."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Body, Query, Request

from lemonade.api.errors import bad_request
from lemonade.api.lemonade.protocol import OptionsRequest
from lemonade.catalog.catalog import RegistrationError
from lemonade.checkpoints.variants import shard_info
from lemonade.model_info import ModelInfo
from lemonade.runtime.options import OptionsError
from lemonade.services import Services
from lemonade.serving.models import context_length, model_object, resolve

router = APIRouter(tags=["models"])

@router.post("/models/register")
async def register(request: Request, body: dict[str, Any] = Body(..., examples=[{
        "model_name": "user.Phi-4-Mini-GGUF", "checkpoint": "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M",
        "recipe": "llamacpp"}])) -> dict[str, Any]:
    svc: Services = request.app.state.services
    try:
        model = svc.catalog.register(body, one_definition=True)
    except RegistrationError as exc:
        raise bad_request(str(exc)) from None
    obj = model_object(svc, model)
    return {"status": "success", "model_name": model.public, "canonical_model_name": model.name,
            "model": {"id": obj["id"], "recipe": obj["recipe"], "downloaded": obj["downloaded"]}}


# ----- per-model options ---------------------------------------------------------------------------

def options_view(svc: Services, model: ModelInfo, saved: dict[str, Any],
                 resolved: tuple[dict[str, Any], dict[str, list[str]]],
                 base_url_key: bool) -> dict[str, Any]:
    """The options of one model by layer (api-lemonade.md), plus what Lemonade's answer leaves implicit:
    `layers`, the layer(s) each effective value came from (runtime/options.py LAYERS), and the
    `architecture` of the model's file with its shipped defaults (null before the download)."""
    effective, layers = resolved
    body = {"model_name": model.public, **effective}
    defaults = {"model_name": model.public,
                **svc.options.resolve(model.name, model.recipe, saved={}, for_load=False)}
    payload = json.dumps(dict(sorted(body.items())), separators=(",", ":")).replace("'", "'\\''")
    auth = ' -H "Authorization: Bearer $LEMONADE_API_KEY"' if base_url_key else ""
    architecture = svc.options.architecture_of(model.name)
    view: dict[str, Any] = {
        "model_name": model.public,
        "recipe": model.recipe,
        "saved": saved,
        "effective": dict(sorted(body.items())),
        "defaults": dict(sorted(defaults.items())),
        "layers": dict(sorted(layers.items())),
        "architecture": architecture,
        "architecture_defaults": svc.options.architecture_options(model.name, model.recipe) if architecture else {},
        "load_command": f"curl -X POST $LEMONADE_BASE_URL/v1/load -H \"Content-Type: application/json\"{auth} "
                        f"-d '{payload}'",
    }
    ctx = context_length(svc, model, effective)
    if "ctx_size" in effective and ctx is not None:
        view["resolved_ctx_size"] = ctx
    return view


def _model_for_options(svc: Services, model_id: str) -> ModelInfo:
    model = resolve(svc, model_id)
    if model.is_collection:
        raise bad_request(f"Model {model.public} is a collection; set options on each component instead")
    return model


@router.get("/models/{model_id}/options")
async def get_options(request: Request, model_id: str) -> dict[str, Any]:
    svc: Services = request.app.state.services
    model = _model_for_options(svc, model_id)
    saved = svc.options.saved(model.name)
    resolved = svc.options.resolve_layers(model.name, model.recipe, for_load=False)
    return options_view(svc, model, saved, resolved, bool(svc.api_key))


@router.post("/models/{model_id}/options")
async def set_options(request: Request, model_id: str, body: OptionsRequest = Body(..., examples=[
        {"ctx_size": 8192}])) -> dict[str, Any]:
    svc: Services = request.app.state.services
    model = _model_for_options(svc, model_id)
    dry_run = body.dry_run
    try:
        changes = svc.options.parse_request(model.recipe, body.model_extra or {}, ignore=("model_name",))
    except OptionsError as exc:
        raise bad_request(str(exc)) from None
    entry = svc.options.merge_saved(model.name, changes, dry_run=dry_run)
    resolved = svc.options.resolve_layers(model.name, model.recipe, saved=entry, for_load=False)
    return options_view(svc, model, svc.options.saved(model.name), resolved, bool(svc.api_key))


@router.delete("/models/{model_id}/options")
async def reset_options(request: Request, model_id: str) -> dict[str, Any]:
    svc: Services = request.app.state.services
    model = _model_for_options(svc, model_id)
    svc.options.reset(model.name)
    resolved = svc.options.resolve_layers(model.name, model.recipe, for_load=False)
    return options_view(svc, model, {}, resolved, bool(svc.api_key))


# ----- files ---------------------------------------------------------------------------------------

@router.get("/models/{model_id}/files")
async def model_files(request: Request, model_id: str, include_paths: bool = Query(False)) -> dict[str, Any]:
    svc: Services = request.app.state.services
    model = resolve(svc, model_id)
    entries: list[dict[str, Any]] = []
    files = svc.catalog.local_files(model)
    if files is None and not model.is_collection:
        files = svc.downloads.known_files(model)  # partially present or never downloaded
    for role, paths in (files or {}).items():
        for i, path in enumerate(paths):
            exists = path.exists()
            # A shard set's later files are `shard`s: the first shard is the role's file, as Lemonade lists it.
            shown_role = "shard" if i and shard_info(path.name) else role
            if path.is_dir():
                size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            else:
                size = path.stat().st_size if exists else 0
            entry: dict[str, Any] = {"name": path.name, "role": shown_role, "size_bytes": size, "exists": exists}
            if include_paths:
                entry = {"name": path.name, "path": str(path.absolute()), **entry}
            entries.append(entry)
    return {"model_id": model.public, "files": entries}
