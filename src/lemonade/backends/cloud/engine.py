"""The cloud engine: a model served by an OpenAI-compatible provider elsewhere (cloud offload).

One more engine for the router and the proxy: "loading" a cloud model starts no process, it binds
the model to its provider (`CloudConnection`), takes no slot (`remote = True`) and never evicts a
local model. Each request leaves through `outbound`: the provider's URL for our endpoint, the
model named as the provider knows it, the key in the provider's header (read at send time, so a
key given or cleared later applies at once). Refusals and silence come back as our errors, naming
the provider (`upstream_error`, `unreachable`); the key is in no message, log line or listing.
Providers and their models: `backends/cloud/providers.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.cloud.providers import RECIPE, CloudProviders, Provider
from lemonade.backends.engine import BackendState, Engine, EngineUnavailable, InstallError, Launch, Progress
from lemonade.errors import APIError

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo


STREAM_USAGE_PATHS = ("/v1/chat/completions", "/v1/completions")


class CloudConnection:
    """What a loaded cloud model is bound to: the parts of `WrappedServer` the router reads, with no
    process behind them (nothing to start, stop or watch)."""

    pid = None
    proc = None
    argv: list[str] = []  # no program is started (health `launch_command` is empty)
    alive = True
    on_exit = None

    def __init__(self, provider: Provider, upstream_id: str) -> None:
        self.provider = provider
        self.upstream_id = upstream_id
        # Health shows `base_url + "/v1"` as a model's backend URL: for the usual ".../v1" provider URL
        # that is the provider's URL itself. Requests use the provider's URL as registered (`outbound`).
        self.base_url = provider.base_url.removesuffix("/v1")

    async def stop(self, grace: float = 0.0) -> None:
        return None

    def kill_now(self, report: bool = False) -> None:
        return None

    def __repr__(self) -> str:  # never the key: it is not held here at all
        return f"CloudConnection({self.provider.name}, {self.upstream_id})"


class CloudEngine(Engine):
    recipe = RECIPE
    remote = True
    process = "cloud"
    endpoints = {"chat/completions": "/v1/chat/completions", "completions": "/v1/completions",
                 "responses": "/v1/responses", "embeddings": "/v1/embeddings"}

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.providers = CloudProviders(config)

    def state(self, backend: str) -> BackendState:
        count = len(self.providers.providers())
        return BackendState(self.recipe, backend, "installed", version=None,
                            message=f"{count} cloud provider(s) registered; add one with: lemonade cloud install "
                                    "NAME --base-url URL")

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        raise InstallError("Cloud providers are registered by name: POST /v1/install with {\"backend\": \"cloud\", "
                           "\"provider\": NAME, \"base_url\": URL}, or lemonade cloud install NAME --base-url URL",
                           code="missing_argument")

    def uninstall(self, backend: str) -> dict[str, Any]:
        raise InstallError("Cloud providers are removed by name: POST /v1/uninstall with {\"backend\": \"cloud\", "
                           "\"provider\": NAME}, or lemonade cloud uninstall NAME", code="missing_argument")

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        name = model.definition.get("cloud_provider", "")
        provider = self.providers.providers().get(name)
        if provider is None:
            raise EngineUnavailable(f"Model {model.public}: cloud provider '{name}' is no longer installed",
                                    code="model_load_error")
        try:
            self.providers.headers(provider)  # refuse now, with the reason, when no key can be sent
        except APIError as exc:
            raise EngineUnavailable(exc.message, code=exc.code or "cloud_auth_missing") from None
        return Launch(CloudConnection(provider, model.definition["upstream_id"]),  # type: ignore[arg-type]
                      dict(options), backend, device="cloud")

    # ----- requests ------------------------------------------------------------------------------------
    def outbound(self, launch: Launch, path: str, body: dict[str, Any] | None,
                 headers: dict[str, str]) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
        conn: CloudConnection = launch.server  # type: ignore[assignment]
        provider = self.providers.providers().get(conn.provider.name, conn.provider)
        headers = {**headers, **self.providers.headers(provider)}
        if body is not None and "model" in body:
            body = {**body, "model": conn.upstream_id}
        if body is not None and self.asks_stream_usage(path, body):
            body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        return provider.base_url + path.removeprefix("/v1"), body, headers

    def asks_stream_usage(self, path: str, body: dict[str, Any]) -> bool:
        """OpenAI-style providers report a stream's usage only when asked (`stream_options.include_usage`)."""
        options = body.get("stream_options")
        return bool(body.get("stream")) and path in STREAM_USAGE_PATHS and not (
            isinstance(options, dict) and options.get("include_usage"))

    def upstream_error(self, launch: Launch, status: int, message: str) -> tuple[int, str, str] | None:
        name = launch.server.provider.name  # type: ignore[attr-defined]
        if status in (401, 403):
            return 502, (f"Cloud provider '{name}' refused the server's API key (HTTP {status}): {message}. Check "
                         f"the key (lemonade cloud auth {name}, or the server's environment)"), "cloud_auth_failed"
        if status == 429:
            return 429, f"Cloud provider '{name}' is rate limiting requests: {message}", "cloud_rate_limited"
        if status >= 500:
            return 502, f"Cloud provider '{name}' failed (HTTP {status}): {message}", "cloud_provider_error"
        return status, f"Cloud provider '{name}': {message}", "invalid_request"

    def unreachable(self, launch: Launch, exc: BaseException) -> tuple[int, str, str]:
        conn: CloudConnection = launch.server  # type: ignore[assignment]
        cause = exc.__cause__ or exc  # the client's own error (runtime/remote_http.py)
        return 502, (f"Cloud provider '{conn.provider.name}' at {conn.provider.base_url} did not answer "
                     f"({type(cause).__name__}: {cause}); local models are not affected"), "cloud_provider_unreachable"
