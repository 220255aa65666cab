"""`GET /v1/params` and `POST /v1/params`: Lemonade's runtime settings endpoint.

GET answers every effective setting (all layers merged, the same tree as `config.json`'s keys);
POST changes settings for the running server only: validated like `lemonade config set`, applied at
once (listeners see it), never written to `config.json`, gone at restart (a persisted change of the
same key, `POST /internal/set`, replaces it). Backend keys may be flat (`{"llamacpp_args": "..."}`),
as Lemonade's recipe options spell them. Lemonade's own app and tests use it; its refusals are
`{"error": "<message naming the key>"}`, as theirs read them.

Who may change what: Lemonade's server takes POST from any API client, and so do we, except for the
settings that decide what runs and what it can reach, which stay the admin's where an admin key is
set (`admin_only`): engine flags (`*.args` may use flags a request may not), engine binaries, RPC
workers, model folders, cloud providers, the executables policy. GET answers any API client, with
this machine's folders shown as placeholders to non-admins, as `/v1/system-info` does.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from lemonade.api.middleware import is_admin
from lemonade.api.privacy import text_view
from lemonade.config import ConfigError, nested, validate_tree
from lemonade.errors import APIError
from lemonade.services import Services

router = APIRouter(tags=["config"])


ADMIN_ONLY_KEYS = frozenset({"extra_models_dir", "models_dir", "cloud_providers", "no_fetch_executables",
                             "llamacpp.prefer_system", "llamacpp.rpc_workers", "peers", "host", "port",
                             "websocket_port"})


def admin_only(key: str) -> bool:
    """A setting only the admin may change live: it picks a program to run, the flags it runs with, the
    folders the server reads, or the addresses it connects to or listens on."""
    leaf = key.rsplit(".", 1)[-1]
    return key in ADMIN_ONLY_KEYS or leaf == "args" or leaf.endswith("_args") or leaf.endswith("_bin")


def _refusal(message: str) -> APIError:
    return APIError(400, message, code="invalid_config", plain=True)


def _shown(value: Any, view: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shown(v, view) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(v, view) for v in value]
    return view(value) if isinstance(value, str) else value


@router.get("/params")
async def get_params(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    return _shown(svc.config.values, text_view(request.scope, svc))


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
        guarded = sorted(k for k in validate_tree(body) if admin_only(k))
    except ConfigError as exc:
        raise _refusal(str(exc)) from None
    if guarded and not is_admin(request.scope, svc.api_key, svc.admin_key):
        raise APIError(403, f"Changing {', '.join(guarded)} needs the admin key (LEMONADE_ADMIN_API_KEY) as "
                       "'Authorization: Bearer <key>': it decides what the server runs or reads. The API key may "
                       "change the other settings.", type="permission_error", code="admin_key_required", plain=True)
    try:
        changed = svc.config.set_runtime(body)
    except ConfigError as exc:
        raise _refusal(str(exc)) from None
    return {"status": "success", "updated": nested(changed)}
