"""Cloud providers over HTTP: `/v1/install` and `/v1/uninstall` with `backend: "cloud"` (dispatched
here by `backends.py`), `POST /v1/cloud/auth` and `DELETE /v1/cloud/auth/{provider}`.

The registry and discovery are `backends/cloud/providers.py`; this module only reads bodies and
shapes answers. A key given here stays in memory; no answer ever carries it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.errors import APIError
from lemonade.backends.cloud.providers import (
    DEFAULT_HEADER,
    DEFAULT_PREFIX,
    CloudProviders,
    Provider,
    base_url_warnings,
    check_provider,
    env_var,
    insecure_http_refusal,
    is_plain_http,
)
from lemonade.services import Services

router = APIRouter(tags=["backends"])


class AuthRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    provider: str = Field(..., examples=["fireworks"])
    api_key: str = Field(..., description="Kept in the server's memory only")
    allow_insecure_http: bool | None = Field(None, description="Opt in to sending the key to an http:// provider "
                                                               "(kept with the provider)")


def with_warnings(answer: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """`warnings` (a list) and, for older clients, `warning` (one text), when there are any."""
    if warnings:
        answer["warnings"] = warnings
        answer["warning"] = " ".join(warnings)
    return answer


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
    # A key (given now, or in the environment) goes to an http:// provider only after an explicit opt-in.
    if is_plain_http(body.base_url) and not insecure and (body.api_key or cloud.env_key(body.provider) is not None):
        raise insecure_http_refusal(body.provider)
    provider = Provider(body.provider, body.base_url.rstrip("/"), bool(insecure), header, prefix)
    cloud.save(provider)
    answer: dict[str, Any] = {"status": "success", "backend": "cloud", "provider": provider.name,
                              "base_url": provider.base_url, "allow_insecure_http": provider.allow_insecure_http,
                              "auth_header_name": header, "auth_header_prefix": prefix}
    ignored = False
    if body.api_key:
        if cloud.env_key(provider.name) is not None:
            ignored = True
        else:
            cloud.set_runtime_key(provider.name, body.api_key)
    answer["models_discovered"] = await cloud.discover(provider.name, svc.http)
    answer["auth_state"] = cloud.auth_state(provider.name)
    warnings = base_url_warnings(provider.base_url, cloud.key(provider.name) is not None)
    if ignored:
        warnings.append(f"{env_var(provider.name)} is set in the server's environment; it takes precedence and the "
                        "supplied API key was not stored.")
    return with_warnings(answer, warnings)


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
    provider = cloud.get(body.provider)
    if is_plain_http(provider.base_url) and not provider.allow_insecure_http:
        if not body.allow_insecure_http:
            raise insecure_http_refusal(provider.name)
        provider.allow_insecure_http = True  # the opt-in is kept with the provider, as an install's is
        cloud.save(provider)
    if cloud.env_key(body.provider) is not None:
        var = env_var(body.provider)
        raise APIError(409, f"{var} is set in the lemond process; the env var takes precedence and the supplied API "
                       "key was not stored.", type="auth_conflict", extra={"env_var": var})
    cloud.set_runtime_key(body.provider, body.api_key)
    count = await cloud.discover(body.provider, svc.http)
    return with_warnings({"provider": body.provider, "allow_insecure_http": provider.allow_insecure_http,
                          "auth_state": cloud.auth_state(body.provider), "models_discovered": count},
                         base_url_warnings(provider.base_url, True))


@router.delete("/cloud/auth/{provider}")
async def clear_key(request: Request, provider: str) -> dict[str, Any]:
    svc: Services = request.app.state.services
    cloud = registry(svc)
    cloud.get(provider)
    cleared = cloud.clear_runtime_key(provider)
    if cloud.env_key(provider) is None:
        # Nothing left to authenticate with: its models leave the listing. One that is loaded stays loaded
        # (as in Lemonade) and its requests are refused for want of a key, which tells the client what to do.
        await cloud.discover(provider, svc.http)
    return {"provider": provider, "cleared_runtime_key": cleared, "auth_state": cloud.auth_state(provider)}
