"""`/internal/*`: server control (config, aliases, shutdown), guarded by `LEMONADE_ADMIN_API_KEY`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.background import BackgroundTask

from lemonade.api.errors import APIError, bad_request
from lemonade.catalog.catalog import RegistrationError
from lemonade.config import ConfigError, nested
from lemonade.services import Services
from lemonade.serving.models import component_names, resolve

router = APIRouter(prefix="/internal", tags=["internal"])
log = logging.getLogger("lemonade.server")


@router.get("/config")
async def get_config(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    return svc.config.values


@router.post("/set")
async def set_config(request: Request, body: dict[str, Any] = Body(..., examples=[
        {"max_loaded_models": 2, "llamacpp": {"args": "--threads 4"}}]),
        persist: bool = Query(True, description="false: apply in memory only, until the server restarts "
                                                "(`lemonade telemetry on|off`)")) -> dict[str, Any]:
    svc: Services = request.app.state.services
    if not isinstance(body, dict):
        raise APIError(400, "Request body must be a JSON object of settings", code="invalid_json")
    try:
        changed = svc.config.set(body) if persist else svc.config.set_runtime(body)
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    shadowed = [k for k in changed if persist and k in svc.config.overridden_keys()]
    out: dict[str, Any] = {"status": "success", "updated": nested(changed), "config": svc.config.values}
    if shadowed:
        out["warning"] = (f"Saved, but {', '.join(shadowed)} is overridden by an environment variable, a "
                          "`lemonade serve` flag or `lemonade telemetry`, which wins until the server restarts")
    return out


@router.post("/pin")
async def pin(request: Request, body: dict[str, Any] = Body(..., examples=[
        {"model_name": "Qwen3-0.6B-GGUF", "pinned": True}])) -> dict[str, Any]:
    """Pin (or unpin) a loaded model: a pinned model is never evicted to make room for another.
    `model` (or `model_name`) and a boolean `pinned` are required, in Lemonade's words when missing."""
    svc: Services = request.app.state.services
    name = body.get("model", body.get("model_name"))
    if not isinstance(name, str) or not name:
        raise bad_request("Parameter 'model' or 'model_name' is required", code="missing_argument")
    pinned = body.get("pinned")
    if not isinstance(pinned, bool):
        raise bad_request("Parameter 'pinned' is required and must be a boolean")
    model = resolve(svc, name)
    names = component_names(svc, model) if model.is_collection else [model.name]
    if not all(svc.router.pin(n, pinned) for n in names):
        raise APIError(404, f"Model {model.public} is not loaded; load it with \"pinned\": true instead "
                       f"(lemonade load {model.public} --pinned)", type="not_found", code="model_not_loaded")
    return {"status": "success", "model_name": model.public, "pinned": pinned}


@router.post("/simulate-vram-pressure")
async def simulate_vram_pressure(request: Request, body: dict[str, Any] = Body(..., examples=[{"pct": 0.95}])
                                 ) -> dict[str, Any]:
    """Run the eviction engine once, now, as Lemonade's admin hook does: `pct` (0 to 1) is taken as the
    device memory in use, so at or above `auto_evict_threshold_pct` the most disposable idle model of
    those with auto_evict on is unloaded; a negative `pct` applies the idle rules (downsize, evict) only.
    Answers once the pass is done."""
    svc: Services = request.app.state.services
    pct = body.get("pct", 0.0)
    if isinstance(pct, bool) or not isinstance(pct, (int, float)):
        raise bad_request("'pct' must be a number: the fraction of device memory in use (e.g. 0.95), or -1 for the "
                          "idle rules only")
    await svc.router.evaluate_now(float(pct))
    return {"status": "ok"}


class AliasRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    alias: str = Field(..., min_length=1)
    target: str | None = None
    model: str | None = None

    @model_validator(mode="after")
    def _target_or_model(self) -> AliasRequest:
        if not (self.target or self.model):
            raise ValueError("'target' (or 'model') is required")
        return self


def _alias_view(svc: Services, alias: str, target: str) -> dict[str, Any]:
    model = svc.catalog.find(target)
    return {"alias": alias, "target": target,
            "downloaded": bool(model and svc.catalog.is_downloaded(model)),
            "recipe": model.recipe if model else None}


@router.get("/aliases")
async def list_aliases(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    return {"aliases": [_alias_view(svc, a, t) for a, t in sorted(svc.catalog.aliases().items())]}


@router.post("/aliases")
async def add_alias(request: Request, body: AliasRequest) -> dict[str, Any]:
    svc: Services = request.app.state.services
    target = body.target or body.model or ""
    try:
        svc.catalog.set_alias(body.alias, target)
    except RegistrationError as exc:
        raise bad_request(str(exc)) from None
    return {"status": "ok", "alias": body.alias, "target": svc.catalog.aliases()[body.alias]}


@router.delete("/aliases/{alias}")
async def remove_alias(request: Request, alias: str) -> dict[str, Any]:
    svc: Services = request.app.state.services
    if not svc.catalog.remove_alias(alias):
        raise APIError(404, f"Alias '{alias}' does not exist. `lemonade alias list` shows the aliases.",
                       code="alias_not_found")
    return {"status": "deleted", "alias": alias}


@router.post("/telemetry/flush")
async def flush_telemetry(request: Request) -> dict[str, Any]:
    """Export every queued trace span now (blocks until sent, or the exporter gives up)."""
    svc: Services = request.app.state.services
    if not await asyncio.to_thread(svc.telemetry.flush):
        raise APIError(502, "Some trace spans could not be exported in time; check that the OTLP receiver at "
                       f"{svc.config.get('telemetry.otlp.endpoint')} answers", code="telemetry_flush_failed")
    return {"status": "flushed"}


@router.post("/shutdown")
async def shutdown(request: Request) -> JSONResponse:
    """Stop the server, as Lemonade's `/internal/shutdown` does: a running job is interrupted and
    recorded as such (resumable), every engine process is stopped before the answer is sent (a caller
    that goes on finds none left; requests still waiting get 503 `shutting_down`), then the server
    exits through its normal shutdown (download state saved, queued trace spans sent) with status 0."""
    svc: Services = request.app.state.services
    log.info("Shutdown requested (POST /internal/shutdown): stopping %d engine process(es)",
             len(svc.router.processes()))
    await request.app.state.jobs.aclose()
    await svc.router.shutdown()
    if svc.stop_server is None:  # an app built without `serve` (tests, benchmarks): its owner stops it
        log.warning("No server loop to stop: the engines are stopped, the app keeps answering")
    return JSONResponse({"status": "shutting down"}, background=BackgroundTask(svc.stop_server or (lambda: None)))
