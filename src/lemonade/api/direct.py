"""The inference routes served without FastAPI's per-request machinery.

Why: a `max_tokens=1` chat request spent about as much of our CPU in FastAPI as in our own code and
the engine round trip together (issue 17, docs/performance.md): its exception and exit-stack
middlewares, route matching, dependency solving, a `Content-Type` parse through `email.message`.
For routes that take nothing but the request and one JSON body this layer does the same work in a
few lines: an exact path lookup, the body read and parsed as FastAPI would, validated by the
route's own body field (so validation errors are FastAPI's, item for item), the endpoint called,
and exceptions answered by the app's own exception handlers. The routes stay registered in FastAPI
(OpenAPI, and every request this layer passes on), so behaviour is the same either way; the
equivalence is tested in tests/test_foundation.py.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from lemonade.api.middleware import ASGIApp, Scope

Endpoint = Callable[..., Awaitable[Response]]


class DirectRoute:
    """One route served directly: its endpoint and, when it takes a body model, that model's field."""

    def __init__(self, route: APIRoute) -> None:
        self.endpoint: Endpoint = route.endpoint
        self.body_field = route.body_field
        self.body_param = route.body_field.name if route.body_field is not None else ""

    @staticmethod
    def eligible(route: Any) -> bool:
        """A POST on a fixed path whose endpoint takes the request and at most one JSON body model, and
        answers a Response itself (nothing for FastAPI to serialise)."""
        if not isinstance(route, APIRoute) or route.methods != {"POST"} or "{" in route.path:
            return False
        deps = route.dependant
        if deps.dependencies or deps.path_params or deps.query_params or deps.header_params \
                or deps.cookie_params or len(deps.body_params) > 1 or deps.request_param_name is None:
            return False
        media_type = getattr(route.body_field.field_info, "media_type", "") if route.body_field else "application/json"
        if media_type != "application/json":
            return False
        returns = inspect.signature(route.endpoint).return_annotation
        return returns in (Response, "Response")

    async def validated_body(self, request: Request) -> dict[str, Any]:
        """The endpoint's body argument, or RequestValidationError with FastAPI's own error items."""
        if self.body_field is None:
            return {}
        raw = await request.body()
        if not raw:
            errors = [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
            raise RequestValidationError(errors)
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                                           "input": {}, "ctx": {"error": exc.msg}}], body=exc.doc) from None
        except (ValueError, RecursionError):  # not UTF-8/16/32 text, or nested too deeply: FastAPI's answer
            raise HTTPException(400, "There was an error parsing the body") from None
        value, errors = self.body_field.validate(data, {}, loc=("body",))
        if errors:
            raise RequestValidationError(errors, body=data)
        return {self.body_param: value}


def _is_json(scope: Scope) -> bool:
    """Content type exactly `application/json` (parameters allowed): what FastAPI parses as JSON. Any
    other type is left to FastAPI, whose rules for it stay the only ones."""
    for key, value in scope["headers"]:
        if key == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


class DirectRoutes:
    """ASGI layer in front of FastAPI: serves the eligible routes of `routers` under `prefixes` itself
    and passes everything else on unchanged."""

    def __init__(self, app: ASGIApp, *, fastapi: FastAPI, routes: Iterable[tuple[str, Any]]) -> None:
        self.app = app
        self.fastapi = fastapi
        self.table: dict[str, DirectRoute] = {}
        for prefix, route in routes:
            if isinstance(route, APIRoute) and route.methods == {"POST"}:  # FastAPI serves the first match
                if prefix + route.path not in self.table and DirectRoute.eligible(route):
                    self.table[prefix + route.path] = DirectRoute(route)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        route = self.table.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None or not _is_json(scope) or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        started = False

        async def tracked_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            response = await route.endpoint(request, **await route.validated_body(request))
            await response(scope, receive, tracked_send)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None or started:
                raise
            response = await handler(request, exc)
            await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Awaitable[Response]] | None:
        """The app's exception handler for `exc`, looked up as Starlette does (most specific class first).
        The catch-all `Exception` handler is left to Starlette's server-error layer, as FastAPI does."""
        handlers = self.fastapi.exception_handlers
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in handlers:
                return handlers[cls]  # type: ignore[return-value]  # the app registers async handlers only
        return None
