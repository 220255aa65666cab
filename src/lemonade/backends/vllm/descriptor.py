"""vLLM (`vllm serve`, on CUDA/ROCm GPUs), as data: the one place its backends and config keys are written."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(
    recipe="vllm",
    engine_class="VllmEngine",
    title="vLLM",
    backends=("rocm", "cuda"),
    modes=("chat",),
    section="vllm",
    backend_key=True,
    args_key=True,
    args_help="Extra arguments for every vllm serve",
    args_option_help="Custom arguments to pass to vllm serve",
)
