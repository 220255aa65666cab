"""The llama.cpp engine: `llama-server` per loaded model, for chat, embeddings and reranking.

Installation is `install.py` (release archive or a source build of the pinned llama.cpp); this
module describes the engine to the rest of the server and turns a model plus its resolved options
into a `llama-server` command line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.base import BackendStartError, WrappedServer
from lemonade.backends.engine import (
    BackendState,
    Engine,
    EngineUnavailable,
    Launch,
    Option,
    Progress,
    install_action,
)
from lemonade.backends.install import LLAMACPP_ALL_BACKENDS, BackendInstaller
from lemonade.backends.llamacpp_build import LLAMA_CPP_VERSION
from lemonade.backends.llamacpp_flags import EngineArgsError, check_llamacpp_args, unknown_flags
from lemonade.backends.llamacpp_gpu import GPU_BACKENDS, uses_gpu, vulkan_visible_devices
from lemonade.backends.llamacpp_rpc import (
    HEALTH_TIMEOUT,
    check_option,
    probe,
    probe_all,
    probe_sync,
    rpc_args,
    unreachable_message,
    worker_list,
)
from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.config import MAX_CTX_SIZE
from lemonade.errors import APIError
from lemonade.system.devices import detect_devices

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo
    from lemonade.runtime.engine_client import EngineClient

log = logging.getLogger("lemonade.llamacpp")

AUTO_CTX_CAP = 8192       # automatic context: the model's trained length, capped to keep RAM modest
FALLBACK_CTX = 4096       # when the GGUF does not say
# Jinja templates we ship for GGUFs that carry none (base models), by architecture prefix.
TEMPLATES = resources.files("lemonade.backends").joinpath("templates")
MTP_ARGS = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.75"]


def fallback_template(architecture: str) -> Path:
    """A Jinja chat template file (Jinja keeps tool calling working, unlike llama.cpp's named ones)."""
    name = "gemma.jinja" if architecture.startswith("gemma") else "chatml.jinja"
    return Path(str(TEMPLATES.joinpath(name)))


def resolved_ctx_size(ctx_size: int, main_file: Path | None) -> int:
    if ctx_size != -1:
        return ctx_size
    trained = None
    if main_file is not None:
        try:
            trained = gguf_info(main_file).context_length
        except (OSError, GGUFError):
            trained = None
    return min(trained, AUTO_CTX_CAP) if trained else FALLBACK_CTX


def device_args(backend: str, device: str, rpc: bool = False) -> list[str]:
    """GPU layers and device for a backend. A GPU backend offloads every layer (`-ngl 99`, as
    Lemonade does; the flag is ours, users cannot set it) to `llamacpp_device` if given (llama.cpp
    device names such as `Vulkan0`, or a comma list); the cpu backend has no device to pick and
    offloads nothing; a `system` llama-server keeps its own defaults. With RPC workers (`rpc`) every
    backend offloads every layer: the workers' devices are where they go."""
    if rpc and backend in ("cpu", "system"):
        return ["-ngl", "99"] + (["--device", device] if device else [])
    if backend == "cpu":
        if device:
            log.warning("llamacpp_device=%r is ignored: the cpu backend has no devices (choose a GPU backend "
                        "with llamacpp_backend)", device)
        return ["-ngl", "0"]
    argv = ["-ngl", "99"] if backend in GPU_BACKENDS else []
    return argv + (["--device", device] if device else [])


def refuse_damaged_files(model: ModelInfo, files: dict[str, list[Path]]) -> None:
    """A file that does not start with the GGUF magic is never handed to llama-server (which could
    crash on it, or worse); the user is told how to repair the download."""
    for path in (p for paths in files.values() for p in paths):
        try:
            with open(path, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise BackendStartError(f"Cannot read {path.name} of {model.public}: {exc}") from None
        if magic != b"GGUF":
            raise BackendStartError(f"{path.name} of {model.public} is not a GGUF file (it starts with {magic!r}): the "
                                    f"file on disk is damaged. Run `lemonade pull {model.public}` to check and repair "
                                    "the download.")


def build_argv(binary: Path, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
               port: int, backend: str = "cpu", slot_dir: Path | None = None) -> list[str]:
    """`slot_dir`: where `/v1/slots` save/restore keep KV caches (a folder of ours per model;
    llama-server refuses file names with a path in them)."""
    main = files["main"][0]
    argv = [str(binary), "-m", str(main), "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(resolved_ctx_size(options.get("ctx_size", -1), main)),
            "--alias", model.public, "--metrics", "--slots", "--no-webui"]
    if slot_dir is not None:
        argv += ["--slot-save-path", str(slot_dir)]
    if model.mode == "embeddings":
        argv.append("--embeddings")
    elif model.mode == "reranking":
        argv.append("--reranking")
    else:
        argv.append("--jinja")
        try:
            info = gguf_info(main)
        except (OSError, GGUFError):
            info = None
        if info is not None and not info.has_chat_template:
            argv += ["--chat-template-file", str(fallback_template(info.architecture))]
    if files.get("mmproj"):
        argv += ["--mmproj", str(files["mmproj"][0])]
    workers = worker_list(options.get("rpc_workers") or [])
    argv += device_args(backend, str(options.get("llamacpp_device") or ""), rpc=bool(workers))
    argv += rpc_args(workers)
    user_args = check_llamacpp_args(options.get("llamacpp_args", ""), trusted=True)  # checked when set
    if "mtp" in model.labels and "--spec-type" not in user_args:
        argv += MTP_ARGS  # user_args come last, so the user's own values still win
    return argv + user_args


def _check_ctx(value: int) -> str | None:
    if value != -1 and not 1 <= value <= MAX_CTX_SIZE:
        return f"Option 'ctx_size' must be from 1 to {MAX_CTX_SIZE} tokens, or -1 (automatic); got {value}"
    return None


def _check_backend(value: str) -> str | None:
    if value != "auto" and value not in LLAMACPP_ALL_BACKENDS:
        return (f"Option 'llamacpp_backend' must be one of {', '.join(LLAMACPP_ALL_BACKENDS)} or auto (the best "
                f"this machine has), got '{value}'")
    return None


_DEVICE_RE = re.compile(r"(none|[A-Za-z][A-Za-z_-]*\d*)(,[A-Za-z][A-Za-z_-]*\d*)*")


def _check_device(value: str) -> str | None:
    """llama.cpp device names (`Vulkan0`, `CUDA1`, `ROCm0`, `MTL0`; a comma list; `none`), as
    `llama-server --list-devices` prints them: anything else would only fail at start."""
    if value and not _DEVICE_RE.fullmatch(value):
        return (f"Option 'llamacpp_device' must be llama.cpp device names such as Vulkan0 or CUDA0,CUDA1 "
                f"(see llama-server --list-devices), or empty for the default; got '{value}'")
    return None


def _check_args(value: str) -> str | None:
    try:
        check_llamacpp_args(value)
    except ValueError as exc:
        return str(exc)
    return None


class LlamaCppEngine(Engine):
    recipe = "llamacpp"
    release_page = f"https://github.com/ggml-org/llama.cpp/releases/tag/{LLAMA_CPP_VERSION}"
    modes = ("chat", "embeddings", "reranking")
    label_modes = {"systemone": ("classification",)}  # a decision model (llamacpp-newer.md /v1/systemone)
    backends = LLAMACPP_ALL_BACKENDS
    options = {
        "ctx_size": Option(int, "ctx_size", check=_check_ctx),
        "llamacpp_backend": Option(str, "llamacpp.backend", check=_check_backend),
        "llamacpp_args": Option(str, "llamacpp.args", check=_check_args),
        "llamacpp_device": Option(str, None, default="", check=_check_device),
        # llama.cpp RPC workers (`host:port` of `lemonade worker`s) the model is spread over (llamacpp_rpc.py)
        "rpc_workers": Option(list, "llamacpp.rpc_workers", check=check_option),
    }
    args_option = "llamacpp_args"
    backend_option = "llamacpp_backend"
    tuning_flags = {"threads": "-t", "batch": "-b", "ubatch": "-ub", "parallel": "-np"}
    process = "llama-server"
    endpoints = {"chat/completions": "/v1/chat/completions", "completions": "/v1/completions",
                 "responses": "/v1/responses", "embeddings": "/v1/embeddings", "rerank": "/v1/rerank",
                 "tokenize": "/tokenize", "slots": "/slots"}
    # llama-server b11312 misses a closed connection of a non-streamed request while other requests'
    # results keep arriving (its result wait restarts with each); a stream stops at its next write.
    streamed_for_cancel = {"/v1/chat/completions": {"stream": True, "stream_options": {"include_usage": True}},
                           "/v1/completions": {"stream": True}}
    metrics_path = "/metrics"
    file_format = "gguf"

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.installer = BackendInstaller(self.cache_dir)

    def state(self, backend: str) -> BackendState:
        return self.installer.state(self.recipe, backend)

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        return self.installer.install(self.recipe, backend, progress, force)

    def uninstall(self, backend: str) -> dict[str, Any]:
        return self.installer.uninstall(self.recipe, backend)

    def check_request(self, backend: str, force: bool = False) -> None:
        self.installer.check_request(self.recipe, backend, force)

    def default_backend(self) -> str:
        return self.installer.default_backend()

    def requested_backend(self, options: dict[str, Any]) -> str:
        """`auto` (the configuration's default) is the best backend this machine has."""
        value = options.get(self.backend_option) if self.backend_option else None
        return self.default_backend() if value in (None, "", "auto") else value

    def check_args(self, text: str, *, trusted: bool = False, backend: str | None = None) -> list[str]:
        argv = check_llamacpp_args(text, trusted=trusted)
        binary = self.installer.llama_server_path(backend or self.default_backend())
        if binary is not None:
            self._refuse_unknown_flags(argv, binary, backend or self.default_backend())
        return argv

    @staticmethod
    def _refuse_unknown_flags(argv: list[str], binary: Path, backend: str) -> None:
        unknown = unknown_flags(argv, binary)
        if unknown:
            raise EngineArgsError(f"The installed llama-server ({backend} backend, {binary}) does not know "
                                  f"{', '.join(repr(f) for f in unknown)}: remove it from llamacpp_args (the "
                                  "model's options or this request) or from the server-wide llamacpp.args. "
                                  "`llama-server --help` lists the flags this build takes.")

    def ready_backend(self, requested: str) -> str:
        """`llamacpp.prefer_system` picks a llama-server on PATH over the requested backend."""
        if requested != "system" and self.config.get("llamacpp.prefer_system") \
                and self.installer.llama_server_path("system") is not None:
            return "system"
        st = self.state(requested)
        if st.state == "unsupported":
            raise EngineUnavailable(f"The llama.cpp '{requested}' backend cannot be used here: {st.message}"
                                    + (f". {st.action}" if st.action else ""), code="unsupported_backend",
                                    action=st.action)
        return requested

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        binary = self.installer.llama_server_path(backend)
        if binary is None:
            st = self.state(backend)
            raise EngineUnavailable(f"The llama.cpp '{backend}' backend is not installed ({st.message}). Install it "
                                    f"with: {st.action or install_action(self.recipe, backend)}",
                                    action=st.action or install_action(self.recipe, backend))
        refuse_damaged_files(model, files)
        workers = worker_list(options.get("rpc_workers") or [])
        if workers:  # llama-server would fail (or wait) deep in its load; say which worker and what to do
            down = [r for r in await probe_all(workers) if not r["reachable"]]
            if down:
                raise APIError(503, unreachable_message(model.public, down), code="rpc_worker_unreachable",
                               extra={"unreachable_workers": [d["address"] for d in down]})
        slot_dir = self.cache_dir / "slots" / re.sub(r"[^\w.-]", "_", model.name)
        slot_dir.mkdir(parents=True, exist_ok=True)
        argv = build_argv(binary, model, files, options, port, backend, slot_dir)
        try:
            self._refuse_unknown_flags(check_llamacpp_args(options.get("llamacpp_args", ""), trusted=True), binary,
                                       backend)
        except EngineArgsError as exc:
            raise EngineUnavailable(str(exc), code="invalid_engine_argument") from None
        resolved = {**options, "llamacpp_backend": backend}  # `auto` shows as the backend it chose
        if resolved.get("ctx_size") == -1:
            resolved["resolved_ctx_size"] = resolved_ctx_size(-1, files["main"][0])
        env = None
        report = detect_devices()
        if backend == "vulkan" and (visible := vulkan_visible_devices(report)) is not None:
            # Only software Vulkan devices (lavapipe): llama.cpp ignores those unless named.
            log.warning("The vulkan backend runs on the software renderer %s (no Vulkan GPU on this machine)",
                        report.vulkan[0].name)
            env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": visible}
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, env=env)
        await server.start()
        return Launch(server, resolved, backend, device="gpu" if uses_gpu(backend, report) else "cpu")

    def system_info(self) -> dict[str, Any]:
        """Adds the configured RPC workers and whether they answer (a TCP connect each)."""
        info = super().system_info()
        workers = self._configured_workers()
        if workers:
            info["rpc_workers"] = [probe_sync(w) for w in workers]
        return info

    def _configured_workers(self) -> list[str]:
        try:
            return worker_list(self.config.get("llamacpp.rpc_workers") or [])
        except ValueError:
            return []

    async def health_fields(self, loaded: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """`rpc_workers` in `/v1/health`: every worker configured or used by a loaded model, whether it
        answers a TCP connect now, its connect latency and the loaded models spread over it."""
        users: dict[str, list[str]] = {w: [] for w in self._configured_workers()}
        for name, options in loaded.items():
            for worker in worker_list(options.get("rpc_workers") or []):
                users.setdefault(worker, []).append(name)
        if not users:
            return {}
        results = await asyncio.gather(*(probe(w, HEALTH_TIMEOUT) for w in users))
        return {"rpc_workers": [{**r, "models": users[r["address"]]} for r in results]}

    def context_length(self, options: dict[str, Any], files: dict[str, list[Path]] | None) -> int | None:
        main = files["main"][0] if files and files.get("main") else None
        return resolved_ctx_size(options.get("ctx_size", -1), main)

    async def downsize(self, base_url: str, client: EngineClient) -> bool:
        """Erase every slot's KV cache (the weights stay loaded); the next request refills it."""
        try:
            status, content = await client.request("GET", base_url, "/slots")
            slots = json.loads(content) if status == 200 else []
            for slot in slots:
                await client.request("POST", base_url, f"/slots/{slot.get('id', 0)}?action=erase", b"{}")
            return True
        except (OSError, ValueError, AttributeError) as exc:
            log.info("Could not downsize %s: %s", base_url, exc)
            return False
