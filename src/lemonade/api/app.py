"""The ASGI app: routers mounted under Lemonade's four prefixes, middleware, error handling.

Every API route is served at `/api/v1`, `/api/v0`, `/v1` and `/v0`. Root-only: `/live`,
`/metrics`, `/mcp`, `/internal/*` and the web app (`/`, `/static/*`, api/webapp.py); the Ollama API
lives at `/api/*`; the WebSockets `/logs/stream` and `/realtime` are served at the root and under the
prefixes.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import PlainTextResponse

from lemonade import __version__
from lemonade.api import internal
from lemonade.api.anthropic import messages
from lemonade.api.disconnect import DisconnectWatch
from lemonade.api.errors import api_family, error_body, install_error_handlers
from lemonade.api.lemonade import backends, downloads, load, logs, models, status
from lemonade.api.llamacpp import routes as llamacpp_routes
from lemonade.api.mcp import routes as mcp_routes
from lemonade.api.middleware import AuthMiddleware, BodySizeLimit, DefaultJSONContentType, MetricsMiddleware
from lemonade.api.ollama import routes as ollama_routes
from lemonade.api.openai import audio, inference, realtime, speech
from lemonade.api.openai import models as openai_models
from lemonade.api.openapi import install_openapi
from lemonade.api.origins import OriginGuard, OriginPolicy
from lemonade.api.webapp import install_web_app
from lemonade.observability.metrics import CONTENT_TYPE
from lemonade.services import Services

log = logging.getLogger("lemonade.server")
PREFIXES = ("/v1", "/api/v1", "/v0", "/api/v0")  # most used first: routes are matched in order


def api_routers() -> list[APIRouter]:
    """Routers served under every prefix. Order matters where paths overlap (`/models/...`)."""
    return [status.router, models.router, openai_models.router, load.router, backends.router, downloads.router,
            inference.router, audio.router, speech.router, llamacpp_routes.router, messages.router, logs.router,
            realtime.router]


def websocket_only(app: FastAPI, http_port: int) -> Any:
    """The legacy dedicated WebSocket port (lemonade.md, health `websocket_port`): the same app, so the
    same routes, key checks and Origin rules, for WebSocket upgrades only; HTTP there is a 404 that
    names the port HTTP is served on."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        message = (f"This port serves only the WebSockets /realtime and /logs/stream (under any prefix); the HTTP "
                   f"API is on port {http_port}, which serves the WebSockets too.")
        body = json.dumps(error_body(api_family(scope.get("path", "")), 404, message, "not_found",
                                     "websocket_port")).encode()
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    return asgi


def create_app(services: Services) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        log.info("Lemonade %s ready (cache dir %s)", __version__, services.cache_dir)
        try:
            yield
        finally:
            log.info("Shutting down: stopping %d backend process(es)", len(services.router.loaded))
            await services.aclose()

    app = FastAPI(title="Lemonade", version=__version__, lifespan=lifespan,
                  description="Local AI server: OpenAI, Ollama, Anthropic, MCP and Lemonade APIs.")
    app.state.services = services
    install_error_handlers(app)
    install_openapi(app)
    install_web_app(app)

    # GET and HEAD as two routes, so each has its own OpenAPI operationId (one multi-method route
    # gives both the same id, which OpenAPI forbids and generated clients choke on).
    @app.get("/live", tags=["status"])
    @app.head("/live", tags=["status"])
    async def live(request: Request) -> Response:
        if request.method == "HEAD":
            return Response(status_code=200, media_type="application/json")
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get("/metrics", tags=["status"], response_class=PlainTextResponse)
    @app.head("/metrics", tags=["status"], response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        if request.method == "HEAD":
            return Response(status_code=200, media_type=CONTENT_TYPE)
        loaded = services.router.describe()
        services.metrics.set_loaded(loaded)
        services.metrics.set_queue(services.router.queue_info())
        targets = [({"model": lm.model.public, "recipe": lm.model.recipe, "type": lm.model.type},
                    lm.base_url + lm.engine.metrics_path)
                   for lm in services.router.loaded.values() if lm.engine.metrics_path]
        body = await services.metrics.render(targets, services.http)
        return Response(body, media_type=CONTENT_TYPE)

    for prefix in PREFIXES:
        for router in api_routers():
            app.include_router(router, prefix=prefix)
    app.include_router(logs.router)
    app.include_router(realtime.router)
    app.include_router(internal.router)
    app.include_router(ollama_routes.router)
    app.include_router(mcp_routes.router)

    app.add_middleware(DisconnectWatch)  # innermost: sees the body as the routes read it
    app.add_middleware(DefaultJSONContentType)
    app.add_middleware(BodySizeLimit, config=services.config)
    app.add_middleware(MetricsMiddleware, observe=services.metrics.observe_request)
    app.add_middleware(AuthMiddleware, api_key=services.api_key, admin_key=services.admin_key)
    # Origins outermost: a foreign page is refused before anything runs, allowed pages get CORS
    # headers even on a 401.
    app.add_middleware(OriginGuard, policy=OriginPolicy(services.allowed_origins))
    return app
