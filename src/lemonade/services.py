"""Services: everything one server instance owns, built once and handed to the API layer.

Construction and wiring only: each part is built here and given what it needs of the others (the
callbacks below are those, and the config's checks and reactions). What a request does with the
parts, the use cases every entry point shares, is in `serving/`.

No module keeps global state; tests can build several of these side by side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from lemonade.autotune.tuner import AutoTune
from lemonade.backends.cloud.engine import CloudEngine
from lemonade.backends.cloud.providers import CloudProviders
from lemonade.backends.engine import Engine, EngineUnavailable
from lemonade.backends.native_build import stop_builds
from lemonade.backends.peer.engine import PeerEngine
from lemonade.backends.peer.peers import Peers
from lemonade.backends.registry import Engines
from lemonade.catalog.catalog import Catalog
from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.config import BACKEND_ARGS, BIN_SECTIONS, Config, ConfigError
from lemonade.downloads.manager import DownloadManager
from lemonade.labels import ROUTER_RECIPE
from lemonade.mcp_client.host import McpHost
from lemonade.observability.logs import LogBuffer, level_number
from lemonade.observability.metrics import Metrics
from lemonade.observability.telemetry import Telemetry
from lemonade.routing.policies import Policies
from lemonade.runtime.engine_client import EngineClient
from lemonade.runtime.forwarding import PeerForwarding
from lemonade.runtime.options import RecipeOptions
from lemonade.runtime.proxy import Proxy
from lemonade.runtime.remote_http import RemoteHttp
from lemonade.runtime.router import Router
from lemonade.runtime.speculation_switch import SpeculationSwitch
from lemonade.runtime.stats import Stats
from lemonade.system.devices import detect_devices
from lemonade.system.suspend import SuspendGuard, SuspendInhibitor
from lemonade.util.http_client import async_client

log = logging.getLogger("lemonade.server")


class Services:
    def __init__(self, cache_dir: Path, config: Config, logs: LogBuffer, *, api_key: str | None = None,
                 admin_key: str | None = None, allowed_origins: str | None = None) -> None:
        self.cache_dir = Path(cache_dir)  # engines, downloads, caches: what can be fetched again
        self.config_dir = config.dir  # persistent JSON: user models, options, aliases, jobs (paths.py)
        self.config = config
        self.logs = logs
        self.api_key = api_key
        self.admin_key = admin_key
        self.allowed_origins = allowed_origins  # LEMONADE_ALLOWED_ORIGINS (api/origins.py)
        self.websocket_port: int | None = None  # the dedicated WebSocket port, once `serve` listens on it
        self.stop_server: Callable[[], None] | None = None  # ends `serve` as a signal would (/internal/shutdown)
        values = config.values
        self.catalog = Catalog(self.config_dir, values["extra_models_dir"], values["models_dir"])
        self.engines = Engines(self.cache_dir, config)
        self.options = RecipeOptions(self.config_dir, config)
        self.options.migrate_keys(self.catalog.canonical_key)
        self.autotune = AutoTune(self.cache_dir, config, engines=self.engines)
        self.options.tuning = self.autotune.values
        self.options.model_defaults = self._catalog_options
        self.options.architecture_of = self._architecture_of
        self.options.backend_of = self._backend_of
        self.stats = Stats()
        self.policies = Policies()  # parsed collection.router policies (api/openai/routing.py)
        self.metrics = Metrics()
        self.downloads = DownloadManager(self.cache_dir, self.catalog, lambda: self.offline)
        # Upstream calls to engines on loopback: no read timeout (generation can be long).
        self.http = async_client(timeout=httpx.Timeout(None, connect=10.0),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64,
                                                     # below llama-server's 5 s idle close, so a kept
                                                     # connection is never one the engine just dropped
                                                     keepalive_expiry=2.0))
        self.engine_client = EngineClient()
        self.remote_http = RemoteHttp(read_timeout=lambda: float(config.get("global_timeout")))
        # inhibit_suspend: a logind lock while the router has work (system/suspend.py), watched while models are loaded
        self.suspend = SuspendGuard(SuspendInhibitor(), busy=lambda: not self.router.drained(),
                                    enabled=lambda: bool(config.get("inhibit_suspend")),
                                    watching=lambda: bool(self.router.processes()))
        self.router = Router(engines=self.engines, config=config, files_for=self.downloads.files_for_load,
                             client=self.engine_client, on_change=self.suspend.wake)
        self.router.needed_helpers = self.routing_helpers
        # Speculative decoding kept on per model only while it earns speed (runtime/speculation.py)
        self.speculation = SpeculationSwitch(self.router)
        for engine in self.engines:
            engine.speculation_wanted = self.speculation.wanted
        self.proxy = Proxy(self.router, self.remote_http, self.engine_client, self.options, self.stats, self.metrics,
                           self.speculation)
        # Cloud providers (backends/cloud/providers.py): their discovered models join the catalog.
        self.cloud: CloudProviders = self.engines.get(CloudEngine.recipe).providers  # type: ignore[union-attr]
        self.cloud.publish = self.catalog.set_remote
        # The other servers of the LAN (backends/peer/peers.py): requests for models they serve may go there.
        self.peers: Peers = self.engines.get(PeerEngine.recipe).peers  # type: ignore[union-attr]
        self.peers.on_down = self._unbind_peer
        # where a request goes when this server does not serve it (runtime/forwarding.py)
        self.forwarding = PeerForwarding(self.catalog, self.engines, self.peers, self.router)
        self.proxy.instead = self.forwarding.instead
        self.telemetry = Telemetry(config)  # inference spans: OTLP export (`telemetry.enabled`), /spans/stream
        self.mcp = McpHost(self.config_dir)  # external MCP servers whose tools omni collections use (/internal/mcp)
        self._background: set[asyncio.Task[Any]] = set()  # work a config change started (_reload_on_new_binary)
        config.on_change(self._config_changed)
        for engine in self.engines:
            if engine.args_option and engine.available:
                key = engine.options[engine.args_option].config_key
                assert key is not None  # every `*_args` option is a config key
                config.add_check(key, self._args_check(engine))
                section = key.rsplit(".", 1)[0]
                for backend in BACKEND_ARGS.get(section, ()):
                    config.add_check(f"{section}.{backend}_args", self._args_check(engine, backend))

    @staticmethod
    def _args_check(engine: Engine, backend: str | None = None) -> Callable[[str], None]:
        """The server-wide `*.args` (and `*.<backend>_args`) are the admin's: any flag but ours, if the
        installed engine (that backend's, for `<backend>_args`) knows it."""
        def check(value: str) -> None:
            try:
                engine.check_args(value, trusted=True, backend=backend if backend in engine.backends else None)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return check

    async def start(self) -> None:
        """Startup work that needs the event loop: download jobs, the update check, and auto-tune's
        archetype detection (in a thread: the device tools take a moment)."""
        await self.downloads.start(bool(self.config.get("auto_check_model_updates")))
        self.cloud.start(self.http)
        self.peers.start(self.http)
        # Read the hardware once in a thread (vulkaninfo, nvidia-smi), so no request waits for it; auto-tune's
        # archetype comes from that report.
        self._detecting = asyncio.get_running_loop().run_in_executor(
            None, lambda: (detect_devices(), self.autotune.archetype))

    def _config_changed(self, changed: dict[str, Any]) -> None:
        if "extra_models_dir" in changed or "models_dir" in changed:
            values = self.config.values
            self.catalog.set_dirs(values["extra_models_dir"], values["models_dir"])
        rebinned = {(k.split(".", 1)[0], k.split(".", 1)[1].removesuffix("_bin")) for k in changed
                    if k.split(".", 1)[0] in BIN_SECTIONS and k.endswith("_bin")}
        if rebinned:
            self._reload_on_new_binary(rebinned)
        if "log_level" in changed:
            logging.getLogger("lemonade").setLevel(level_number(self.config.get("log_level")))
        log.info("Configuration changed: %s", ", ".join(f"{k}={v!r}" for k, v in changed.items()))

    def _reload_on_new_binary(self, backends: set[tuple[str, str]]) -> None:
        """A changed `<section>.<backend>_bin` (section, backend) applies live (guide-configuration-README.md):
        models running on that engine's backend are loaded again, on the newly selected build (installed
        first if needed)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # set outside a running server: the next start uses it
        # an engine's config section is its recipe's name without the dash (sd-cpp: sdcpp)
        # a model already leaving (stopping, or its process gone) is not started again: its next load uses
        # the new build, and one loaded meanwhile (by a request or /v1/load) already does
        affected = [lm for lm in self.router.models()
                    if (lm.model.recipe.replace("-", ""), lm.backend) in backends]

        async def reload() -> None:
            for lm in affected:
                if self.router.resident(lm.model.name) is not lm:
                    continue
                log.info("Loading %s again: its %s_bin setting changed", lm.model.public, lm.backend)
                try:
                    await self.router.ensure_loaded(lm.model, dict(lm.options), pinned=lm.pinned, reload=True)
                except Exception as exc:  # reported; the next request tries again (and says why it fails)
                    log.warning("Could not load %s on the newly selected build: %s", lm.model.public, exc)

        if affected:
            task = loop.create_task(reload())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    @property
    def offline(self) -> bool:
        return bool(self.config.get("offline"))

    def _unbind_peer(self, url: str) -> None:
        """A peer stopped answering: its models bound here are let go (they take no slot; the next
        request chooses again)."""
        def bound_to(lm: Any) -> bool:
            return lm.model.recipe == PeerEngine.recipe and lm.model.definition.get("peer") == url

        if any(bound_to(lm) for lm in self.router.models(usable=False)):
            task = asyncio.ensure_future(self.router.unload_where(bound_to))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _architecture_of(self, model_name: str) -> str | None:
        """The GGUF `general.architecture` of a downloaded model's main file (the key of its
        architecture defaults); None before the download or for other formats."""
        model = self.catalog.find(model_name)
        files = self.catalog.local_files(model) if model is not None and not model.is_collection else None
        main = (files or {}).get("main") or []
        if not main or not main[0].name.lower().endswith(".gguf"):
            return None
        try:
            return gguf_info(main[0]).architecture or None
        except (OSError, GGUFError):
            return None

    def _backend_of(self, recipe: str, options: dict[str, Any]) -> str | None:
        """The backend a load with these options runs on (the router asks the engine the same way)."""
        engine = self.engines.get(recipe)
        if engine is None or not engine.available:
            return None
        requested = engine.requested_backend(options)
        try:
            return engine.ready_backend(requested)
        except EngineUnavailable:
            return requested  # the load is refused for that reason; the options are still those of `requested`

    def _catalog_options(self, model_name: str) -> dict[str, Any]:
        """A built-in model's `recipe_options` from the catalog (user definitions keep theirs in
        recipe_options.json, where registration saved them)."""
        model = self.catalog.find(model_name)
        own = model.definition.get("recipe_options") if model is not None and model.origin == "builtin" else None
        return dict(own) if isinstance(own, dict) else {}

    def routing_helpers(self) -> set[str]:
        """Canonical names of the models that registered routing policies call to choose a candidate
        (router LLMs, classifiers, embedders): the router's routing-helper pool is for these only."""
        needed: set[str] = set()
        for model in self.catalog.all(rescan=False):
            if model.recipe != ROUTER_RECIPE:
                continue
            try:
                policy, _ = self.policies.get(model.name, model.definition)
            except ValueError:  # an invalid policy calls nothing (its requests say why)
                continue
            for clf in policy.classifiers.values():
                helper = self.catalog.find(clf.model)
                if helper is not None:
                    needed.add(helper.name)
        return needed

    async def aclose(self) -> None:
        self.cloud.stop()
        await self.peers.stop()
        await self.mcp.aclose()  # the MCP servers this server started stop with it
        stop_builds()  # a backend build in a worker thread would otherwise hold the exit until it ends
        await asyncio.to_thread(self.telemetry.shutdown)  # queued spans leave before the server does
        await self.suspend.aclose()
        await self.speculation.close()
        await self.router.shutdown()
        await self.engine_client.aclose()
        await self.remote_http.aclose()
        await self.downloads.aclose()
        await self.http.aclose()
