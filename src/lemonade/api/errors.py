"""One error model for the whole server, rendered in each API family's own shape.

Handlers raise `APIError`; the exception handler picks the body shape from the request path's route
(route_table.py), so an Ollama client gets `{"error": "..."}`, an Anthropic client gets its
`{"type": "error", ...}` envelope and everything else gets the OpenAI shape (with Lemonade's
`status`/`message` pair).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lemonade.errors import (  # noqa: F401 - the api layer imports them from here
    APIError,
    bad_request,
    model_not_found,
    registration_error,
)
from lemonade.route_table import route_of, split
from lemonade.runtime.request_context import ClientGone

log = logging.getLogger("lemonade.server")

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_family(path: str) -> str:
    """Whose error shape a path answers with: its route's (route_table.py); for a path no route serves,
    Ollama's under `/api/`, else OpenAI's."""
    route = route_of(path)
    if route is not None:
        return route.error_family
    return "ollama" if split(path)[0] == "ollama" else "openai"


def error_body(family: str, status: int, message: str, type_: str, code: str | None,
               extra: dict[str, Any] | None = None, plain: bool = False) -> dict[str, Any]:
    """`plain`: the error documented as a bare string on a Lemonade route (registration on /v1/pull)."""
    if family == "ollama":
        return {"error": message}
    if plain and family == "openai":
        return {"error": message, "status": "error", "message": message}
    if family == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    err: dict[str, Any] = {"message": message, "type": type_, "code": code}
    err.update(extra or {})
    return {"error": err, "status": "error", "message": message}


def error_response(request_path: str, exc: APIError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = error_body(error_family(request_path), exc.status, exc.message, exc.type, exc.code, exc.extra, exc.plain)
    return JSONResponse(body, status_code=exc.status, headers=headers)


def describe_validation_error(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """Turn pydantic's error list into one sentence naming the field, plus a spec error code."""
    if not errors:
        return "Invalid request", "invalid_argument"
    first = errors[0]
    kind = first.get("type", "")
    loc = [str(p) for p in first.get("loc", ())]
    # Only the first element says where the value came from; a field may itself be named "query".
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    field = ".".join(loc)
    if kind in ("json_invalid", "json_type") or (kind == "model_attributes_type" and not loc):
        return ("Invalid JSON body: " + str(first.get("ctx", {}).get("error", first.get("msg", "")))
                if kind == "json_invalid" else "Request body must be a JSON object"), "invalid_json"
    if kind == "missing":
        return f"Missing required field '{field}'", "missing_argument"
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    got = first.get("input")
    shown = json.dumps(got)[:80] if isinstance(got, (str, int, float, bool, list, dict, type(None))) else repr(got)
    if field:
        return f"Invalid value for '{field}': {msg} (got {shown})", "invalid_argument"
    return f"Invalid request: {msg}", "invalid_argument"


# Lemonade's router refuses an inference request (a route with a span, route_table.py) without a model in
# these words, typed `invalid_request` (its ErrorType, not OpenAI's `invalid_request_error`); its clients and
# tests match on both.
NO_MODEL = ": no model specified in request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request.url.path, exc, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the client hung up (nginx's code for that)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, code = describe_validation_error(list(exc.errors()))
        route = route_of(request.url.path)
        if message == "Missing required field 'model'" and route is not None and route.span is not None:
            return error_response(request.url.path, APIError(400, message + NO_MODEL, type="invalid_request",
                                                             code=code))
        return error_response(request.url.path, APIError(400, message, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Not found: {request.method} {request.url.path}. See /openapi.json for the routes."
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        code = "request_too_large" if exc.status_code == 413 else None  # as BodySizeLimit's early refusal
        return error_response(request.url.path, APIError(exc.status_code, message, code=code), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("Unhandled error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, APIError(500, f"Internal error: {exc}", type="server_error"))
