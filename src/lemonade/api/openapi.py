"""`/openapi.json` as the server really answers, so clients and fuzzers can trust it.

FastAPI's generated document promises a 422 `HTTPValidationError` for bad input, but every error
here is one of three family shapes (api/errors.py) with a 4xx or 5xx status of its own. This
module documents that shape as each operation's `default` response, the stream a `"stream": true`
request gets, and lets routes that read their body by hand (Ollama's, for its lenient content
types) still describe the body they expect.

Nothing of it is made before the first `/openapi.json`: the answer models (api/responses.py) are
imported, and the request bodies' schemas generated, when the document is first built, so a
server start does not pay for a document most runs never serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from pydantic import BaseModel

from lemonade.api.errors import error_family
from lemonade.route_table import EMPTY, OWN, REFUSED, route_of

if TYPE_CHECKING:
    from lemonade.api.responses import Answer

REF = "#/components/schemas/{model}"
_MESSAGE = {"type": "string"}
ERROR_SCHEMAS: dict[str, dict[str, Any]] = {
    "openai": {
        "title": "Error", "type": "object", "required": ["error"],
        "properties": {
            "error": {"type": "object", "required": ["message", "type"],
                      "properties": {"message": _MESSAGE, "type": {"type": "string"},
                                     "code": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
            "status": {"const": "error"}, "message": _MESSAGE}},
    "ollama": {"title": "OllamaError", "type": "object", "required": ["error"], "properties": {"error": _MESSAGE}},
    "anthropic": {
        "title": "AnthropicError", "type": "object", "required": ["type", "error"],
        "properties": {"type": {"const": "error"},
                       "error": {"type": "object", "required": ["type", "message"],
                                 "properties": {"type": {"type": "string"}, "message": _MESSAGE}}}},
}
_SCHEMA_NAMES = {family: schema["title"] for family, schema in ERROR_SCHEMAS.items()}
# Lemonade's plain refusals: `{"error": "<message>"}` as api-lemonade.md shows it for a refused model
# definition on /v1/pull (errors.registration_error), and as Lemonade's server answers bad settings,
# variant queries, routing policies and jobs (its clients read `error` as the message), next to the
# status/message pair. The routes that may answer so are `plain_error` in route_table.py.
PLAIN_ERROR: dict[str, Any] = {"title": "RegistrationError", "type": "object", "required": ["error"],
                               "properties": {"error": _MESSAGE, "status": {"const": "error"}, "message": _MESSAGE}}
# A streaming route's stream (route_table.py `streams`): SSE, or Ollama's NDJSON.
STREAM_MEDIA = {"ollama": "application/x-ndjson"}
# One SSE event as OpenAPI 3.2 describes it (`data` is the raw text: JSON, or `[DONE]`); an NDJSON
# stream is one JSON object per line, left unconstrained here.
STREAM_SCHEMAS: dict[str, dict[str, Any]] = {
    "text/event-stream": {"type": "object", "properties": {
        "event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"},
        "retry": {"type": "integer"}}},
    "application/x-ndjson": {},
}
# Request bodies documented by `json_body`: each schema dict is filled from its model by `build_openapi`.
_BODIES: list[tuple[dict[str, Any], type[BaseModel]]] = []


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that parses its body itself (api/body.py): documents `model` as the
    request body. The schema is generated when the document is first built (and its nested models
    hoisted into the components), not when the route is defined."""
    schema: dict[str, Any] = {}
    _BODIES.append((schema, model))
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _add_component(components: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    if components.setdefault(name, schema) != schema:
        raise ValueError(f"Two different schemas are named {name} in /openapi.json: rename one")


def _success(answer: Answer, components: dict[str, Any]) -> dict[str, Any]:
    """The documented 200 response of an operation (its answer in api/responses.py)."""
    if answer is None:
        return {"description": "Success, with an empty body"}
    if isinstance(answer, dict):
        return {"description": "Success", "content": {media: {"schema": schema} for media, schema in answer.items()}}
    schema = answer.model_json_schema(ref_template=REF)
    for name, nested in schema.pop("$defs", {}).items():
        _add_component(components, name, nested)
    _add_component(components, answer.__name__, schema)
    return {"description": "Success",
            "content": {"application/json": {"schema": {"$ref": REF.format(model=answer.__name__)}}}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with the real success and error responses, without the 422 it never sends."""
    from fastapi.openapi.utils import get_openapi

    from lemonade.api import responses

    for schema, model in _BODIES:
        if not schema:
            schema.update(model.model_json_schema(ref_template=REF))
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for family, schema in ERROR_SCHEMAS.items():
        components[_SCHEMA_NAMES[family]] = schema
    components[PLAIN_ERROR["title"]] = PLAIN_ERROR
    for path, item in doc["paths"].items():
        route = route_of(path)  # every documented path has one (tests/unit/test_route_table.py)
        family = error_family(path)
        error: dict[str, Any] = {"$ref": REF.format(model=_SCHEMA_NAMES[family])}
        if route is not None and route.plain_error:
            error = {"anyOf": [error, {"$ref": REF.format(model=PLAIN_ERROR["title"])}]}
        answers = route.methods if route is not None else {}
        for method, operation in item.items():
            documented = operation.setdefault("responses", {})
            documented.pop("422", None)
            answer = answers.get(method, OWN)
            if answer == REFUSED:
                documented.pop("200", None)
            elif answer != OWN:
                documented["200"] = _success(None if answer == EMPTY else getattr(responses, answer), components)
            if route is not None and route.streams and "200" in documented:
                media = STREAM_MEDIA.get(family, "text/event-stream")
                documented["200"].setdefault("content", {})[media] = {"schema": STREAM_SCHEMAS[media]}
            documented["default"] = {"description": "Error, in this API family's shape",
                                     "content": {"application/json": {"schema": error}}}
            for media in operation.get("requestBody", {}).get("content", {}).values():
                components.update(media.get("schema", {}).pop("$defs", {}))
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve `build_openapi`'s document (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
