"""The stable-diffusion.cpp engine, for the `sd-cpp` recipe (SD-Turbo, SDXL, Flux, Real-ESRGAN).

Installation is `backends/sdcpp/install.py` (release archive where upstream publishes one, else a static
build of the pinned stable-diffusion.cpp that the `stable-diffusion-cpp-python` sdist vendors).

How a model runs, and why:

- Generation models run as one `sd-server` per loaded model. The pinned sources ship it
  (`examples/server`): it loads the weights once and answers OpenAI-shaped
  `/v1/images/generations` (JSON) and `/v1/images/edits` (multipart) itself, so a second image
  costs no reload. The per-request settings it has no field for (steps, cfg scale, seed) travel the
  way its parser reads them: a `<sd_cpp_extra_args>{json}</sd_cpp_extra_args>` suffix of the prompt.
  The load options `steps`, `cfg_scale`, `width`, `height` become its defaults (`--steps`,
  `--cfg-scale`, `-W`, `-H`); `sampling_method` and `flow_shift` its sampler defaults; `sdcpp_args`
  adds sd-server flags (backends/sdcpp/flags.py says which), `sd-cpp_backend` picks the backend, as
  Lemonade's sd-cpp recipe options do. An entry's `image_defaults` is the layer under them.
- A running generation cannot be interrupted inside sd-server (its job API cancels queued jobs
  only; a generating one answers 409, and the library has no abort hook). So when the client of a
  generation hangs up, the API stops the model's sd-server (`cancel_running`), which ends the work
  at once; the router starts it again on the next request.
- Upscaling (Real-ESRGAN `.pth` models, label `upscaling`) is not a server: `sd-cli -M upscale` runs
  per request (`upscale_argv`), killed if its client leaves.

Checkpoints: a single-file model is `-m main`; a model with `text_encoder` and `vae` checkpoints
(Flux 2 Klein: diffusion model, Qwen3 text encoder, VAE) is `--diffusion-model main --llm
text_encoder --vae vae`, as sd.cpp expects for those architectures.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.base import BackendStartError, WrappedServer
from lemonade.backends.cpu_share import thread_args
from lemonade.backends.engine import (
    EngineUnavailable,
    InstallError,
    Launch,
    install_action,
)
from lemonade.backends.image_engine import ImageEngine
from lemonade.backends.native_engine import NativeBackends
from lemonade.backends.sdcpp.descriptor import DESCRIPTOR
from lemonade.backends.sdcpp.flags import check_sdcpp_args
from lemonade.backends.sdcpp.install import CLI_EXE, SDCPP_VERSION, SERVER_EXE, SdCppInstall
from lemonade.errors import APIError
from lemonade.observability.logs import log_buffer
from lemonade.util.process_group import signal_group

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.sd-cpp")

GENERATIONS_PATH = "/v1/images/generations"
EDITS_PATH = "/v1/images/edits"
UPSCALE_LABEL = "upscaling"
DEFAULTS = {s.key: s.default for s in DESCRIPTOR.settings}  # steps, cfg_scale, width, height (lemonade.md)
# On the vulkan backend, as upstream Lemonade (sdcpp_server.cpp, "Vulkan SD workaround"): the VAE decoded in
# tiles and flash attention in the diffusion model, which keep large pictures within GPU memory (1024x1024
# failed without them on its AMD GPUs).
VULKAN_ARGS = ("--vae-tiling", "--diffusion-fa")


def is_upscaler(model: ModelInfo) -> bool:
    """A Real-ESRGAN model: run by `sd-cli` per request, never loaded as a server."""
    return UPSCALE_LABEL in model.labels


def _unsupported_message(backend: str) -> str:
    kind = {"rocm": "ROCm", "cuda": "CUDA", "metal": "Metal"}.get(backend, backend)
    return (f"The sd-cpp '{backend}' backend needs a {kind} build of stable-diffusion.cpp, which is not available "
            "in this build of Lemonade; use sd-cpp:vulkan on a GPU, or sd-cpp:cpu.")


def generation_settings(model: ModelInfo, options: dict[str, Any], config_defaults: dict[str, Any]) -> dict[str, Any]:
    """steps, cfg_scale, width, height for a load: a value set for this model (differs from the
    server-wide default) wins; else the catalog's `image_defaults` for the model; else the default."""
    image_defaults = model.image_defaults or {}
    out: dict[str, Any] = {}
    for key, fallback in DEFAULTS.items():
        value = options.get(key)
        server_wide = config_defaults.get(key, fallback)
        if value is not None and value != server_wide:
            out[key] = value
        elif key in image_defaults:
            out[key] = image_defaults[key]
        else:
            out[key] = value if value is not None else fallback
    return out


