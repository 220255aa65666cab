"""Cloud providers: OpenAI-compatible services registered by name, and the models they serve.

A provider is `name` + `base_url` (+ the header its key goes in), persisted in `config.json`
`cloud_providers`. Its key is never written anywhere: `LEMONADE_<NAME>_API_KEY` in the server's
environment wins, else a key given to `POST /v1/cloud/auth` kept in this process's memory only.
Its models are discovered with `GET {base_url}/models` (on install, on auth, at start and every
`REFRESH_SECONDS`) and published to the catalog as `<name>.<model id>`. A discovery that fails
keeps the last list: requests then get a 502 naming the provider instead of a 404. A listing's
`pricing` becomes USD per million tokens (`cost_input_per_million`, `cost_output_per_million`) as
the cloud guide says: OpenRouter's per-token `prompt`/`completion` times 1e6, Together's per-million
`input`/`output` as they are; 0 or no price is left out (ambiguous across providers).

The key is only ever read by `headers()`; nothing here logs, returns or formats it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from lemonade.errors import APIError
from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.cloud")
RECIPE = "cloud"
REFRESH_SECONDS = 600.0
DISCOVERY_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
HEADER_PATTERN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
RESERVED_NAMES = ("user", "extra", "builtin")  # model-id prefixes of the other sources (catalog/naming.py)
DEFAULT_HEADER, DEFAULT_PREFIX = "Authorization", "Bearer "
# Model ids that are not chat models; the rest of a provider's list is (providers rarely say).
NOT_CHAT = re.compile(r"whisper|tts|dall-e|image|moderation|rerank|transcrib|speech|audio", re.IGNORECASE)
EMBEDDING = re.compile(r"embed", re.IGNORECASE)


def env_var(name: str) -> str:
    return f"LEMONADE_{name.upper().replace('-', '_')}_API_KEY"


@dataclass
class Provider:
    name: str
    base_url: str
    allow_insecure_http: bool = False
    auth_header_name: str = DEFAULT_HEADER
    auth_header_prefix: str = DEFAULT_PREFIX

    def stored(self) -> dict[str, Any]:
        """Its `config.json` entry (defaults left out, as the guide shows; never a key)."""
        out: dict[str, Any] = {"name": self.name, "base_url": self.base_url,
                               "allow_insecure_http": self.allow_insecure_http}
        if self.auth_header_name != DEFAULT_HEADER:
            out["auth_header_name"] = self.auth_header_name
        if self.auth_header_prefix != DEFAULT_PREFIX:
            out["auth_header_prefix"] = self.auth_header_prefix
        return out

    @classmethod
    def from_stored(cls, entry: dict[str, Any]) -> Provider:
        return cls(name=entry["name"], base_url=entry["base_url"].rstrip("/"),
                   allow_insecure_http=bool(entry.get("allow_insecure_http", False)),
                   auth_header_name=entry.get("auth_header_name", DEFAULT_HEADER),
                   auth_header_prefix=entry.get("auth_header_prefix", DEFAULT_PREFIX))


def check_provider(name: Any, base_url: Any, header: Any = DEFAULT_HEADER, prefix: Any = DEFAULT_PREFIX) -> None:
    """400 naming the field when a provider cannot be registered as given."""
    if not isinstance(name, str) or not name:
        raise APIError(400, "Missing required field 'provider' (a short name such as 'fireworks')",
                       code="missing_argument")
    if not NAME_PATTERN.match(name) or name in RESERVED_NAMES:
        raise APIError(400, f"Field 'provider': '{name}' is not a usable provider name: use 1-32 lowercase letters, "
                       "digits, '-' or '_', starting with a letter (not 'user', 'extra' or 'builtin': those prefix "
                       "other models' ids)", code="invalid_argument")
    if not isinstance(base_url, str) or not base_url:
        raise APIError(400, "Missing required field 'base_url' (the provider's OpenAI-compatible URL, ending in /v1)",
                       code="missing_argument")
    if not base_url.startswith(("http://", "https://")) or any(c.isspace() for c in base_url):
        raise APIError(400, f"Field 'base_url': '{base_url}' is not an http:// or https:// URL",
                       code="invalid_argument")
    try:
        host = httpx.URL(base_url).host
    except httpx.InvalidURL:
        host = ""
    if not host:
        raise APIError(400, f"Field 'base_url': '{base_url}' must include a host, e.g. https://api.example.com/v1",
                       code="invalid_argument")
    if not isinstance(header, str) or not HEADER_PATTERN.match(header):
        raise APIError(400, f"Field 'auth_header_name': {header!r} is not a valid HTTP header name",
                       code="invalid_argument")
    if not isinstance(prefix, str) or "\n" in prefix or "\r" in prefix:
        raise APIError(400, "Field 'auth_header_prefix' must be a single-line string", code="invalid_argument")


def is_plain_http(base_url: str) -> bool:
    return base_url.lower().startswith("http://")


def base_url_warnings(base_url: str, key_available: bool) -> list[str]:
    """What to tell whoever registers or authenticates a provider about its URL (the same words as
    Lemonade's, which its app shows)."""
    if not is_plain_http(base_url):
        return []
    warnings = ["Base URL uses http://; traffic to this provider is not encrypted."]
    if key_available:
        warnings.append("An API key is configured for this http:// provider; Lemonade will send it as a Bearer "
                        "token over plaintext HTTP.")
    return warnings


def insecure_http_refusal(name: str) -> APIError:
    """A key for an http:// provider without the explicit opt-in: refused before it is stored or used."""
    return APIError(400, f"Cloud provider '{name}' uses http://. Set allow_insecure_http=true to explicitly opt in "
                    "before storing or using an API key over plaintext HTTP.", code="insecure_http_requires_opt_in")


def public_id(provider: str, upstream: str) -> str:
    """`<provider>.<id>`, the id cleaned as the guide says: `accounts/<x>/models/` wrappers and a
    leading segment repeating the provider's name are dropped."""
    cleaned = re.sub(r"^accounts/[^/]+/models/", "", upstream)
    if cleaned.lower().startswith(provider + "/"):
        cleaned = cleaned[len(provider) + 1:]
    return f"{provider}.{cleaned}"


def listed_prices(entry: dict[str, Any]) -> dict[str, float]:
    """The per-million-token prices of one `GET /models` item, where the provider gives them."""
    pricing = entry.get("pricing")
    if not isinstance(pricing, dict):
        return {}
    per_token = "prompt" in pricing or "completion" in pricing
    keys = ("prompt", "completion") if per_token else ("input", "output")
    out: dict[str, float] = {}
    for key, name in zip(keys, ("cost_input_per_million", "cost_output_per_million"), strict=True):
        raw = pricing.get(key)
        try:
            value = float(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else 0.0
        except ValueError:
            value = 0.0
        if math.isfinite(value) and value > 0:
            out[name] = value * 1e6 if per_token else value
    return out


def model_from_listing(provider: str, entry: dict[str, Any]) -> ModelInfo | None:
    """A catalog entry for one `GET /models` item, or None for a model that serves neither chat nor
    embeddings (audio, images, moderation)."""
    upstream = entry.get("id")
    if not isinstance(upstream, str) or not upstream:
        return None
    kind = str(entry.get("type") or "").lower()
    caps = entry.get("capabilities")
    if not isinstance(caps, (list, dict)):
        caps = []
    modality = str((entry.get("architecture") or {}).get("modality") or "") if isinstance(
        entry.get("architecture"), dict) else ""
    if kind in ("embedding", "embeddings") or EMBEDDING.search(upstream):
        mode = "embeddings"
    elif entry.get("supports_chat") is False or (NOT_CHAT.search(upstream) and not entry.get("supports_chat")):
        return None
    else:
        mode = "chat"
    labels = ["embeddings"] if mode == "embeddings" else []  # the deployment label listings show
    if "image" in modality.split("->")[0] or "vision" in caps or entry.get("supports_image_input"):
        labels.append("vision")
    if "tools" in caps or "tool-calling" in caps or entry.get("supports_tools"):
        labels.append("tool-calling")
    if "reasoning" in caps or entry.get("supports_reasoning"):
        labels.append("reasoning")
    definition: dict[str, Any] = {"recipe": RECIPE, "cloud_provider": provider, "upstream_id": upstream}
    ctx = entry.get("context_length") or entry.get("context_window")
    if isinstance(ctx, int) and ctx > 0:
        definition["context_length"] = ctx
    definition.update(listed_prices(entry))
    return ModelInfo(name=public_id(provider, upstream), recipe=RECIPE, mode=mode, labels=labels, suggested=False,
                     source="cloud", origin="cloud", definition=definition)


class CloudProviders:
    """The registry: providers from config, keys in memory or the environment, discovered models.

    `publish(provider, models)` hands a provider's models to the catalog (an empty list withdraws
    them); the server wires it (services.py). The HTTP client is given per call, so this object
    needs no event loop until discovery runs."""

    def __init__(self, config: Any, environ: dict[str, str] | None = None) -> None:
        self.config = config
        self.environ = os.environ if environ is None else environ
        self._keys: dict[str, str] = {}  # runtime keys: memory only
        self._discovered: dict[str, int] = {}
        self._refresher: asyncio.Task[None] | None = None
        self.publish: Callable[[str, list[ModelInfo]], None] = lambda provider, models: None
        self.withdraw_loaded: Callable[[str], Any] | None = None  # unloads a provider's models (services.py)

    # ----- the registry ----------------------------------------------------------------------------
    def providers(self) -> dict[str, Provider]:
        out = {}
        for entry in self.config.get("cloud_providers"):
            try:
                provider = Provider.from_stored(entry)
            except (KeyError, TypeError, AttributeError):
                continue
            out[provider.name] = provider
        return out

    def get(self, name: str) -> Provider:
        provider = self.providers().get(name)
        if provider is None:
            raise APIError(404, f"Cloud provider '{name}' is not installed. Install it first: POST /v1/install with "
                           "{\"backend\": \"cloud\", \"provider\": ..., \"base_url\": ...} "
                           "(lemonade cloud install NAME --base-url URL)", type="invalid_request_error",
                           code="provider_not_found")
        return provider

    def save(self, provider: Provider) -> None:
        entries = [p.stored() for n, p in self.providers().items() if n != provider.name] + [provider.stored()]
        self.config.set({"cloud_providers": entries})

    def remove(self, name: str) -> None:
        self.config.set({"cloud_providers": [p.stored() for n, p in self.providers().items() if n != name]})
        self._keys.pop(name, None)
        self._discovered.pop(name, None)
        self.publish(name, [])

    # ----- keys ----------------------------------------------------------------------------------------
    def env_key(self, name: str) -> str | None:
        return self.environ.get(env_var(name)) or None

    def key(self, name: str) -> str | None:
        """The key to send: the environment's wins over the runtime one."""
        return self.env_key(name) or self._keys.get(name)

    def set_runtime_key(self, name: str, key: str) -> None:
        self._keys[name] = key

    def clear_runtime_key(self, name: str) -> bool:
        return self._keys.pop(name, None) is not None

    def auth_state(self, name: str) -> dict[str, bool]:
        return {"env_var_set": self.env_key(name) is not None, "runtime_key_set": name in self._keys}

    def headers(self, provider: Provider) -> dict[str, str]:
        """The credential header for a request to `provider`; APIError when none can be sent."""
        key = self.key(provider.name)
        if key is None:
            raise APIError(502, f"No API key for cloud provider '{provider.name}': set {env_var(provider.name)} in "
                           f"the server's environment, or run: lemonade cloud auth {provider.name}",
                           type="server_error", code="cloud_auth_missing")
        if is_plain_http(provider.base_url) and not provider.allow_insecure_http:
            raise APIError(502, f"Cloud provider '{provider.name}' has an http:// base URL; its API key is not sent "
                           "over plain HTTP unless the provider is installed with allow_insecure_http: true",
                           type="server_error", code="cloud_insecure_http")
        return {provider.auth_header_name: provider.auth_header_prefix + key}

    # ----- discovery ---------------------------------------------------------------------------------
    def discovered(self, name: str) -> int:
        return self._discovered.get(name, 0)

    async def discover(self, name: str, http: httpx.AsyncClient) -> int:
        """Refresh one provider's models; the count published. Without a key: 0 and none listed. A
        provider that does not answer keeps its last list (logged as a warning)."""
        provider = self.providers().get(name)
        if provider is None:
            return 0
        try:
            headers = self.headers(provider)
        except APIError as exc:
            log.info("Cloud provider %s: models not discovered (%s)", name, exc.message)
            self._discovered[name] = 0
            self.publish(name, [])
            return 0
        try:
            resp = await http.get(provider.base_url + "/models", headers=headers, timeout=DISCOVERY_TIMEOUT)
            resp.raise_for_status()
            listing = resp.json().get("data")
            if not isinstance(listing, list):
                raise ValueError("its answer has no 'data' list")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            reason = f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else \
                f"{type(exc).__name__}: {exc}"
            log.warning("Cloud provider %s: discovery at %s/models failed (%s); keeping the %d model(s) found "
                        "before", name, provider.base_url, reason, self.discovered(name))
            return self.discovered(name)
        models = [m for m in (model_from_listing(name, e) for e in listing if isinstance(e, dict)) if m is not None]
        self._discovered[name] = len(models)
        self.publish(name, models)
        log.info("Cloud provider %s: %d model(s) discovered", name, len(models))
        return len(models)

    async def discover_all(self, http: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self.discover(name, http) for name in self.providers()))

    def start(self, http: httpx.AsyncClient) -> None:
        """Discovery at start and every REFRESH_SECONDS, in the background."""
        async def refresh() -> None:
            while True:
                try:
                    await self.discover_all(http)
                except Exception:  # one bad round must not stop the timer
                    log.exception("Cloud discovery failed")
                await asyncio.sleep(REFRESH_SECONDS)

        if self._refresher is None:
            self._refresher = asyncio.ensure_future(refresh())

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None

    def describe(self) -> list[dict[str, Any]]:
        """`cloud.providers` of `/v1/system-info`: names and states, never a key."""
        out = []
        for p in self.providers().values():
            entry = {**p.stored(), "auth_header_name": p.auth_header_name, "auth_header_prefix": p.auth_header_prefix,
                     "env_var": env_var(p.name), "env_var_set": self.env_key(p.name) is not None,
                     "runtime_key_set": p.name in self._keys, "models_discovered": self.discovered(p.name)}
            warnings = base_url_warnings(p.base_url, self.key(p.name) is not None)
            if warnings:
                entry["warnings"] = warnings
            out.append(entry)
        return out
