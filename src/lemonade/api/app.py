"""The ASGI app: routers mounted under Lemonade's four prefixes, middleware, error handling.

Every API route is served at `/api/v1`, `/api/v0`, `/v1` and `/v0`. Root-only: `/live`,
`/metrics`, `/mcp`, `/internal/*`, `/peers/*` (api/peers.py) and the web app (`/`, `/static/*`,
api/webapp.py); the Ollama API lives at `/api/*`; the WebSockets `/logs/stream`, `/spans/stream`
and `/realtime` are served at the root and under the prefixes.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from starlette.routing import Match
from starlette.types import Scope

from lemonade import __version__
from lemonade.api import internal, internal_mcp, peers
from lemonade.api.anthropic import messages
from lemonade.api.direct import DirectRoutes
from lemonade.api.errors import error_body, error_family, install_error_handlers
from lemonade.api.guard import RequestGuard
from lemonade.api.lemonade import (
    backends,
    cloud,
    downloads,
    load,
    logs,
    models,
    params,
    routing_validate,
    spans,
    status,
)
from lemonade.api.lemonade import classify as classify_routes
from lemonade.api.lemonade import jobs as job_routes
from lemonade.api.lemonade.job_ops import ServerOps
from lemonade.api.llamacpp import routes as llamacpp_routes
from lemonade.api.llamacpp import systemone as systemone_routes
from lemonade.api.mcp import routes as mcp_routes
from lemonade.api.middleware import BodySizeLimit
from lemonade.api.ollama import routes as ollama_routes
from lemonade.api.openai import audio, inference, realtime, speech
from lemonade.api.openai import images as openai_images
from lemonade.api.openai import models as openai_models
from lemonade.api.openapi import install_openapi
from lemonade.api.origins import OriginPolicy
from lemonade.api.webapp import install_web_app
from lemonade.jobs.manager import JobManager
from lemonade.observability.metrics import CONTENT_TYPE
from lemonade.route_table import PREFIXES
from lemonade.services import Services

log = logging.getLogger("lemonade.server")
# FastAPI 0.16x asks OpenTelemetry on every request whether it is configured, and builds per-route
# telemetry context; this server exports its own /metrics and configures no tracer, so it is off
# (older FastAPI has no such parameter).
NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def api_routers() -> list[APIRouter]:
    """Routers served under every prefix. Order matters where paths overlap (`/models/...`); the
    inference routers, whose paths overlap no other, come first because routes are matched one by
    one and they take almost all the traffic."""
    return [inference.router, messages.router, audio.router, status.router, models.router, openai_models.router,
            load.router, backends.router, downloads.router, llamacpp_routes.router, logs.router, spans.router,
            speech.router, realtime.router,
            classify_routes.router, systemone_routes.router, cloud.router, openai_images.router, params.router,
            routing_validate.router]


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
        message = (f"This port serves only the WebSockets /realtime, /logs/stream and /spans/stream (under any "
                   f"prefix); the HTTP API is on port {http_port}, which serves the WebSockets too.")
        body = json.dumps(error_body(error_family(scope.get("path", "")), 404, message, "not_found",
                                     "websocket_port")).encode()
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    return asgi


def _path_heads(route: Any) -> tuple[str, ...]:
    """What every path an included router can match starts with: for each of its routes, the full
    path up to its first parameter (`/v1/models/{model_id}` -> `/v1/models/`). Only the include
    prefix for a router that includes others; () when unknown."""
    context = getattr(route, "include_context", None)
    prefix = getattr(context, "prefix", "")
    router = getattr(route, "original_router", None)
    if not isinstance(prefix, str) or router is None:
        return ()
    heads = []
    for inner in getattr(router, "routes", []):
        path = getattr(inner, "path", None)
        if not isinstance(path, str) or getattr(inner, "original_router", None) is not None:
            return (prefix,) if prefix else ()
        heads.append(prefix + path.split("{", 1)[0])
    return tuple(heads)


def skip_other_paths(app: FastAPI) -> None:
    """Let each included router turn away a path none of its routes can match before trying them.

    Why: FastAPI matches a request against every route of every included router in turn (regex
    and scope bookkeeping per route, 20 to 40 us per router here), and the API routers are included
    under four prefixes, so an Ollama `/api/chat` was tried against about 150 routes first (0.3 to
    0.7 ms per request, docs/performance.md). A path that does not start with the static head of
    any of a router's routes cannot match one of them, fully or partially, so answering "no match"
    at once changes nothing else. Routers whose routes are unknown (older FastAPI flattens included
    routes) are left as they are.
    """
    for route in app.router.routes:
        heads = _path_heads(route)
        if not heads or not callable(getattr(route, "matches", None)):
            continue

        def matches(scope: Scope, _original: Any = route.matches,
                    _heads: tuple[str, ...] = heads) -> tuple[Match, Scope]:
            path: str = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root):]
            if not path.startswith(_heads):
                return Match.NONE, {}
            return _original(scope)

        route.matches = matches  # type: ignore[method-assign]  # replaced on purpose (see the docstring)


def create_app(services: Services) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        app.state.jobs.start()
        log.info("Lemonade %s ready (config dir %s, cache dir %s)", __version__, services.config_dir,
                 services.cache_dir)
        try:
            yield
        finally:
            log.info("Shutting down: stopping %d backend process(es)", len(services.router.models(usable=False)))
            await app.state.jobs.aclose()
            await services.aclose()

    app = FastAPI(title="Lemonade", version=__version__, lifespan=lifespan,
                  description="Local AI server: OpenAI, Ollama, Anthropic, MCP and Lemonade APIs.",
                  **NO_TELEMETRY)
    app.state.services = services
    app.state.jobs = JobManager(services.config_dir, ServerOps(services))  # jobs.json restored here
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
        services.metrics.set_loaded(loaded, services.router.limits())
        services.metrics.set_queue(services.router.queue_info())
        services.metrics.set_speculation(services.speculation.describe())
        targets = [({"model": lm.model.public, "recipe": lm.model.recipe, "type": lm.model.type},
                    lm.base_url + lm.engine.metrics_path)
                   for lm in services.router.models(usable=False) if lm.engine.metrics_path]
        body = await services.metrics.render(targets, services.http)
        return Response(body, media_type=CONTENT_TYPE)

    for prefix in PREFIXES:
        for router in api_routers():
            app.include_router(router, prefix=prefix)
        app.include_router(job_routes.router, prefix=prefix)
    app.include_router(logs.router)
    app.include_router(spans.router)
    app.include_router(realtime.router)
    app.include_router(internal.router)
    app.include_router(internal_mcp.router)
    app.include_router(peers.router)
    app.include_router(ollama_routes.router)
    app.include_router(mcp_routes.router)
    skip_other_paths(app)
    # The hot inference routes skip FastAPI's per-request machinery (api/direct.py); inside the guard.
    app.add_middleware(DirectRoutes, fastapi=app,
                       routes=[(prefix, route) for prefix in PREFIXES for router in api_routers()
                               for route in router.routes] + [("", route) for route in ollama_routes.router.routes])

    # Origins, API key, metrics, body limit, JSON content type, disconnect watch: one layer, one pass.
    app.add_middleware(RequestGuard, policy=OriginPolicy(services.allowed_origins), api_key=services.api_key,
                       admin_key=services.admin_key, body_limit=BodySizeLimit(services.config),
                       observe=services.metrics.observe_request, telemetry=services.telemetry,
                       peer_admits=services.peers.gate.admits)
    return app
