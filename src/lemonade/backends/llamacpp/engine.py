"""The llama.cpp engine: `llama-server` per loaded model, for chat, embeddings and reranking.

Installation is `install.py` (release archive or a source build of the pinned llama.cpp); this
module describes the engine to the rest of the server and turns a model plus its resolved options
into a `llama-server` command line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.base import BackendStartError, WrappedServer
from lemonade.backends.bin_select import BinChoice, LatestTag
from lemonade.backends.cpu_share import thread_args
from lemonade.backends.engine import (
    BackendState,
    Engine,
    EngineHTTP,
    EngineUnavailable,
    InstallError,
    Launch,
    MemoryNeed,
    Option,
    Progress,
    install_action,
)
from lemonade.backends.llamacpp.arch import refusal
from lemonade.backends.llamacpp.bins import BIN_BACKENDS, OwnBuild, TaggedInstaller, resolve_latest
from lemonade.backends.llamacpp.build import LLAMA_CPP_VERSION
from lemonade.backends.llamacpp.context import (
    ContextChoice,
    auto_context,
    explicit_context,
    served_context,
)
from lemonade.backends.llamacpp.flags import (
    EngineArgsError,
    check_llamacpp_args,
    installed_flags,
    place_slot_folders,
    translate_legacy_flags,
    unknown_flags,
)
from lemonade.backends.llamacpp.gpu import GPU_BACKENDS, uses_gpu, vulkan_visible_devices
from lemonade.backends.llamacpp.install import BackendInstaller
from lemonade.backends.llamacpp.memory import (
    CHECKPOINTS,
    engine_flags,
    memory_need,
    prompt_cache_mib,
    sliding_window,
    split_need,
    swa_full_chosen,
)
from lemonade.backends.llamacpp.rpc import (
    HEALTH_TIMEOUT,
    decide,
    probe,
    probe_all,
    probe_all_sync,
    probe_sync,
    query_statuses,
    resolve_workers,
    rpc_args,
    unreachable_message,
    user_places_layers,
    worker_devices,
)
from lemonade.backends.llamacpp.settings import (
    AUTO_WORKERS,
    worker_list,
    worker_setting,
)
from lemonade.backends.llamacpp.spec import speculation_args
from lemonade.backends.llamacpp.split import Placement, split_args
from lemonade.backends.llamacpp.warm import WarmStore, copy_slot, restore_slots, save_slots, with_timeout
from lemonade.beacon import WorkerDirectory
from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.config import MAX_CTX_SIZE
from lemonade.errors import APIError
from lemonade.system.devices import detect_devices, gpu_usage
from lemonade.system.memory import read_budget
from lemonade.util.process_group import signal_group

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.llamacpp")

# Jinja templates we ship for GGUFs that carry none (base models), by architecture prefix.
TEMPLATES = resources.files("lemonade.backends").joinpath("templates")


def fallback_template(architecture: str) -> Path:
    """A Jinja chat template file (Jinja keeps tool calling working, unlike llama.cpp's named ones)."""
    name = "gemma.jinja" if architecture.startswith("gemma") else "chatml.jinja"
    return Path(str(TEMPLATES.joinpath(name)))


def _gpu_free_bytes(backend: str) -> int | None:
    """Free memory of the GPUs a GPU backend runs on: dedicated memory (plus the shared pool of an
    integrated GPU) less what is in use; None on the CPU or when the GPUs do not report it."""
    if backend not in GPU_BACKENDS:
        return None
    report = detect_devices()
    if not uses_gpu(backend, report):
        return None  # a software Vulkan device (lavapipe) computes in system RAM
    gpus = [g for g in report.gpus if g.vram_bytes]
    if not gpus:
        return None
    total = sum((g.vram_bytes or 0) + ((g.shared_bytes or 0) if g.integrated else 0) for g in gpus)
    used = gpu_usage().vram_used_bytes or 0
    return max(0, total - used)


def choose_context(options: dict[str, Any], files: dict[str, list[Path]] | None, backend: str = "cpu",
                   mode: str = "chat") -> ContextChoice:
    """The context to ask llama-server for: `ctx_size` as given; for -1 the one the router sized to the
    memory budget with the other loaded models counted (`resolved_ctx_size`, set for the launch), or,
    for a model not being loaded, the largest that fits what the budget leaves free now, up to its
    trained length (backends/llamacpp/context.py)."""
    ctx = options.get("ctx_size", -1)
    if isinstance(ctx, int) and ctx > 0:
        return explicit_context(ctx)
    sized = options.get("resolved_ctx_size")
    if isinstance(sized, int) and sized > 0:
        return ContextChoice(sized, f"automatic: {sized} tokens, the largest context up to the model's trained length "
                                    "that fits the memory budget with the other loaded models counted")
    gpu_free = _gpu_free_bytes(backend)
    budget = read_budget()
    need = memory_need(files, options, backend, budget.cap_bytes, mode) if files else None
    return auto_context(need, gpu_free if gpu_free is not None else budget.admissible_bytes)


def refuse_unreachable(model: ModelInfo, probes: list[dict[str, Any]]) -> None:
    """503 naming the RPC workers that do not accept a connection, before anything waits on them."""
    down = [r for r in probes if not r["reachable"]]
    if down:
        raise APIError(503, unreachable_message(model.public, down), code="rpc_worker_unreachable",
                       extra={"unreachable_workers": [d["address"] for d in down]})


WATCH_S = 3.0  # how often the workers of a model spread over them are asked whether they are there
WATCH_MISSES = 3  # status queries (each asked twice) a worker leaves unanswered in a row before it counts as gone


async def watch_workers(server: WrappedServer, workers: list[str]) -> None:
    """Stop an engine whose RPC worker host has gone silent. A host that drops off the network without
    closing its connection leaves llama-server waiting on it for ever (llama.cpp's RPC client has no
    timeout), and a TCP connect cannot tell (a busy rpc-server accepts one client at a time, with a
    backlog of one); a `lemonade worker` answers status queries over UDP whatever its rpc-server is doing.
    So a worker that answered at first and then leaves WATCH_MISSES in a row unanswered is gone: the
    engine is killed, and the router reports the crash naming the worker (LlamaCppEngine.exit_cause).
    Workers that never answer (a bare ggml-rpc-server) are not watched."""
    watched: set[str] | None = None
    misses = dict.fromkeys(workers, 0)
    while server.alive:
        statuses = await asyncio.to_thread(query_statuses, workers)
        if watched is None:
            watched = {w for w, status in statuses.items() if status is not None}
            if not watched:
                return
        for worker in watched:
            misses[worker] = 0 if statuses[worker] is not None else misses[worker] + 1
        gone = sorted(w for w in watched if misses[w] >= WATCH_MISSES)
        if gone and server.alive and server.pid is not None:
            log.error("RPC worker %s of %s stopped answering: stopping its llama-server (it would wait for it "
                      "for ever)", ", ".join(gone), server.name)
            signal_group(server.pid, signal.SIGKILL)
            return
        await asyncio.sleep(WATCH_S)


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
    crash on it, or worse); the user is told how to repair the download. Only `.gguf` files count: a
    whole-repository checkpoint brings its README and the like along."""
    for path in (p for paths in files.values() for p in paths if p.name.lower().endswith(".gguf")):
        try:
            with open(path, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise BackendStartError(f"Cannot read {path.name} of {model.public}: {exc}") from None
        if magic != b"GGUF":
            raise BackendStartError(f"{path.name} of {model.public} is not a GGUF file (it starts with {magic!r}): the "
                                    f"file on disk is damaged. Run `lemonade pull {model.public}` to check and repair "
                                    "the download.")


def refuse_unknown_architecture(model: ModelInfo, files: dict[str, list[Path]]) -> None:
    """The GGUF header's `general.architecture` of the model (and of its draft model) must be one the
    pinned llama.cpp loads; else EngineUnavailable (a 400) instead of a llama-server that fails to load."""
    for role in ("main", "draft"):
        path = next(iter(files.get(role, [])), None)
        if path is None or not path.name.lower().endswith(".gguf"):
            continue
        try:
            architecture = gguf_info(path).architecture
        except (OSError, GGUFError):
            continue  # refuse_damaged_files names an unreadable file
        message = refusal(model.public, architecture, f"{path.name} says so") if architecture else None
        if message:
            raise EngineUnavailable(message, code="unsupported_model_architecture")


def build_argv(binary: Path, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
               port: int, backend: str = "cpu", slot_dir: Path | None = None, ctx_size: int | None = None,
               speculate: bool = True, warm: bool = False, swa_full: bool = False,
               placement: Placement | None = None) -> list[str]:
    """`slot_dir`: where `/v1/slots` save/restore keep KV caches (a folder of ours per model;
    llama-server refuses file names with a path in them). `ctx_size`: the context chosen for this
    load (`choose_context`), else the options' own. `speculate`: the controller's verdict for a model
    whose `speculation` is `auto` (backends/llamacpp/spec.py). `placement`: where the layers go over the RPC
    workers (backends/llamacpp/split.py; the workers are `resolved_rpc_workers`, or the `rpc_workers` list)."""
    main = files["main"][0]
    ctx = ctx_size if ctx_size is not None else choose_context(options, files, backend, model.mode).ctx_size
    argv = [str(binary), "-m", str(main), "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(ctx),
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
    # One projector file may hold a vision and an audio encoder (Qwen2.5-Omni's): llama.cpp's mtmd loads
    # both from --mmproj, so upstream's `hf_load` (letting llama-server fetch the files with -hf) is not
    # needed: the pull fetched the same files.
    if files.get("mmproj"):
        argv += ["--mmproj", str(files["mmproj"][0])]
    workers = options.get("resolved_rpc_workers") or worker_list(options.get("rpc_workers") or [])
    argv += device_args(backend, str(options.get("llamacpp_device") or ""), rpc=bool(workers))
    argv += rpc_args(placement.workers if placement is not None else workers)
    if placement is not None:
        argv += split_args(placement)
    if placement is not None or (backend == "cpu" and not workers):
        argv += fit_args(binary)
    if model.mode == "chat":
        argv += growth_args(main, str(options.get("llamacpp_args") or ""), ctx, warm, swa_full)
        argv += batch_args(str(options.get("llamacpp_args") or ""))
    user_args = engine_args(options.get("llamacpp_args", ""), binary, slot_dir)  # checked when set
    spec_args, _ = speculation_args(model, files, options, user_args, speculate)
    return argv + spec_args + user_args  # user_args come last, so the user's own values still win


def growth_args(main: Path, llamacpp_args: str, ctx: int, warm: bool = False, swa_full: bool = False) -> list[str]:
    """Bounds on what llama-server grows to while it serves, which its memory estimate counts
    (backends/llamacpp/memory.py): the host prompt cache sized to the KV cache (llama-server's default is 8 GiB)
    and a few context checkpoints per slot (32 by default). With warm swaps (backends/llamacpp/warm.py) idle
    slots keep their conversations in the KV cache (llama-server moves them to the prompt cache and
    clears them at every new request by default, so at unload there would be little left to save; it
    still clears one when it needs the room), and a sliding-window model may get its full window cache
    (`swa_full`: llamacpp.memory.swa_full_chosen). A user's own flags come after and win."""
    cache = prompt_cache_mib(main, llamacpp_args, ctx, read_budget().cap_bytes, swa_full)
    argv = ["--cache-ram", str(cache), "--ctx-checkpoints", str(CHECKPOINTS)]
    if warm:
        argv.append("--no-cache-idle-slots")
    if swa_full:
        argv.append("--swa-full")
    return argv


def fit_args(binary: Path) -> list[str]:
    """`--fit off` for a load whose layout this server decided: the cpu backend (the context is ours, no
    layer goes to a device) or a split over RPC workers (split.py). llama-server's own fitting (on by
    default since it has it) would only measure that layout again before loading, reading the model's
    metadata and vocabulary a second time: a quarter of a second of every load of Gemma 3 270M on 2 cores,
    0.88 against 0.63 s to a ready engine (benchmarks/bench_engine_start.py, docs/performance.md "Engine
    start"). A GPU backend keeps it: there it fits the layers to the device's free memory."""
    return ["--fit", "off"] if binary.is_file() and "--fit" in installed_flags(binary) else []


def batch_args(llamacpp_args: str) -> list[str]:
    """A chat model reads prompts one ubatch at a time (`-b` = `-ub`, 512 unless its arguments say), where
    llama-server's default batch is 2,048 tokens. llama-server does nothing else while it computes a batch:
    the other slots get no token and a client that left is not noticed. On 2 cores a batch of 2,048 tokens
    takes seconds, so every stream beside a long prompt stalled that long; in ubatch steps the longest
    stall is a quarter of it, and prompts are read as fast, since llama-server computes a batch one ubatch
    at a time anyway (benchmarks/bench_batch.py, docs/performance.md "Batch size"). A user's own `-b`
    comes later in the command line and wins."""
    return ["-b", str(engine_flags(llamacpp_args).ubatch)]


def engine_args(text: str, binary: Path, slot_dir: Path | None = None) -> list[str]:
    """The `llamacpp_args` (checked when they were set) as this binary takes them: documented
    spellings it renamed translated, per-load slot folders placed under the server's slot folder."""
    argv = check_llamacpp_args(text, trusted=True)
    if binary.is_file():
        argv = translate_legacy_flags(argv, installed_flags(binary))
    if slot_dir is not None:
        argv = place_slot_folders(argv, slot_dir.parent)
    return argv


def _check_ctx(value: int) -> str | None:
    if value != -1 and not 1 <= value <= MAX_CTX_SIZE:
        return f"Option 'ctx_size' must be from 1 to {MAX_CTX_SIZE} tokens, or -1 (automatic); got {value}"
    return None


class LlamaCppEngine(Engine):
    recipe = "llamacpp"
    release_page = f"https://github.com/ggml-org/llama.cpp/releases/tag/{LLAMA_CPP_VERSION}"
    options = {
        "ctx_size": Option(int, "ctx_size", check=_check_ctx),
    }
    args_checker = staticmethod(check_llamacpp_args)
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

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.installer = BackendInstaller(self.cache_dir)  # the pinned version ("builtin")
        self.workers_heard = WorkerDirectory()  # for rpc_workers "auto"; listens from its first use
        self._watches: set[asyncio.Task[None]] = set()  # watch_workers of the models spread over RPC workers
        self._bins = BinChoice(config, LatestTag("llama.cpp", resolve_latest), self.installer.root, OwnBuild,
                               lambda tag: TaggedInstaller(self.cache_dir, tag))
        self.warm_store.clean_partials()  # states a crash cut short are never restored

    # ----- which llama.cpp a backend runs: llamacpp.<backend>_bin (backends/llamacpp/bins.py) ---------------
    def installer_for(self, backend: str, installing: bool = False) -> Any:
        """The installer (or the user's own build) `llamacpp.<backend>_bin` selects for `backend`: the one
        that runs, or with `installing`, the one an install applies (`latest`'s newer release)."""
        if backend not in BIN_BACKENDS:
            return self.installer
        return self._bins.select(f"llamacpp.{backend}_bin", self.installer, backend, installing)

    def state(self, backend: str) -> BackendState:
        state = self.installer_for(backend).state(self.recipe, backend)
        if backend in BIN_BACKENDS:
            state = self._bins.signals(state, f"llamacpp.{backend}_bin", backend, LLAMA_CPP_VERSION,
                                       install_action(self.recipe, backend))
        return state

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        return self.installer_for(backend, installing=True).install(self.recipe, backend, progress, force)

    def uninstall(self, backend: str) -> dict[str, Any]:
        return self.installer_for(backend).uninstall(self.recipe, backend)

    def uninstall_refusal(self, backend: str) -> str | None:
        try:
            if backend == "system" or isinstance(self.installer_for(backend), OwnBuild):
                self.uninstall(backend)  # raises, saying whose it is
        except InstallError as exc:
            return str(exc)
        return None

    def check_request(self, backend: str, force: bool = False) -> None:
        chosen = self.installer_for(backend)
        if isinstance(chosen, OwnBuild):  # the user's own build: theirs to judge, whatever the devices say
            chosen.check_request(self.recipe, backend, force)
        else:
            self.installer.check_request(self.recipe, backend, force)  # unknown backends, the OS, the devices

    def default_backend(self) -> str:
        """The pinned installer's choice, except that a `cpu` selected by `cpu_bin` (an own build, a
        release) that is ready beats falling back to a system llama-server."""
        chosen = self.installer.default_backend()
        if chosen == "system" and self.state("cpu").state == "installed":
            return "cpu"
        return chosen

    def requested_backend(self, options: dict[str, Any]) -> str:
        """`auto` (the configuration's default) is the best backend this machine has."""
        value = options.get(self.backend_option) if self.backend_option else None
        return self.default_backend() if value in (None, "", "auto") else value

    def check_args(self, text: str, *, trusted: bool = False, backend: str | None = None) -> list[str]:
        argv = check_llamacpp_args(text, trusted=trusted)
        binary = self.installer_for(backend or self.default_backend()).llama_server_path(
            backend or self.default_backend())
        if binary is not None:
            self._refuse_unknown_flags(translate_legacy_flags(argv, installed_flags(binary)), binary,
                                       backend or self.default_backend())
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

    def check_model(self, model: ModelInfo, backend: str) -> None:
        """The catalog's `architecture` of a model the pinned llama.cpp cannot load: refused before
        its download (a `system` llama-server may be newer, so it is let through)."""
        architecture = model.definition.get("architecture")
        if backend != "system" and architecture:
            message = refusal(model.public, architecture, "as the catalog says")
            if message:
                raise EngineUnavailable(message, code="unsupported_model_architecture")

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        if backend != "system":
            refuse_unknown_architecture(model, files)
        binary = self.installer_for(backend).llama_server_path(backend)
        if binary is None:
            st = self.state(backend)
            raise EngineUnavailable(f"The llama.cpp '{backend}' backend is not installed ({st.message}). Install it "
                                    f"with: {st.action or install_action(self.recipe, backend)}",
                                    action=st.action or install_action(self.recipe, backend))
        refuse_damaged_files(model, files)
        workers = await asyncio.to_thread(self.rpc_workers, options)
        if workers:  # llama-server would fail (or wait) deep in its load; say which worker and what to do
            refuse_unreachable(model, await probe_all(workers))
        slot_dir = self.cache_dir / "slots" / re.sub(r"[^\w.-]", "_", model.name)
        slot_dir.mkdir(parents=True, exist_ok=True)
        choice = choose_context(options, files, backend, model.mode)
        # a context the user or the router fixed is placed as it is; else the workers decide how much they hold
        fixed = any(isinstance(options.get(k), int) and options[k] > 0 for k in ("ctx_size", "resolved_ctx_size"))
        placement = await asyncio.to_thread(self._placement, model, files, options, backend, workers,
                                            choice.ctx_size if fixed else None) if workers else None
        if placement is not None and placement.ctx != choice.ctx_size:
            choice = ContextChoice(placement.ctx, f"automatic: {placement.ctx} tokens, the largest context the RPC "
                                                  "workers hold with the model's layers")
        # the controller's verdict; the router leaves it out when memory is short (MemoryNeed.fallback)
        speculate = self.speculation_wanted(model.name) and options.get("resolved_speculation") != "off"
        warm = self.warm_swaps and model.mode == "chat"
        # a full window cache on RPC workers would be held by them, which the 5 % rule does not look at
        swa_full = warm and not workers and swa_full_chosen(files, options, read_budget().cap_bytes)
        if workers:
            options = {**options, "resolved_rpc_workers": placement.workers if placement is not None else workers}
        argv = build_argv(binary, model, files, options, port, backend, slot_dir, choice.ctx_size, speculate, warm,
                          swa_full, placement)
        user_args = engine_args(options.get("llamacpp_args", ""), binary)
        _, speculation = speculation_args(model, files, options, user_args, speculate)  # what build_argv gave it
        try:
            self._refuse_unknown_flags(user_args, binary, backend)
        except EngineArgsError as exc:
            raise EngineUnavailable(str(exc), code="invalid_engine_argument") from None
        report = detect_devices()
        if not uses_gpu(backend, report):
            argv += thread_args(user_args, self.process)  # fewer compute threads on a busy CPU (cpu_share.py)
        resolved = {**options, "llamacpp_backend": backend}  # `auto` shows as the backend it chose
        if placement is not None:  # what each worker holds, for /v1/health
            resolved["resolved_rpc_split"] = [
                {"address": d.worker, "device": d.name, "layers": n, "estimate_bytes": b}
                for d, n, b in zip(placement.devices, placement.counts, placement.shares, strict=True)]
        env = None
        if backend == "vulkan" and (visible := vulkan_visible_devices(report)) is not None:
            # Only software Vulkan devices (lavapipe): llama.cpp ignores those unless named.
            log.warning("The vulkan backend runs on the software renderer %s (no Vulkan GPU on this machine)",
                        report.vulkan[0].name)
            env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": visible}
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, env=env)
        await server.start(self.ready_timeout)
        if workers:
            watch = asyncio.create_task(watch_workers(server, resolved["resolved_rpc_workers"]))
            self._watches.add(watch)  # kept until it ends (with the engine)
            watch.add_done_callback(self._watches.discard)
        served, slots = await served_context(server.base_url)
        reason = choice.reason
        if served is not None and served != choice.ctx_size:
            reason += (f"; llama-server gives each request {served} tokens" + (
                f" ({slots} slots{self._split_note(str(options.get('llamacpp_args') or ''))})" if slots else ""))
        context = served or choice.ctx_size
        resolved["resolved_ctx_size"] = context
        log.info("Context of %s: %d tokens per request (%s)", model.public, context, reason)
        # Unified cache: each slot may use all of it (so more than its share), and they share it.
        shared = (choice.ctx_size, slots) if served and slots and slots > 1 and served * slots > choice.ctx_size \
            else None
        return Launch(server, resolved, backend, device="gpu" if uses_gpu(backend, report) else "cpu",
                      context_length=context, context_reason=reason, shared_kv=shared, slots=slots,
                      prefix_copy=warm and (swa_full or not sliding_window(files)), speculation=speculation)

    def _placement(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any], backend: str,
                   workers: list[str], ctx: int | None) -> Placement | None:
        """Where the layers go at context `ctx` (None: the largest the workers hold), from what the workers
        report now (507 when they cannot hold them); None where Lemonade does not decide
        (`_decides_split`) or a worker does not report its memory."""
        if not self._decides_split(backend, options):
            return None
        need = split_need(files, options, backend, read_budget().cap_bytes, model.mode)
        devices = worker_devices(workers) if need is not None else None
        if need is None or devices is None:
            log.info("%s: not every RPC worker reports its memory (a `lemonade worker` does): llama.cpp splits the "
                     "layers by its own figures", model.public)
            return None
        _, placement = decide(model.public, need, devices, ctx)
        log.info("Layers of %s over RPC: %s (the input and output layers stay here)", model.public, ", ".join(
            f"{d.worker} {d.name} {n}" for d, n in zip(placement.devices, placement.counts, strict=True)))
        return placement

    @staticmethod
    def _split_note(args: str) -> str:
        """Why a context can come out smaller than asked: an explicit slot count without a unified
        KV cache divides it between the slots."""
        flags = args.split()
        if any(f in ("-np", "--parallel") for f in flags) and not any(f in ("-kvu", "--kv-unified") for f in flags):
            return ": -np without --kv-unified divides the context between the slots; add -kvu to give each " \
                   "request all of it"
        return ""

    def system_info(self) -> dict[str, Any]:
        """Adds the configured RPC workers and whether they answer (a TCP connect each)."""
        info = super().system_info()
        workers = self._configured_workers()
        if workers:
            info["rpc_workers"] = [probe_sync(w) for w in workers]
        return info

    def _configured_workers(self) -> list[str]:
        """The server-wide workers: the list, or with "auto" the ones heard so far (never waiting)."""
        try:
            setting = worker_setting(self.config.get("llamacpp.rpc_workers") or [])
        except ValueError:
            return []
        if setting == AUTO_WORKERS:
            return [b.endpoint for b in self.workers_heard.workers(wait=False)]
        return list(setting)

    def rpc_workers(self, options: dict[str, Any]) -> list[str]:
        """The workers a load with these options is spread over (none: a local load). Blocking: with
        "auto" the first call listens for one beacon interval."""
        return resolve_workers(options.get("rpc_workers"), self.workers_heard)

    def _decides_split(self, backend: str, options: dict[str, Any]) -> bool:
        """Whether Lemonade places the layers (backends/llamacpp/split.py): for a main host that computes on its CPU,
        unless the user's own flags or devices place them."""
        return backend in ("cpu", "system") and not options.get("llamacpp_device") \
            and not user_places_layers(str(options.get("llamacpp_args") or ""))

    async def health_fields(self, loaded: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """`rpc_workers` in `/v1/health`: every worker configured (or heard, with "auto") or used by a loaded
        model, whether it answers a TCP connect now, its connect latency, the loaded models spread over
        it and the layers each holds there."""
        store = {"kv_store": {**self.warm_store.describe(), "enabled": self.warm_swaps}}  # warm swaps' saved states
        users: dict[str, list[str]] = {w: [] for w in self._configured_workers()}
        layers: dict[str, dict[str, int]] = {}
        for name, options in loaded.items():
            used = options.get("resolved_rpc_workers") or worker_list(options.get("rpc_workers") or [])
            for worker in used:
                users.setdefault(worker, []).append(name)
            for share in options.get("resolved_rpc_split") or []:
                held = layers.setdefault(share["address"], {})
                held[name] = held.get(name, 0) + int(share["layers"])
        if not users:
            return store
        results = await asyncio.gather(*(probe(w, HEALTH_TIMEOUT) for w in users))
        return {**store, "rpc_workers": [{**r, "models": users[r["address"]],
                                          **({"layers": layers[r["address"]]} if r["address"] in layers else {})}
                                         for r in results]}

    def memory_need(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any], backend: str,
                    cap_bytes: int | None = None) -> MemoryNeed | None:
        """From the GGUF header (backends/llamacpp/memory.py), for the backends whose memory is host RAM; a GPU's
        memory is not accounted (None), as before. Spread over RPC workers, this host's share only, once
        the workers are known to answer and to hold their shares (else 503 naming the missing ones, 507
        naming each one's shortfall)."""
        if uses_gpu(backend, detect_devices()):
            return None
        workers = self.rpc_workers(options)
        if workers:
            refuse_unreachable(model, probe_all_sync(workers))
            if self._decides_split(backend, options):
                shared = self._split_main(model, files, options, backend, cap_bytes, workers)
                if shared is not None:
                    return shared
        swa_full = self.warm_swaps and model.mode == "chat" and not workers and swa_full_chosen(files, options,
                                                                                                 cap_bytes)
        return self._with_fallback(options, lambda opts: memory_need(files, opts, backend, cap_bytes, model.mode,
                                                                     swa_full))

    def _split_main(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any], backend: str,
                    cap_bytes: int | None, workers: list[str]) -> MemoryNeed | None:
        """The main host's share of a load over `workers`, at the largest context they hold (None: the
        shares cannot be told, or a worker does not report its memory)."""
        devices = worker_devices(workers)
        if devices is None:
            return None

        def main_share(opts: dict[str, Any]) -> MemoryNeed | None:
            need = split_need(files, opts, backend, cap_bytes, model.mode)
            return decide(model.public, need, devices)[0].main if need is not None else None

        return self._with_fallback(options, main_share)

    @staticmethod
    def _with_fallback(options: dict[str, Any], estimate: Callable[[dict[str, Any]], MemoryNeed | None]
                       ) -> MemoryNeed | None:
        """Speculation in auto yields to memory: without it the load holds less (no drafted logits)."""
        need = estimate(options)
        if need is not None and str(options.get("speculation") or "auto") == "auto":
            plain = estimate({**options, "speculation": "off"})
            if plain is not None and plain.at() < need.at():
                need = dataclasses.replace(need, fallback=plain)
        return need

    async def exit_cause(self, launch: Launch) -> str | None:
        """A model spread over RPC workers ends when one goes away (llama-server aborts with "Remote RPC
        server crashed"): the workers that no longer accept a connection are named."""
        workers = launch.options.get("resolved_rpc_workers") or []
        if not workers:
            return None
        down = [r for r in await probe_all(workers, HEALTH_TIMEOUT) if not r["reachable"]]
        if not down:
            return None
        names = ", ".join(f"{d['address']} ({d.get('error', 'unreachable')})" for d in down)
        return (f"lost its llama.cpp RPC worker{'s' if len(down) > 1 else ''} {names}: restart "
                f"`lemonade worker` there, or take {'them' if len(down) > 1 else 'it'} out of rpc_workers")

    def context_length(self, options: dict[str, Any], files: dict[str, list[Path]] | None) -> int | None:
        backend = self.requested_backend(options)
        return choose_context(options, files, backend).ctx_size

    # ----- warm swaps (backends/llamacpp/warm.py, docs/warm-swaps.md) -------------------------------------------
    @property
    def warm_store(self) -> WarmStore:
        return WarmStore(self.cache_dir / "slots", int(float(self.config.get("kv_store_gb")) * 1e9))

    @property
    def warm_swaps(self) -> bool:
        return float(self.config.get("kv_store_gb")) > 0

    async def save_warm(self, launch: Launch, client: EngineHTTP, keys: dict[int, str],
                        used: dict[int, float] | None = None) -> int:
        if not self.warm_swaps or not launch.slots:
            return 0
        saved = await with_timeout(save_slots(self.warm_store, launch.server.base_url, client, launch.server.argv,
                                              keys, used))
        return sum(int(s.get("tokens") or 0) for s in saved)

    async def restore_warm(self, launch: Launch, client: EngineHTTP) -> tuple[dict[int, str], int]:
        if not self.warm_swaps or not launch.slots:
            return {}, 0
        return await with_timeout(restore_slots(self.warm_store, launch.server.base_url, client, launch.server.argv))

    async def share_slot(self, launch: Launch, client: EngineHTTP, src: int, dst: int) -> int:
        return await copy_slot(launch.server.base_url, client, launch.server.argv, src, dst)

    async def downsize(self, base_url: str, client: EngineHTTP) -> bool:
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
