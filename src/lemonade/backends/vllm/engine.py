"""The vLLM engine: `vllm serve` per loaded model, for GPU machines and multi-GPU / multi-node serving.

Where llama.cpp's RPC workers (`backends/llamacpp/rpc.py`) stop being enough — many concurrent users, models
that need tensor parallelism over several GPUs, or a Ray cluster spanning nodes — vLLM takes over
(docs/scale-out.md). Lemonade runs it like any engine: one `vllm serve <model folder>` process per
loaded model on a private loopback port, health on `/health`, our OpenAI routes forwarded to its
own. Distributed serving is vLLM's own: `vllm_args` such as `--tensor-parallel-size 4` or
`--pipeline-parallel-size 2 --distributed-executor-backend ray` (with `ray start` run on each node
first) spread the model; Lemonade does not manage the Ray cluster.

Backends: `cuda` (NVIDIA) and `rocm` (AMD, upstream Lemonade's only one). vLLM needs such a GPU: on
a machine without one both report `unsupported` and a load is refused with a 400 saying so and
pointing at llama.cpp. The program is a `vllm` on PATH (e.g. AMD's or NVIDIA's vLLM images), else,
for `cuda`, the pinned PyPI `vllm` in a private venv (`venv_install.py`; several GB with its CUDA
PyTorch). ROCm builds of vLLM are not on PyPI, so `rocm` needs a `vllm` on PATH.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.base import WrappedServer
from lemonade.backends.engine import (
    BackendState,
    Engine,
    EngineUnavailable,
    InstallError,
    Launch,
    Option,
    Progress,
    check_flags,
    install_action,
)
from lemonade.backends.llamacpp.gpu import backend_devices, unsupported_message
from lemonade.backends.venv_install import VenvBackend
from lemonade.system.devices import detect_devices

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

VLLM_VERSION = "0.33.0"
START_TIMEOUT = 1800.0  # seconds: vLLM compiles graphs and profiles memory before it answers /health
NO_GPU_HINT = ("vLLM serves on CUDA or ROCm GPUs only. On this machine use the llamacpp recipe (CPU, Vulkan, ...), "
               "and llama.cpp RPC workers (`lemonade worker`, llamacpp.rpc_workers) to spread a model over several "
               "machines; see docs/scale-out.md.")

# The `mtp` runtime label: the checkpoint's own multi-token-prediction head as vLLM's speculator
# (upstream Lemonade's vllm_model_config.json gives its `-vLLM-*conc` FP8 entries this config).
MTP_ARGS = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']
# Flags Lemonade sets itself.
FORBIDDEN_FLAGS = {"--host": "--host", "--port": "--port", "--model": "the model", "--served-model-name":
                   "--served-model-name", "--max-model-len": "--max-model-len (use ctx_size)"}
# Per-model/per-request flags that neither read files nor run code from the network (no
# --trust-remote-code, --download-dir, --chat-template, ...); the server-wide vllm.args may use any.
SAFE_FLAGS = frozenset("""
--tensor-parallel-size -tp --pipeline-parallel-size -pp --data-parallel-size -dp --distributed-executor-backend
--gpu-memory-utilization --max-num-seqs --max-num-batched-tokens --dtype --kv-cache-dtype --quantization -q
--enforce-eager --enable-prefix-caching --no-enable-prefix-caching --enable-chunked-prefill --block-size
--swap-space --cpu-offload-gb --seed --tool-call-parser --enable-auto-tool-choice --reasoning-parser
--max-logprobs --disable-log-requests --enable-log-requests
""".split())


def _check_ctx(value: int) -> str | None:
    if value == -1 or value >= 1:
        return None
    return f"Option 'ctx_size' must be positive, or -1 (the model's), got {value}"


def check_vllm_args(text: str, *, trusted: bool = False) -> list[str]:
    """`vllm.args` / `vllm_args` as argv; ValueError naming a refused flag (a request's or a model's own
    value may only use SAFE_FLAGS)."""
    return check_flags(text, FORBIDDEN_FLAGS, None if trusted else SAFE_FLAGS.__contains__, config_key="vllm.args",
                       examples="parallelism, memory, batching, dtype, parsers", instead="")


def build_argv(program: Path, model: ModelInfo, folder: Path, options: dict[str, Any], port: int,
               user_args: list[str]) -> list[str]:
    """`vllm serve` for a model folder; the user's (checked) `vllm_args` last, so they win."""
    argv = [str(program), "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", model.public]
    ctx = options.get("ctx_size", -1)
    if isinstance(ctx, int) and ctx > 0:
        argv += ["--max-model-len", str(ctx)]
    if "mtp" in model.labels and "--speculative-config" not in user_args:
        argv += MTP_ARGS  # the `mtp` label's default, as llama.cpp's engine has its own
    return argv + user_args


