"""Services: everything one server instance owns, built once and handed to the API layer.

No module keeps global state; tests can build several of these side by side.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from lemonade.api.errors import APIError, model_not_found
from lemonade.backends.install import BackendInstaller
from lemonade.catalog.catalog import Catalog, NotFound
from lemonade.catalog.models import ModelInfo
from lemonade.config import Config
from lemonade.observability.logs import LogBuffer
from lemonade.observability.metrics import Metrics
from lemonade.runtime.options import RecipeOptions
from lemonade.runtime.router import Router
from lemonade.runtime.stats import Stats

log = logging.getLogger("lemonade.server")


class Services:
    def __init__(self, cache_dir: Path, config: Config, logs: LogBuffer, *, api_key: str | None = None,
                 admin_key: str | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self.config = config
        self.logs = logs
        self.api_key = api_key
        self.admin_key = admin_key
        values = config.values
        self.catalog = Catalog(self.cache_dir, values["extra_models_dir"], values["models_dir"])
        self.installer = BackendInstaller(self.cache_dir)
        self.options = RecipeOptions(self.cache_dir, config)
        self.stats = Stats()
        self.metrics = Metrics()
        # Upstream calls to engines on loopback: no read timeout (generation can be long).
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                      limits=httpx.Limits(max_connections=256, max_keepalive_connections=64,
                                                          # below llama-server's 5 s idle close, so a kept
                                                          # connection is never one the engine just dropped
                                                          keepalive_expiry=2.0))
        self.router = Router(max_models=lambda: self.config.get("max_loaded_models"),
                             files_for=self.files_for_load, binary_for=self.engine_binary)
        self._engine_http: aiohttp.ClientSession | None = None
        self.downloads: Any = None  # set by lemonade.downloads when the server starts
        config.on_change(self._config_changed)

    def _config_changed(self, changed: dict[str, Any]) -> None:
        if "extra_models_dir" in changed or "models_dir" in changed:
            values = self.config.values
            self.catalog.set_dirs(values["extra_models_dir"], values["models_dir"])
        if "log_level" in changed:
            logging.getLogger("lemonade").setLevel(self.config.get("log_level").upper()
                                                   if self.config.get("log_level") != "trace" else 5)
        log.info("Configuration changed: %s", ", ".join(f"{k}={v!r}" for k, v in changed.items()))

    @property
    def offline(self) -> bool:
        return bool(self.config.get("offline"))

    def resolve(self, name: Any) -> ModelInfo:
        """A model by any accepted name, or 404 model_not_found."""
        if not isinstance(name, str) or not name:
            raise APIError(400, "Missing required field 'model'", code="missing_argument")
        try:
            return self.catalog.resolve(name)
        except NotFound:
            raise model_not_found(name) from None

    def engine_binary(self, backend: str) -> tuple[str, Path]:
        """(backend actually used, llama-server path). `llamacpp.prefer_system` picks a llama-server on
        PATH over the requested backend when there is one."""
        if backend != "system" and self.config.get("llamacpp.prefer_system"):
            system = self.installer.llama_server_path("system")
            if system is not None:
                return "system", system
        path = self.installer.llama_server_path(backend)
        if path is None:
            state = self.installer.state("llamacpp", backend)
            raise APIError(400, f"The llama.cpp '{backend}' backend is not installed ({state.message}). "
                           f"Install it with: {state.action or f'lemonade backends install llamacpp:{backend}'}",
                           code="backend_not_installed")
        return backend, path

    async def files_for_load(self, model: ModelInfo) -> dict[str, list[Path]]:
        """Files of a model about to load, downloading them first when needed."""
        files = self.catalog.local_files(model)
        if files is not None:
            return files
        if self.downloads is None:
            raise APIError(400, f"Model {model.name} is not downloaded. Run `lemonade pull {model.name}` first.",
                           code="model_not_downloaded")
        await self.downloads.ensure_downloaded(model)
        files = self.catalog.local_files(model)
        if files is None:
            raise APIError(500, f"Model {model.name} was downloaded but its files are not complete on disk",
                           code="model_load_error")
        return files

    def engine_http(self) -> aiohttp.ClientSession:
        """The client for requests to engines on loopback (aiohttp: about 1 ms less per request than
        httpx, see docs/performance.md). Created on first use, inside the server's event loop."""
        if self._engine_http is None or self._engine_http.closed:
            connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=2.0)  # < llama-server's 5 s idle close
            self._engine_http = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=10.0), auto_decompress=False)
        return self._engine_http

    async def aclose(self) -> None:
        await self.router.shutdown()
        if self._engine_http is not None:
            await self._engine_http.close()
        if self.downloads is not None and hasattr(self.downloads, "aclose"):
            await self.downloads.aclose()
        await self.http.aclose()
