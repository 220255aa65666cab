"""Reading a JSON body by hand, for routes whose body may be empty or arrive without a JSON
content type (Ollama clients, `curl -d`, `POST /v1/unload` with no body)."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from lemonade.api.errors import APIError
from lemonade.util import jsonparse

Body = TypeVar("Body", bound=BaseModel)


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; an empty body is `{}`."""
    raw = await request.body()
    try:
        data = jsonparse.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise APIError(400, f"Invalid JSON body: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "Request body must be a JSON object", code="invalid_json")
    return data


async def parse_body(request: Request, cls: type[Body]) -> Body:
    """The body validated as `cls`; errors name the field, like FastAPI's own body validation."""
    try:
        return cls.model_validate(await json_object(request))
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
