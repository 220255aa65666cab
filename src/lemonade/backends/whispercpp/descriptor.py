"""whisper.cpp (`whisper-server`), as data: the one place its backends and config keys are written."""

from lemonade.backends.descriptor import BinRule, Descriptor

DESCRIPTOR = Descriptor(
    recipe="whispercpp",
    engine_class="WhisperCppEngine",
    title="whisper.cpp",
    # as upstream Lemonade lists them; this build installs cpu and vulkan (auto: vulkan on a Vulkan GPU,
    # else cpu, backends/native_engine.py)
    backends=("cpu", "vulkan", "npu"),
    modes=("transcription",),
    section="whispercpp",
    backend_key=True,
    args_key=True,
    args_help="Extra arguments for every whisper-server",
    args_option_help="Custom arguments to pass to whisper-server",
    panel="Whisper.cpp Options",
    bins=("cpu", "vulkan"),  # backends/native_bins.py
    bin_rule=BinRule("v1.8.4", "whisper-server"),
)