def sampler_args(model: ModelInfo, options: dict[str, Any]) -> list[str]:
    """The sampler defaults: the load options `sampling_method` and `flow_shift`, else the entry's
    `image_defaults` (Qwen-Image is a flow model sampled with euler)."""
    image_defaults = model.image_defaults or {}
    method = options.get("sampling_method") or image_defaults.get("sampling_method")
    shift = options.get("flow_shift") or image_defaults.get("flow_shift")
    argv: list[str] = []
    if method:
        argv += ["--sampling-method", str(method)]
    if shift:
        argv += ["--flow-shift", str(shift)]
    return argv


def extra_args(steps: int | None, cfg_scale: float | None, seed: int) -> str:
    """The prompt suffix carrying what sd-server's OpenAI routes have no field for."""
    sample: dict[str, Any] = {}
    if steps is not None:
        sample["sample_steps"] = steps
    if cfg_scale is not None:
        sample["guidance"] = {"txt_cfg": float(cfg_scale)}
    args: dict[str, Any] = {"seed": seed}
    if sample:
        args["sample_params"] = sample
    return f" <sd_cpp_extra_args>{json.dumps(args)}</sd_cpp_extra_args>"


def generation_body(prompt: str, width: int, height: int, steps: int | None, cfg_scale: float | None,
                    seed: int) -> dict[str, Any]:
    """sd-server's `/v1/images/generations` body for one PNG."""
    return {"prompt": prompt + extra_args(steps, cfg_scale, seed), "n": 1, "size": f"{width}x{height}",
            "output_format": "png"}


def edit_body(prompt: str, images: list[bytes], mask: bytes | None, width: int, height: int, steps: int | None,
              cfg_scale: float | None, seed: int) -> tuple[bytes, str]:
    """sd-server's `/v1/images/edits` multipart body for one PNG: (body, content type)."""
    boundary = f"lemonade-{uuid.uuid4().hex}"
    parts: list[bytes] = []

    def field(name: str, value: str) -> None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())

    def file(name: str, data: bytes, filename: str) -> None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                     "Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n")

    field("prompt", prompt + extra_args(steps, cfg_scale, seed))
    field("n", "1")
    field("size", f"{width}x{height}")
    field("output_format", "png")
    for i, data in enumerate(images):
        file("image[]", data, f"image{i}.png")
    if mask is not None:
        file("mask", mask, "mask.png")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def upscale_argv(cli: Path, model_file: Path, source: Path, target: Path, threads: int | None = None) -> list[str]:
    """`sd-cli` upscaling one PNG with a Real-ESRGAN model (4x for the x4 models)."""
    argv = [str(cli), "-M", "upscale", "--upscale-model", str(model_file), "-i", str(source), "-o", str(target)]
    if threads:
        argv += ["-t", str(threads)]
    return argv


def checkpoint_args(model: ModelInfo, files: dict[str, list[Path]]) -> list[str]:
    """The model's files as sd-server flags (see the module docstring)."""
    main = next(iter(files.get("main", [])), None)
    if main is None:
        raise EngineUnavailable(f"Model {model.public} has no model file.", code="model_load_error")
    encoder = next(iter(files.get("text_encoder", [])), None)
    vae = next(iter(files.get("vae", [])), None)
    if encoder is not None and vae is not None:
        return ["--diffusion-model", str(main), "--llm", str(encoder), "--vae", str(vae)]
    args = ["-m", str(main)]
    if vae is not None:
        args += ["--vae", str(vae)]
    return args


