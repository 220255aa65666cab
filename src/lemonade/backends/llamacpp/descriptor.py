"""llama.cpp (`llama-server`), as data: the one place its backends and config keys are written."""

from lemonade.backends.descriptor import BinRule, Descriptor, Setting
from lemonade.backends.llamacpp.settings import SPECULATION_MODES, check_device, worker_setting, worker_text

DESCRIPTOR = Descriptor(
    recipe="llamacpp",
    engine_class="LlamaCppEngine",
    title="llama.cpp",
    backends=("cpu", "system", "vulkan", "rocm", "cuda", "metal"),  # system: the llama-server found on PATH
    modes=("chat", "embeddings", "reranking"),
    label_modes={"systemone": ("classification",)},
    file_format="gguf",
    section="llamacpp",
    backend_key=True,
    args_key=True,
    backend_flag="llamacpp",
    args_flag="llamacpp-args",
    args_help="Extra arguments for every llama-server",
    args_option_help="Custom arguments to pass to llama-server, e.g. \"--flash-attn on --no-mmap\"",
    panel="Llama.cpp Backend Options",
    settings=(
        Setting("device", "", "llama.cpp device names every model is offloaded to (Vulkan0, CUDA0,CUDA1); "
                "empty: llama-server's choice", check=check_device, option="llamacpp_device",
                option_help="Comma-separated list of accelerator devices to use (e.g. Vulkan0)", metavar="DEVICES"),
        Setting("prefer_system", False, "Use the llama-server found on PATH when the backend is auto"),
        Setting("rpc_workers", [], "host:port of llama.cpp RPC workers (lemonade worker) models are spread over, "
                "or auto for the workers heard announcing themselves on the LAN (docs/scale-out.md)",
                normalize=worker_setting, from_text=worker_text, option="rpc_workers",
                option_help="llama.cpp RPC workers to spread the model over: HOST:PORT[,HOST:PORT...] (lemonade "
                "worker), or auto for those announcing themselves on the network", metavar="WORKERS"),
        Setting("speculation", "auto", "Speculative decoding: auto (on while it makes a model faster), on or off "
                "(backends/llamacpp/spec.py)", choices=SPECULATION_MODES, option="speculation",
                option_help="Speculative decoding: auto (on while it makes the model faster; the default), on or off",
                metavar="MODE"),
    ),
    # which llama.cpp a backend runs: "builtin" (pinned), "latest", a release tag, or a folder of your own
    # build (backends/llamacpp/bins.py)
    bins=("cpu", "vulkan", "rocm", "cuda"),
    bin_rule=BinRule("b8664", "llama-server"),
)
