"""Cloud providers over HTTP: `/v1/install` and `/v1/uninstall` with `backend: "cloud"` (dispatched
here by `backends.py`), `POST /v1/cloud/auth` and `DELETE /v1/cloud/auth/{provider}`.

The registry and discovery are `backends/cloud_providers.py`; this module only reads bodies and
shapes answers. A key given here stays in memory; no answer ever carries it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.errors import APIError
from lemonade.backends.cloud_providers import (
    DEFAULT_HEADER,
    DEFAULT_PREFIX,
    CloudProviders,
    Provider,
    check_provider,
    env_var,
)
from lemonade.services import Services

router = APIRouter(tags=["backends"])


class AuthRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    provider: str = Field(..., examples=["fireworks"])
    api_key: str = Field(..., description="Kept in the server's memory only")


def registry(svc: Services) -> CloudProviders:
    return svc.cloud


async def install_provider(svc: Services, body: Any, present: set[str]) -> dict[str, Any]:
    """Register (or update) a provider. Optional fields apply only when present in the body, so a
    re-install that changes the URL keeps a custom auth header (api-lemonade.md)."""
    cloud = registry(svc)
    if body.recipe not in (None, "cloud"):
        raise APIError(400, f"Field 'recipe': '{body.recipe}' does not go with backend \"cloud\" (leave it out)",
                       code="invalid_argument")
    old = cloud.providers().get(body.provider or "")
    header = body.auth_header_name if "auth_header_name" in present else \
        (old.auth_header_name if old else DEFAULT_HEADER)
    prefix = body.auth_header_prefix if "auth_header_prefix" in present else \
        (old.auth_header_prefix if old else DEFAULT_PREFIX)
    check_provider(body.provider, body.base_url, header, prefix)
    if body.api_key is not None and not body.api_key:
        raise APIError(400, "Field 'api_key' is empty; leave it out, or give the key", code="invalid_argument")
    insecure = body.allow_insecure_http if "allow_insecure_http" in present else \
        (old.allow_insecure_http if old else False)
    provider = Provider(body.provider, body.base_url.rstrip("/"), bool(insecure), header, prefix)
    cloud.save(provider)
    answer: dict[str, Any] = {"status": "success", "backend": "cloud", "provider": provider.name,
                              "base_url": provider.base_url, "auth_header_name": header, "auth_header_prefix": prefix}
    if body.api_key:
        if cloud.env_key(provider.name) is not None:
            answer["warning"] = (f"{env_var(provider.name)} is set in the server's environment; it takes precedence "
                                 "and the supplied API key was not stored.")
        else:
            cloud.set_runtime_key(provider.name, body.api_key)
    if provider.base_url.startswith("http://") and not provider.allow_insecure_http:
        answer["warning"] = ((answer["warning"] + " ") if "warning" in answer else "") + (
            f"{provider.base_url} is plain http://: the API key is not sent there (so no model is "
            "discovered) unless the provider is installed with allow_insecure_http: true")
    answer["models_discovered"] = await cloud.discover(provider.name, svc.http)
    answer["auth_state"] = cloud.auth_state(provider.name)
    return answer


async def uninstall_provider(svc: Services, name: str | None) -> dict[str, Any]:
    cloud = registry(svc)
    if not name:
        raise APIError(400, "Missing required field 'provider' (the installed provider's name)",
                       code="missing_argument")
    cloud.get(name)
    evicted = len(svc.catalog.remote_models(name))
    await svc.router.unload_where(lambda lm: lm.model.definition.get("cloud_provider") == name)
    cloud.remove(name)
    return {"status": "success", "backend": "cloud", "provider": name, "models_evicted": evicted}


@router.post("/cloud/auth")
async def set_key(request: Request, body: AuthRequest) -> dict[str, Any]:
    svc: Services = request.app.state.services
    cloud = registry(svc)
    if not body.provider:
        raise APIError(400, "Field 'provider' is empty", code="missing_argument")
    if not body.api_key:
        raise APIError(400, "Field 'api_key' is empty", code="missing_argument")
    cloud.get(body.provider)
    if cloud.env_key(body.provider) is not None:
        var = env_var(body.provider)
        raise APIError(409, f"{var} is set in the lemond process; the env var takes precedence and the supplied API "
                       "key was not stored.", type="auth_conflict", extra={"env_var": var})
    cloud.set_runtime_key(body.provider, body.api_key)
    count = await cloud.discover(body.provider, svc.http)
    return {"provider": body.provider, "auth_state": cloud.auth_state(body.provider), "models_discovered": count}


@router.delete("/cloud/auth/{provider}")
async def clear_key(request: Request, provider: str) -> dict[str, Any]:
    svc: Services = request.app.state.services
    cloud = registry(svc)
    cloud.get(provider)
    cleared = cloud.clear_runtime_key(provider)
    if cloud.env_key(provider) is None:  # nothing left to authenticate with: its models go
        await svc.router.unload_where(lambda lm: lm.model.definition.get("cloud_provider") == provider)
        await cloud.discover(provider, svc.http)
    return {"provider": provider, "cleared_runtime_key": cleared, "auth_state": cloud.auth_state(provider)}
