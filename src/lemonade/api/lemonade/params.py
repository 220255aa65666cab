"""`GET /v1/params` and `POST /v1/params`: Lemonade's runtime settings endpoint.

GET answers every effective setting (all layers merged, the same tree as `config.json`'s keys);
POST changes settings for the running server only: validated like `lemonade config set`, applied at
once (listeners see it), never written to `config.json`, gone at restart (a persisted change of the
same key, `POST /internal/set`, replaces it). Backend keys may be flat (`{"llamacpp_args": "..."}`),
as Lemonade's recipe options spell them. Lemonade's own app and tests use it; its refusals are
`{"error": "<message naming the key>"}`, as theirs read them.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from lemonade.config import ConfigError, nested
from lemonade.errors import APIError
from lemonade.services import Services

router = APIRouter(tags=["config"])


def _refusal(message: str) -> APIError:
    return APIError(400, message, code="invalid_config", plain=True)


@router.get("/params")
async def get_params(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    return svc.config.values


@router.post("/params", openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "object"}, "example": {"llamacpp_args": "--threads 4", "telemetry": {"enabled": True}}}}}})
async def set_params(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    try:
        body = json.loads(await request.body() or b"null")
    except ValueError as exc:
        raise _refusal(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or not body:
        raise _refusal("Request body must be a non-empty JSON object of settings, e.g. {\"max_loaded_models\": 2}")
    try:
        changed = svc.config.set_runtime(body)
    except ConfigError as exc:
        raise _refusal(str(exc)) from None
    return {"status": "success", "updated": nested(changed)}
