"""`/v1/load` and `/v1/unload`: explicit residency control."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from lemonade.api.errors import bad_request
from lemonade.api.lemonade.protocol import LoadRequest, UnloadRequest
from lemonade.api.privacy import paths_shown
from lemonade.api.sse import progress_stream
from lemonade.labels import ROUTER_RECIPE
from lemonade.model_info import ModelInfo
from lemonade.runtime.options import OptionsError
from lemonade.runtime.router import LoadedModel
from lemonade.services import Services
from lemonade.serving.models import shown_checkpoint

router = APIRouter(tags=["residency"])
NAME_KEYS = ("model_name", "model")  # the alias not taken as the name is no option either


@router.post("/load")
async def load(request: Request, body: LoadRequest = Body(..., examples=[
        {"model_name": "Qwen3-0.6B-GGUF", "ctx_size": 8192}])) -> Any:
    """Load a model. With `"stream": true` the answer is SSE: `progress` events while the backend
    installs, the model downloads and the engine starts, then `complete` or `error`."""
    svc: Services = request.app.state.services
    work = _prepare_load(svc, body, paths_shown(request, False))  # bad input is a plain 4xx, before any stream starts
    if body.stream:
        return load_events(work)
    return await work()


def _prepare_load(svc: Services, body: LoadRequest, show_paths: bool = False
                  ) -> Callable[[], Awaitable[dict[str, Any]]]:
    """Resolve the model, check its options and return the work that performs the load. `show_paths`:
    an extra-dir model's checkpoint by absolute path (admins), else by file name (/v1/models' rule)."""
    model = svc.resolve(body.model_name)
    pinned = body.pinned
    done = {"status": "success", "message": f"Loaded model: {model.public}", "model_name": model.public,
            "recipe": model.recipe}
    if model.recipe == ROUTER_RECIPE:
        # Virtual, as in Lemonade: each request loads the member its policy picks. Loading every
        # candidate up front would only push other models out.
        async def acknowledge() -> dict[str, Any]:
            return done

        return acknowledge
    if model.is_collection:
        components = [svc.resolve(comp) for comp in model.components or []]

        async def load_collection() -> dict[str, Any]:
            if svc.catalog.collection_file(model) is not None:  # its file names the components
                await svc.ready_collection(model)
                components.extend(svc.resolve(comp) for comp in model.components or [])
            for comp in components:
                def options(c: ModelInfo = comp) -> dict[str, Any]:
                    return svc.options.resolve(c.name, c.recipe)

                await svc.router.ensure_loaded(comp, options, pinned=pinned)
            return done

        return load_collection
    try:
        requested = svc.options.parse_request(model.recipe, body.model_extra or {}, ignore=NAME_KEYS)
    except OptionsError as exc:
        raise bad_request(str(exc)) from None
    effective = svc.options.resolve(model.name, model.recipe, request=requested)
    if pinned is None:
        pinned = svc.options.saved(model.name).get("pinned")

    if model.checkpoint:
        done["checkpoint"] = shown_checkpoint(model, show_paths)

    async def load_model() -> dict[str, Any]:
        lm = await svc.router.ensure_loaded(model, effective, pinned=pinned)  # loaded again if its options changed
        if body.save_options:
            svc.options.save_from_load(model.name, requested, body.pinned)
        return {**done, **context_fields(lm)}

    return load_model


def context_fields(lm: LoadedModel) -> dict[str, Any]:
    """What context the load gave the model and why (`ctx_size: -1` is sized to the free memory)."""
    out: dict[str, Any] = {}
    if lm.context_length is not None:
        out["context_length"] = lm.context_length
    if lm.launch.context_reason:
        out["context_reason"] = lm.launch.context_reason
    return out


def load_events(run: Any) -> Any:
    return progress_stream(run, lambda result: {"status": "success", **result})


@router.post("/unload")
async def unload(request: Request, body: UnloadRequest | None = Body(None, examples=[
        {"model_name": "Qwen3-0.6B-GGUF"}, {}])) -> Any:
    """Unload one model (a collection: its components), or every loaded model without a name."""
    svc: Services = request.app.state.services
    name = body.model_name if body is not None else None
    if name is None:
        await svc.router.unload(None)
        return {"status": "success", "message": "Model unloaded successfully"}
    model = svc.catalog.find(name)
    target = model.name if model else name
    names = [target] if not (model and model.is_collection) else svc.component_names(model)
    unloaded = []
    for n in names:
        unloaded += await svc.router.unload(n)
    if not unloaded:
        return JSONResponse({"status": "error", "message": f"Model not found: {name}",
                             "error": {"message": f"Model not found: {name} (it is not loaded)",
                                       "type": "not_found", "code": "model_not_loaded"}}, status_code=404)
    return {"status": "success", "message": "Model unloaded successfully"}
