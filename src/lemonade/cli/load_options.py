"""The recipe options `lemonade load` and `lemonade run` take (guide-cli.md, "Options for load").

One table, `FLAGS`: each command-line flag, the `/v1/load` option it sets, and the help panel it
is listed under. `with_load_options` adds them all to a command, so `load` and `run` can never
offer different sets. The table is kept here rather than read from the engine classes, so
`lemonade --help` does not import every engine; a test checks that every option an engine takes
has its flag. The backend flags' help (the backends each takes) is the engine descriptors'
(backends/<engine>/descriptor.py), which import no engine.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from lemonade.backends.descriptors import BY_SECTION

GENERAL = "General Options"
LLAMACPP = "Llama.cpp Backend Options"
WHISPERCPP = "Whisper.cpp Options"
FASTERWHISPER = "faster-whisper Options"
SDCPP = "Stable Diffusion Options"
VLLM = "vLLM Options"
ONNX = "ONNX Runtime Options"
SPEECH = "Text-to-Speech Options"


@dataclass(frozen=True)
class Flag:
    decls: tuple[str, ...]  # "--llamacpp" (or "--merge-args/--no-merge-args"), then other names
    key: str  # the /v1/load option
    type: type
    help: str
    panel: str
    metavar: str | None = None

    @property
    def param(self) -> str:
        return "opt_" + self.key.replace("-", "_")  # `sd-cpp_backend` is no Python name


FLAGS: tuple[Flag, ...] = (
    Flag(("--ctx-size",), "ctx_size", int, "Context size in tokens; -1 = automatic", GENERAL, "SIZE"),
    Flag(("--merge-args/--no-merge-args",), "merge_args", bool, "Merge the server-wide and this model's *_args "
         "(default); --no-merge-args: the model's replace the server-wide ones entirely", GENERAL),
    Flag(("--auto-evict/--no-auto-evict",), "auto_evict", bool, "Unload this model after it idles for "
         "--evict-idle-timeout (default: the server's auto_evict)", GENERAL),
    Flag(("--evict-idle-timeout",), "evict_idle_timeout", float, "Seconds idle before an auto-evicted model is "
         "unloaded", GENERAL, "SECONDS"),
    Flag(("--downsize-idle-timeout",), "downsize_idle_timeout", float, "Seconds idle before the model's dynamic "
         "memory is freed (weights stay)", GENERAL, "SECONDS"),
    Flag(("--evict-weight-factor",), "evict_weight_factor", float, "How strongly this model resists eviction "
         "(higher stays longer)", GENERAL, "FACTOR"),
    Flag(("--llamacpp", "--llamacpp-backend"), "llamacpp_backend", str, BY_SECTION["llamacpp"].backend_help(),
         LLAMACPP, "BACKEND"),
    Flag(("--llamacpp-device",), "llamacpp_device", str, "Comma-separated list of accelerator devices to use "
         "(e.g. Vulkan0)", LLAMACPP, "DEVICES"),
    Flag(("--llamacpp-args",), "llamacpp_args", str, "Custom arguments to pass to llama-server, e.g. "
         "\"--flash-attn on --no-mmap\"", LLAMACPP, "ARGS"),
    Flag(("--rpc-workers",), "rpc_workers", str, "llama.cpp RPC workers to spread the model over: "
         "HOST:PORT[,HOST:PORT...] (lemonade worker), or auto for those announcing themselves on the network",
         LLAMACPP, "WORKERS"),
    Flag(("--speculation",), "speculation", str, "Speculative decoding: auto (on while it makes the model faster; "
         "the default), on or off", LLAMACPP, "MODE"),
    Flag(("--whispercpp",), "whispercpp_backend", str, BY_SECTION["whispercpp"].backend_help(), WHISPERCPP,
         "BACKEND"),
    Flag(("--whispercpp-args",), "whispercpp_args", str, "Custom arguments to pass to whisper-server",
         WHISPERCPP, "ARGS"),
    Flag(("--fasterwhisper-compute-type",), "fasterwhisper_compute_type", str, "int8 (default), int8_float32, "
         "float32 or default", FASTERWHISPER, "TYPE"),
    Flag(("--fasterwhisper-threads",), "fasterwhisper_threads", int, "CPU threads (0: one per core)",
         FASTERWHISPER, "N"),
    Flag(("--sdcpp", "--sdcpp-backend"), "sd-cpp_backend", str, BY_SECTION["sdcpp"].backend_help(), SDCPP,
         "BACKEND"),
    Flag(("--sdcpp-args",), "sdcpp_args", str, "Custom arguments to pass to sd-server, e.g. \"--vae-tiling "
         "--diffusion-fa\" (must not conflict with the ones Lemonade sets)", SDCPP, "ARGS"),
    Flag(("--steps",), "steps", int, "Default inference steps of an image model", SDCPP, "N"),
    Flag(("--cfg-scale",), "cfg_scale", float, "Default guidance scale of an image model", SDCPP, "SCALE"),
    Flag(("--width",), "width", int, "Default image width in pixels", SDCPP, "PX"),
    Flag(("--height",), "height", int, "Default image height in pixels", SDCPP, "PX"),
    Flag(("--sampling-method",), "sampling_method", str, "Default sampling method of an image model (e.g. euler)",
         SDCPP, "METHOD"),
    Flag(("--flow-shift",), "flow_shift", float, "Default flow shift of a flow image model", SDCPP, "SHIFT"),
    Flag(("--vllm",), "vllm_backend", str, BY_SECTION["vllm"].backend_help(), VLLM, "BACKEND"),
    Flag(("--vllm-args",), "vllm_args", str, "Custom arguments to pass to vllm serve", VLLM, "ARGS"),
    Flag(("--onnxruntime-threads",), "onnxruntime_threads", int, "ONNX Runtime threads of a classifier "
         "(0: one per core)", ONNX, "N"),
    Flag(("--kokoro-threads",), "kokoro_threads", int, "ONNX Runtime threads of Kokoro (0: one per core)",
         SPEECH, "N"),
    Flag(("--piper-threads",), "piper_threads", int, "ONNX Runtime threads of Piper (0: one per core)",
         SPEECH, "N"),
)


def _value(flag: Flag, value: Any) -> Any:
    if flag.key == "rpc_workers":  # the server takes a list, or "auto"
        if str(value).strip().lower() == "auto":
            return "auto"
        return [w.strip() for w in str(value).split(",") if w.strip()]
    return value


def with_load_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` gains every flag of `FLAGS`; it receives those given as `options` (a /v1/load dict)."""
    added = [inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[f.type | None, typer.Option(
                                   *f.decls, help=f.help, rich_help_panel=f.panel, metavar=f.metavar,
                                   show_default=False)])
             for f in FLAGS]

    def options(given: dict[str, Any]) -> dict[str, Any]:
        return {f.key: _value(f, given[f.param]) for f in FLAGS if given[f.param] is not None}

    return with_options(func, "options", added, options)


def with_options(func: Callable[..., Any], into: str, added: list[inspect.Parameter],
                 collect: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """`func` gains the keyword parameters `added` (typer options); `collect` turns their values (None
    where not given) into what `func` receives as its parameter `into`."""
    sig = inspect.signature(func, eval_str=True)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != into]
    names = [p.name for p in added]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name in names}
        return func(**kwargs, **{into: collect(given)})

    params = [*own, *added]
    # typer reads the signature and the annotations: both are the new ones, already evaluated
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__
    return wrapper