class SdCppEngine(NativeBackends, ImageEngine):
    # memory rule (Engine.memory_need; measured on this machine, docs/memory.md):
    # a small SD 1.x UNet (1011 MiB) peaked at 1480 MiB making 256x256 pictures; larger pictures need more
    memory_base_bytes = 64 << 20
    memory_per_weight_byte = 1.5
    recipe = "sd-cpp"
    release_page = f"https://github.com/leejet/stable-diffusion.cpp/releases/tag/{SDCPP_VERSION}"
    args_checker = staticmethod(check_sdcpp_args)
    process = "sd-server"
    endpoints = {"images/generations": GENERATIONS_PATH, "images/edits": EDITS_PATH}

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.installer = SdCppInstall(self.cache_dir)

    # ----- backends (native_engine.NativeBackends) ----------------------------------------------
    product = "stable-diffusion.cpp"
    build_minutes = "10 to 30"

    def unsupported_message(self, backend: str) -> str:
        return _unsupported_message(backend)

    def cli_path(self, backend: str = "cpu") -> Path | None:
        """`sd-cli` of the installed backend (upscaling), else None."""
        return self.installer_for(backend).binary(CLI_EXE, backend)

    def config_defaults(self) -> dict[str, Any]:
        return {key: self.config.get(opt.config_key) for key, opt in self.options.items()
                if opt.config_key and key in DEFAULTS}

    # ----- running a model ---------------------------------------------------------------------------
    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        if is_upscaler(model):
            raise EngineUnavailable(f"Model {model.public} is a Real-ESRGAN upscaling model: it is not loaded, it "
                                    "runs per request through /images/upscale.", code="model_load_refused")
        binary = self.installer_for(backend).binary(SERVER_EXE, backend)
        if binary is None:
            st = self.state(backend)
            action = st.action or install_action(self.recipe, backend)
            raise EngineUnavailable(f"The stable-diffusion.cpp '{backend}' backend is not installed ({st.message}). "
                                    f"Install it with: {action}", action=action)
        settings = generation_settings(model, options, self.config_defaults())
        try:  # per-model flags were checked when saved; the server-wide ones merged in are the admin's
            user_args = check_sdcpp_args(options.get("sdcpp_args") or "", trusted=True)
        except ValueError as exc:
            raise EngineUnavailable(str(exc), code="invalid_engine_argument") from None
        argv = [str(binary), *checkpoint_args(model, files), "--listen-ip", "127.0.0.1", "--listen-port", str(port),
                "--steps", str(settings["steps"]), "--cfg-scale", str(settings["cfg_scale"]),
                "-W", str(settings["width"]), "-H", str(settings["height"]), *sampler_args(model, options),
                *(VULKAN_ARGS if backend == "vulkan" else ()), *user_args]
        if backend == "cpu":
            argv += thread_args(user_args, self.process)  # fewer compute threads on a busy CPU (cpu_share.py)
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, health_path="/",
                               env=self.engine_env(backend))
        try:
            await server.start(self.ready_timeout)
        except BackendStartError as exc:
            raise BackendStartError(f"sd-server could not load {model.public} (is every file a model sd.cpp "
                                    f"reads?): {exc}") from None
        # `auto` shows as the backend it chose
        return Launch(server, {**options, **settings, "sd-cpp_backend": backend}, backend, device=self.device(backend))

    # ----- requests ----------------------------------------------------------------------------------
    def is_upscaler(self, model: ModelInfo) -> bool:
        return is_upscaler(model)

    def generation_body(self, prompt: str, width: int, height: int, steps: int | None, cfg_scale: float | None,
                        seed: int) -> dict[str, Any]:
        return generation_body(prompt, width, height, steps, cfg_scale, seed)

    def edit_body(self, prompt: str, images: list[bytes], mask: bytes | None, width: int, height: int,
                  steps: int | None, cfg_scale: float | None, seed: int) -> tuple[bytes, str]:
        return edit_body(prompt, images, mask, width, height, steps, cfg_scale, seed)

    async def cancel_running(self, model: ModelInfo, unload_if_idle: Callable[[], Awaitable[bool]]) -> None:
        """sd-server cannot interrupt a generation: stop its process when no other request uses it
        (the router starts it again on the next request). With others waiting, the picture is
        finished; their turn comes after it."""
        if await unload_if_idle():
            log.info("Stopped sd-server for %s: its client left during a generation, which sd-server cannot "
                     "interrupt otherwise; it loads again on the next request", model.public)

    async def upscale(self, files: dict[str, list[Path]], image: bytes,
                      wait: Callable[[asyncio.Future[Any]], Awaitable[Any]]) -> bytes:
        """`sd-cli -M upscale` on the picture, in a private temp folder removed afterwards; killed if the
        client leaves. Its output lines go to the log stream. It runs on the backend a load would use
        (`sdcpp.backend`; `auto`: vulkan on a Vulkan GPU), as upstream Lemonade's upscale does."""
        backend = self.requested_backend({"sd-cpp_backend": self.config.get("sdcpp.backend")})
        cli = self.cli_path(backend)
        if cli is None:  # first use, as a load would: install the backend (progress in the log)
            name = f"{self.recipe}:{backend}"
            try:
                await asyncio.to_thread(self.install, backend, lambda e: log.info("Installing %s: %s", name,
                                                                                   e.get("message", "")))
            except InstallError as exc:
                raise APIError(500, f"Installing the {name} backend failed: {exc}\nRetry with: "
                               f"{install_action(self.recipe, backend)}", type="server_error",
                               code="backend_install_failed") from None
            cli = self.cli_path(backend)
        model_file = next(iter(files.get("main", [])), None)
        if cli is None or model_file is None:
            raise APIError(500, "ESRGAN upscale failed", type="server_error", code="backend_error")
        with tempfile.TemporaryDirectory(prefix="lemonade-upscale-") as tmp:
            source, target = Path(tmp) / "input.png", Path(tmp) / "output.png"
            source.write_bytes(image)
            log.info("Upscaling with %s on the %s backend: %s", model_file.name, backend, cli)
            code, tail = await _run_logged(upscale_argv(cli, model_file, source, target), f"sd-cli:{model_file.name}",
                                           self.engine_env(backend), wait)
            if code != 0 or not target.is_file():
                log.warning("sd-cli upscale failed (exit %s): %s", code, " | ".join(tail[-5:]))
                raise APIError(500, "ESRGAN upscale failed", type="server_error", code="backend_error")
            return target.read_bytes()


