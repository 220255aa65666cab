"""`/v1/install` and `/v1/uninstall`: getting engines onto the machine, with visible progress."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.errors import APIError
from lemonade.api.lemonade import cloud
from lemonade.backends.engine import Engine, InstallError, fetch_refusal
from lemonade.services import Services

router = APIRouter(tags=["backends"])


class UninstallRequest(BaseModel):
    """A local backend (`recipe` + `backend`), or a cloud provider (`backend: "cloud"` + `provider`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    recipe: str | None = Field(None, examples=["llamacpp"], description="Required unless backend is \"cloud\"")
    backend: str = Field(..., examples=["cpu"])
    provider: str | None = Field(None, description="Cloud provider name (backend \"cloud\")")


class InstallRequest(UninstallRequest):
    base_url: str | None = Field(None, description="Cloud provider's OpenAI-compatible base URL")
    api_key: str | None = Field(None, description="Cloud provider's key, kept in memory only")
    allow_insecure_http: bool | None = Field(None, description="Cloud: allow sending the key to an http:// URL")
    auth_header_name: str | None = Field(None, description="Cloud: header carrying the key (Authorization)")
    auth_header_prefix: str | None = Field(None, description="Cloud: value prefix before the key (\"Bearer \")")
    stream: bool = False
    subscribe: bool = Field(True, description="With stream true, false answers at once with a server-owned "
                                              "install job, listed by /v1/downloads (Lemonade's app)")
    force: bool = False


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _local_recipe(body: UninstallRequest) -> str:
    """The recipe of a local-backend request (cloud bodies are dispatched to api/lemonade/cloud.py)."""
    if body.recipe is None:
        raise APIError(400, "Missing required field 'recipe' (needed for every backend but \"cloud\")",
                       code="missing_argument")
    for field in ("provider", "base_url", "api_key", "allow_insecure_http", "auth_header_name", "auth_header_prefix"):
        if getattr(body, field, None) is not None:
            raise APIError(400, f"Field '{field}' applies only to backend \"cloud\"", code="invalid_argument")
    return body.recipe


def _engine(svc: Services, body: UninstallRequest) -> Engine:
    """The engine of the body's recipe, after refusing unknown recipes and backends (before any work)."""
    recipe, backend = _local_recipe(body), body.backend
    engine = svc.engines.get(recipe)
    if engine is None:
        known = ", ".join(e.recipe for e in svc.engines)
        raise APIError(400, f"Unknown recipe '{recipe}'. Known recipes: {known}", code="unsupported_backend")
    try:
        engine.check_request(backend, getattr(body, "force", False))  # force: past the hardware filter
    except InstallError as exc:
        raise APIError(400, str(exc), code="unsupported_backend") from None
    return engine


@router.post("/install")
async def install(request: Request, body: InstallRequest) -> Any:
    svc: Services = request.app.state.services
    if body.backend == "cloud":
        return await cloud.install_provider(svc, body, body.model_fields_set)
    engine = _engine(svc, body)
    if svc.offline and (body.force or engine.needs_install(body.backend)):
        raise APIError(400, f"Lemonade is in offline mode (offline=true in config, LEMONADE_OFFLINE=1 or "
                       f"HF_HUB_OFFLINE=1), so it does not download or build the {body.recipe}:{body.backend} "
                       "backend. Turn offline mode off (lemonade config set offline=false) and install again.",
                       code="lemond_offline")
    refusal = fetch_refusal(svc.config, engine.recipe, body.backend)
    if refusal and (body.force or engine.needs_install(body.backend)):
        raise APIError(400, refusal, code="no_fetch_executables")
    if not body.stream:
        try:
            result = await asyncio.to_thread(engine.install, body.backend, None, body.force)
        except InstallError as exc:
            raise APIError(500, str(exc), type="server_error", code="install_failed") from None
        return {"status": "success", "recipe": body.recipe, "backend": body.backend,
                **{k: v for k, v in result.items() if k not in ("status", "recipe", "backend")}}

    if not body.subscribe:
        return svc.downloads.start_backend_job(f"{body.recipe}:{body.backend}",
                                               lambda progress: engine.install(body.backend, progress, body.force))

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def progress(event: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, sse("progress", event))

    async def run() -> None:
        try:
            result = await asyncio.to_thread(engine.install, body.backend, progress, body.force)
            await queue.put(sse("complete", {"status": "success", "recipe": body.recipe, "backend": body.backend,
                                             "version": result.get("version")}))
        except InstallError as exc:
            await queue.put(sse("error", {"status": "error", "error": str(exc)}))
        finally:
            await queue.put(None)

    task = asyncio.create_task(run())

    async def events() -> AsyncIterator[bytes]:
        # The install keeps going if the client leaves; it is the machine's, not the request's.
        while (item := await queue.get()) is not None:
            yield item
        await task

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post("/uninstall")
async def uninstall(request: Request, body: UninstallRequest) -> dict[str, Any]:
    svc: Services = request.app.state.services
    if body.backend == "cloud":
        return await cloud.uninstall_provider(svc, body.provider)
    engine = _engine(svc, body)
    refusal = engine.uninstall_refusal(body.backend)
    if refusal:  # before the models using it are unloaded for nothing
        raise APIError(400, refusal, code="uninstall_failed")
    await svc.router.unload_where(lambda lm: lm.model.recipe == body.recipe and lm.backend == body.backend)
    try:
        result = await asyncio.to_thread(engine.uninstall, body.backend)
    except InstallError as exc:
        raise APIError(400, str(exc), code="uninstall_failed") from None
    return {"status": "success", "recipe": body.recipe, "backend": body.backend,
            **{k: v for k, v in result.items() if k not in ("status", "recipe", "backend")}}
