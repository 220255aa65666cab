"""Status endpoints: health, stats, system stats and info."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from lemonade import __version__
from lemonade.api.privacy import text_view
from lemonade.backends.cpu_share import OWN_LOAD
from lemonade.services import Services
from lemonade.serving.models import memory_budget, unavailable_recipes
from lemonade.system.info import system_info, system_stats

router = APIRouter(tags=["status"])


def services(request: Request) -> Services:
    return request.app.state.services


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    svc = services(request)
    view = text_view(request.scope, svc)
    recent = svc.router.most_recent()  # a standard model before a routing helper (runtime/router/scheduler.py)
    models = svc.router.models(usable=False)
    loaded = [{**(m := lm.describe()), "launch_command": [view(arg) for arg in m["launch_command"]],
               # the auto-tune profile and overrides each loaded model runs with
               "auto_tune": svc.autotune.for_loaded(lm.name, lm.model.recipe, lm.backend, lm.options)}
              for lm in models]
    body: dict[str, Any] = {
        "status": "ok",
        "version": __version__,
        "model_loaded": recent.model.public if recent is not None else (loaded[0]["model_name"] if loaded else None),
        "all_models_loaded": loaded,
        "pinned_models": svc.router.pinned_counts(),  # the standard pool's; helpers. below (runtime/router/)
        "pinned_helper_models": svc.router.pinned_helper_counts(),
        "max_models": svc.router.limits(),
        "telemetry": svc.telemetry.state(),
        "update_check_done": svc.downloads.update_check_done,
        "crashed_models": list(svc.router.crashed.values()),
        "queue": svc.router.queue_info(),
        "auto_tune": svc.autotune.describe(),
        "cpu_load": OWN_LOAD.describe(),  # why an engine started with fewer threads (backends/cpu_share.py)
    }
    for engine in svc.engines:  # engine-specific health (e.g. llama.cpp RPC workers), when there is any
        body.update(await engine.health_fields({lm.model.public: lm.options for lm in models if lm.engine is engine}))
    if svc.websocket_port is not None:  # only while the dedicated WebSocket server runs (lemonade.md)
        body["websocket_port"] = svc.websocket_port
    return body


@router.get("/stats")
async def stats(request: Request) -> dict[str, Any]:
    svc = services(request)
    # per model: acceptance rate, measured speed-up, what its engine runs (runtime/speculation_switch.py)
    return {**svc.stats.snapshot(), "speculation": svc.speculation.describe()}


@router.get("/system-stats")
async def get_system_stats() -> dict[str, Any]:
    return await asyncio.to_thread(system_stats)  # GPU counters may come from nvidia-smi


@router.get("/system-info")
async def get_system_info(request: Request, include_paths: bool = False) -> dict[str, Any]:
    """`include_paths=true` adds `cache_dir` and `config_dir`, so a client can tell whose server it talks to
    (the quick start refuses to use a server of another installation), and shows
    `model_storage.path` as it is; otherwise non-admins see it with placeholders (`~`, `<cache>`)."""
    svc = services(request)
    recipes = await asyncio.to_thread(svc.engines.system_info)
    info = await asyncio.to_thread(system_info, svc.catalog.hub_cache(), recipes)  # device tools run once
    providers = svc.cloud.describe()
    if providers:  # omitted when no provider is installed (api-lemonade.md)
        info["cloud"] = {"providers": providers}
    # The memory budget every memory decision reads (docs/memory.md), and the recipes it leaves no model of
    memory = svc.router.budget()
    info.update(memory.describe())
    info["memory_budget_set_by_cgroup"] = memory.source == "cgroup" or memory.cap_bytes < memory.ram_bytes
    unavailable = unavailable_recipes(svc, await asyncio.to_thread(memory_budget, svc))
    info["unavailable_recipes"] = list(unavailable)
    info["unavailable_recipe_reasons"] = unavailable
    if include_paths:
        info["cache_dir"] = str(svc.cache_dir)
        info["config_dir"] = str(svc.config_dir)
    elif isinstance(info.get("model_storage"), dict) and info["model_storage"].get("path"):
        info["model_storage"]["path"] = text_view(request.scope, svc)(info["model_storage"]["path"])
    return info
