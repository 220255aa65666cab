"""`/v1/load` and `/v1/unload`: explicit residency control."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from lemonade.api.lemonade.protocol import LoadRequest, UnloadRequest
from lemonade.api.privacy import paths_shown
from lemonade.api.sse import progress_stream
from lemonade.services import Services
from lemonade.serving.load import prepare_load
from lemonade.serving.models import component_names

router = APIRouter(tags=["residency"])


@router.post("/load")
async def load(request: Request, body: LoadRequest = Body(..., examples=[
        {"model_name": "Qwen3-0.6B-GGUF", "ctx_size": 8192}])) -> Any:
    """Load a model. With `"stream": true` the answer is SSE: `progress` events while the backend
    installs, the model downloads and the engine starts, then `complete` or `error`."""
    svc: Services = request.app.state.services
    # bad input is a plain 4xx, before any stream starts
    work = prepare_load(svc, body.model_name, body.model_extra or {}, pinned=body.pinned,
                        save_options=body.save_options, show_paths=paths_shown(request, False))
    if body.stream:
        return load_events(work)
    return await work()


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
    names = [target] if not (model and model.is_collection) else component_names(svc, model)
    unloaded = []
    for n in names:
        unloaded += await svc.router.unload(n)
    if not unloaded:
        return JSONResponse({"status": "error", "message": f"Model not found: {name}",
                             "error": {"message": f"Model not found: {name} (it is not loaded)",
                                       "type": "not_found", "code": "model_not_loaded"}}, status_code=404)
    return {"status": "success", "message": "Model unloaded successfully"}