def model_folder(model: ModelInfo, files: dict[str, list[Path]]) -> Path:
    """The Hugging Face folder vLLM loads: the one holding the downloaded config.json."""
    for path in (p for paths in files.values() for p in paths):
        if path.name == "config.json":
            return path.parent
    raise EngineUnavailable(f"Model {model.public} has no config.json among its files: vLLM loads Hugging Face "
                            "model folders (safetensors + config.json), not single GGUF files.",
                            code="model_load_refused")


class VllmEngine(Engine):
    recipe = "vllm"
    # GPU memory: not accounted by the host-memory budget (docs/memory.md), so no estimate
    memory_per_weight_byte = 0.0
    options = {
        "ctx_size": Option(int, "ctx_size", check=_check_ctx),
    }
    args_checker = staticmethod(check_vllm_args)
    process = "vllm"
    endpoints = {"chat/completions": "/v1/chat/completions", "completions": "/v1/completions",
                 "responses": "/v1/responses", "tokenize": "/tokenize"}
    metrics_path = "/metrics"

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.venv = VenvBackend(cache_dir, self.recipe, "cuda", (f"vllm=={VLLM_VERSION}",), probe="import vllm")

    def program(self, backend: str) -> Path | None:
        """`vllm` on PATH, else (cuda) the private venv's."""
        found = shutil.which("vllm")
        if found:
            return Path(found)
        exe = self.venv.python.parent / "vllm"
        return exe if backend == "cuda" and self.venv.state().state == "installed" and exe.exists() else None

    def state(self, backend: str) -> BackendState:
        if backend not in self.backends:
            return BackendState(self.recipe, backend, "unsupported", message=f"Unknown backend '{backend}'")
        report = detect_devices()
        devices = backend_devices(backend, report)
        if not devices:
            return BackendState(self.recipe, backend, "unsupported", devices=[],
                                message=f"{unsupported_message(backend, report)}. {NO_GPU_HINT}")
        if shutil.which("vllm"):
            return BackendState(self.recipe, backend, "installed", devices=devices, message="vllm on PATH")
        if backend == "rocm":
            return BackendState(self.recipe, backend, "unsupported", devices=devices,
                                message="vLLM for ROCm is not on PyPI: install it (AMD's ROCm vLLM image or wheels) "
                                        "and put `vllm` on PATH.")
        st = self.venv.state()
        return BackendState(self.recipe, backend, st.state, message=st.message, action=st.action,
                            version=st.version, devices=devices)

    def default_backend(self) -> str:
        report = detect_devices()
        return next((b for b in ("cuda", "rocm") if backend_devices(b, report)), "cuda")

    def requested_backend(self, options: dict[str, Any]) -> str:
        value = options.get(self.backend_option) if self.backend_option else None
        return self.default_backend() if value in (None, "", "auto") else value

    def ready_backend(self, requested: str) -> str:
        st = self.state(requested)
        if st.state == "unsupported":
            raise EngineUnavailable(f"The vllm '{requested}' backend cannot run here: {st.message}",
                                    code="unsupported_backend", action=st.action)
        return requested

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend, force)
        if shutil.which("vllm") and not force:
            return {"status": "success", "recipe": self.recipe, "backend": backend, "version": None}
        if backend != "cuda":
            raise InstallError(self.state(backend).message, code="unsupported_backend")
        return self.venv.install(progress, force)

    def uninstall(self, backend: str) -> dict[str, Any]:
        if backend not in self.backends:
            raise InstallError(f"Unknown vllm backend '{backend}' (known: {', '.join(self.backends)}).",
                               code="unknown_backend")
        return self.venv.uninstall()

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        program = self.program(backend)
        if program is None:
            st = self.state(backend)
            raise EngineUnavailable(f"vLLM ({backend}) is not installed here: {st.message} "
                                    f"{st.action or install_action(self.recipe, backend)}",
                                    action=st.action or install_action(self.recipe, backend))
        argv = build_argv(program, model, model_folder(model, files), options, port,
                          self.check_args(str(options.get("vllm_args") or ""), trusted=True))
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, health_path="/health")
        await server.start(timeout=START_TIMEOUT)
        return Launch(server, {**options, "vllm_backend": backend}, backend, device="gpu")
