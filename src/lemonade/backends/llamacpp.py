"""The llama.cpp engine: `llama-server` per loaded model, for chat, embeddings and reranking.

Installation is `install.py` (release archive or a source build of the pinned llama.cpp); this
module describes the engine to the rest of the server and turns a model plus its resolved options
into a `llama-server` command line.
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

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
from lemonade.backends.llamacpp_flags import EngineArgsError, check_llamacpp_args, unknown_flags
from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.config import MAX_CTX_SIZE

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.llamacpp")
GPU_BACKENDS = ("vulkan", "rocm", "metal", "cuda")  # backends whose llama-server offloads to a device

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


def device_args(backend: str, device: str) -> list[str]:
    """GPU layers and device for a backend. A GPU backend offloads every layer (`-ngl 99`, as
    Lemonade does; the flag is ours, users cannot set it) to `llamacpp_device` if given (llama.cpp
    device names such as `Vulkan0`, or a comma list); the cpu backend has no device to pick and
    offloads nothing; a `system` llama-server keeps its own defaults."""
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
    argv += device_args(backend, str(options.get("llamacpp_device") or ""))
    user_args = check_llamacpp_args(options.get("llamacpp_args", ""), trusted=True)  # checked when set
    if "mtp" in model.labels and "--spec-type" not in user_args:
        argv += MTP_ARGS  # user_args come last, so the user's own values still win
    return argv + user_args


def _check_ctx(value: int) -> str | None:
    if value != -1 and not 1 <= value <= MAX_CTX_SIZE:
        return f"Option 'ctx_size' must be from 1 to {MAX_CTX_SIZE} tokens, or -1 (automatic); got {value}"
    return None


def _check_backend(value: str) -> str | None:
    if value not in LLAMACPP_ALL_BACKENDS:
        return f"Option 'llamacpp_backend' must be one of {', '.join(LLAMACPP_ALL_BACKENDS)}, got '{value}'"
    return None


def _check_args(value: str) -> str | None:
    try:
        check_llamacpp_args(value)
    except ValueError as exc:
        return str(exc)
    return None


class LlamaCppEngine(Engine):
    recipe = "llamacpp"
    modes = ("chat", "embeddings", "reranking")
    label_modes = {"systemone": ("classification",)}  # a decision model (llamacpp-newer.md /v1/systemone)
    backends = LLAMACPP_ALL_BACKENDS
    options = {
        "ctx_size": Option(int, "ctx_size", check=_check_ctx),
        "llamacpp_backend": Option(str, "llamacpp.backend", check=_check_backend),
        "llamacpp_args": Option(str, "llamacpp.args", check=_check_args),
        "llamacpp_device": Option(str, None, default=""),
    }
    args_option = "llamacpp_args"
    backend_option = "llamacpp_backend"
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

    def check_request(self, backend: str) -> None:
        self.installer.check_request(self.recipe, backend)

    def default_backend(self) -> str:
        return self.installer.default_backend()

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
        slot_dir = self.cache_dir / "slots" / re.sub(r"[^\w.-]", "_", model.name)
        slot_dir.mkdir(parents=True, exist_ok=True)
        argv = build_argv(binary, model, files, options, port, backend, slot_dir)
        try:
            self._refuse_unknown_flags(check_llamacpp_args(options.get("llamacpp_args", ""), trusted=True), binary,
                                       backend)
        except EngineArgsError as exc:
            raise EngineUnavailable(str(exc), code="invalid_engine_argument") from None
        resolved = dict(options)
        if resolved.get("ctx_size") == -1:
            resolved["resolved_ctx_size"] = resolved_ctx_size(-1, files["main"][0])
        server = WrappedServer(f"{self.process}:{model.public}", argv, port)
        await server.start()
        return Launch(server, resolved, backend, device="gpu" if backend in GPU_BACKENDS else "cpu")

    def context_length(self, options: dict[str, Any], files: dict[str, list[Path]] | None) -> int | None:
        main = files["main"][0] if files and files.get("main") else None
        return resolved_ctx_size(options.get("ctx_size", -1), main)

    async def downsize(self, base_url: str, http: Any) -> bool:
        """Erase every slot's KV cache (the weights stay loaded); the next request refills it."""
        try:
            async with http.get(base_url + "/slots") as resp:
                slots = await resp.json() if resp.status == 200 else []
            for slot in slots:
                async with http.post(f"{base_url}/slots/{slot.get('id', 0)}?action=erase",
                                     json={}) as resp:
                    await resp.read()
            return True
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
            log.info("Could not downsize %s: %s", base_url, exc)
            return False