async def _run_logged(argv: list[str], tag: str, env: dict[str, str],
                      wait: Callable[[asyncio.Future[Any]], Awaitable[Any]]) -> tuple[int, list[str]]:
    """Run a program to its end, its output lines into the log stream; (exit code, last lines). A client
    that leaves meanwhile kills it (`wait`, the caller's, raises then, and that is raised on)."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env=env, start_new_session=True)
    tail: list[str] = []
    buffer = log_buffer()

    async def pump() -> int:
        assert proc.stdout is not None
        pending = b""
        while chunk := await proc.stdout.read(65536):
            *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
            for line in lines:
                text = line.decode("utf-8", errors="replace").replace("\x1b[K", "").rstrip()
                if text:
                    tail[:] = [*tail[-39:], text]
                    if buffer is not None:
                        buffer.add(f"engine.{tag}", "Info", text)
                    else:
                        log.info("[%s] %s", tag, text)
        return await proc.wait()

    task = asyncio.ensure_future(pump())
    try:
        return await wait(task), tail
    except BaseException:
        if not task.done():  # the wait ended before the program: its client left (or the request was cancelled)
            signal_group(proc.pid)
            log.info("%s stopped: its client left", tag)
        raise
    finally:
        if proc.returncode is None:
            signal_group(proc.pid)
            await proc.wait()
        task.cancel()
