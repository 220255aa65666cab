"""`/v1/load` and `/v1/unload`: explicit residency control."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from lemonade.api.body import json_object
from lemonade.api.errors import APIError, bad_request
from lemonade.api.lemonade.models import body_object
from lemonade.api.sse import progress_stream
from lemonade.runtime.options import OptionsError
from lemonade.services import Services

router = APIRouter(tags=["residency"])
LOAD_CONTROL_KEYS = ("model_name", "model", "pinned", "save_options", "stream")


@router.post("/load")
async def load(request: Request, body: dict[str, Any] = Body(..., examples=[
        {"model_name": "Qwen3-0.6B-GGUF", "ctx_size": 8192}])) -> Any:
    """Load a model. With `"stream": true` the answer is SSE: `progress` events while the backend
    installs, the model downloads and the engine starts, then `complete` or `error`."""
    svc: Services = request.app.state.services
    body = body_object(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("Invalid value for 'stream': must be true or false")
    work = _prepare_load(svc, body)  # bad input is a plain 4xx, before any stream starts
    if stream:
        return load_events(work)
    return await work()


def _prepare_load(svc: Services, body: dict[str, Any]) -> Callable[[], Awaitable[dict[str, Any]]]:
    """Validate a load request (name, flags, options) and return the work that performs it."""
    name = body.get("model_name", body.get("model"))
    if name is None:
        raise APIError(400, "Missing required field 'model_name'", code="missing_argument")
    if not isinstance(name, str):
        raise bad_request("Invalid value for 'model_name': must be a string")
    model = svc.resolve(name)
    pinned = body.get("pinned")
    save = body.get("save_options", False)
    for key, value in (("pinned", pinned), ("save_options", save)):
        if value is not None and not isinstance(value, bool):
            raise bad_request(f"Invalid value for '{key}': must be true or false")
    done = {"status": "success", "message": f"Loaded model: {model.name}"}
    if model.is_collection:
        components = [svc.resolve(comp) for comp in model.components or []]

        async def load_collection() -> dict[str, Any]:
            for comp in components:
                await svc.router.ensure_loaded(comp, lambda c=comp: svc.options.resolve(c.name, c.recipe),
                                               pinned=pinned)
            return done

        return load_collection
    try:
        requested = svc.options.parse_request(model.recipe, body, ignore=LOAD_CONTROL_KEYS)
    except OptionsError as exc:
        raise bad_request(str(exc)) from None
    effective = svc.options.resolve(model.name, model.recipe, request=requested)
    if pinned is None:
        pinned = svc.options.saved(model.name).get("pinned")

    async def load_model() -> dict[str, Any]:
        current = svc.router.loaded.get(model.name)
        reload = current is not None and \
            {k: v for k, v in current.options.items() if k != "resolved_ctx_size"} != effective
        await svc.router.ensure_loaded(model, effective, pinned=pinned, reload=reload)
        if save:
            svc.options.save_from_load(model.name, requested, body.get("pinned"))
        return done

    return load_model


def load_events(run: Any) -> Any:
    return progress_stream(run, lambda result: {"status": "success", **result})


@router.post("/unload")
async def unload(request: Request) -> Any:
    svc: Services = request.app.state.services
    body = await json_object(request)
    name = body.get("model_name", body.get("model"))
    if name is None:
        await svc.router.unload(None)
        return {"status": "success", "message": "Model unloaded successfully"}
    if not isinstance(name, str):
        raise bad_request("Invalid value for 'model_name': must be a string")
    model = svc.catalog.find(name)
    target = model.name if model else name
    names = [target] if not (model and model.is_collection) else list(model.components or [])
    unloaded = []
    for n in names:
        unloaded += await svc.router.unload(n)
    if not unloaded:
        return JSONResponse({"status": "error", "message": f"Model not found: {name}",
                             "error": {"message": f"Model not found: {name} (it is not loaded)",
                                       "type": "not_found", "code": "model_not_loaded"}}, status_code=404)
    return {"status": "success", "message": "Model unloaded successfully"}
