"""The ASGI app: routers mounted under Lemonade's four prefixes, middleware, error handling.

Every API route is served at `/api/v1`, `/api/v0`, `/v1` and `/v0`. Root-only: `/live`,
`/metrics`, `/mcp`, `/internal/*`; the Ollama API lives at `/api/*`; `/logs/stream` is served at
the root and under the prefixes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware

from lemonade import __version__
from lemonade.api import internal
from lemonade.api.errors import install_error_handlers
from lemonade.api.lemonade import backends, load, logs, models, status
from lemonade.api.middleware import AuthMiddleware, DefaultJSONContentType, MetricsMiddleware
from lemonade.api.openai import models as openai_models
from lemonade.observability.metrics import CONTENT_TYPE
from lemonade.services import Services

log = logging.getLogger("lemonade.server")
PREFIXES = ("/api/v1", "/api/v0", "/v1", "/v0")


def api_routers() -> list[APIRouter]:
    """Routers served under every prefix. Order matters where paths overlap (`/models/...`)."""
    from lemonade.api.llamacpp import routes as llamacpp_routes
    from lemonade.api.openai import inference

    routers = [status.router, models.router, openai_models.router, load.router, backends.router,
               inference.router, llamacpp_routes.router, logs.router]
    for optional in ("lemonade.api.lemonade.downloads", "lemonade.api.anthropic.messages"):
        module = _optional(optional)
        if module is not None:
            routers.append(module.router)
    return routers


def _optional(name: str):  # noqa: ANN202 - a module or None
    """Feature modules that may not be present in a partial checkout of this tree."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


def create_app(services: Services) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for hook in app.state.startup_hooks:
            await hook(services)
        log.info("Lemonade %s ready (cache dir %s)", __version__, services.cache_dir)
        try:
            yield
        finally:
            log.info("Shutting down: stopping %d backend process(es)", len(services.router.loaded))
            await services.aclose()

    app = FastAPI(title="Lemonade", version=__version__, lifespan=lifespan,
                  description="Local AI server: OpenAI, Ollama, Anthropic, MCP and Lemonade APIs.")
    app.state.services = services
    app.state.startup_hooks = []
    install_error_handlers(app)

    for prefix in PREFIXES:
        for router in api_routers():
            app.include_router(router, prefix=prefix)
    app.include_router(logs.router)
    app.include_router(internal.router)
    for module_name in ("lemonade.api.ollama.routes", "lemonade.api.mcp.routes"):
        module = _optional(module_name)
        if module is not None:
            app.include_router(module.router)
    downloads_module = _optional("lemonade.downloads.manager")
    if downloads_module is not None:
        app.state.startup_hooks.append(downloads_module.attach)

    @app.api_route("/live", methods=["GET", "HEAD"], tags=["status"])
    async def live(request: Request) -> Response:
        if request.method == "HEAD":
            return Response(status_code=200)
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.api_route("/metrics", methods=["GET", "HEAD"], tags=["status"])
    async def metrics(request: Request) -> Response:
        if request.method == "HEAD":
            return Response(status_code=200, media_type=CONTENT_TYPE)
        loaded = services.router.describe()
        services.metrics.set_loaded(loaded)
        targets = [({"model": m["model_name"], "recipe": m["recipe"], "type": m["type"]},
                    m["backend_url"].removesuffix("/v1") + "/metrics")
                   for m in loaded if m["recipe"] == "llamacpp"]
        body = await services.metrics.render(targets, services.http)
        return Response(body, media_type=CONTENT_TYPE)

    app.add_middleware(DefaultJSONContentType)
    app.add_middleware(MetricsMiddleware, observe=services.metrics.observe_request)
    app.add_middleware(AuthMiddleware, api_key=services.api_key, admin_key=services.admin_key)
    # CORS outermost, so browser apps get the headers even on a 401.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"],
                       expose_headers=["*"])
    return app
