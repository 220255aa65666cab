"""stable-diffusion.cpp (`sd-server`, `sd-cli`), as data: the one place its backends and config keys are written."""

from lemonade.backends.descriptor import BinRule, Descriptor, ModelOption, Setting
from lemonade.backends.sdcpp.settings import check_not_negative, check_side, check_steps

DESCRIPTOR = Descriptor(
    recipe="sd-cpp",
    engine_class="SdCppEngine",
    title="stable-diffusion.cpp",
    # as upstream Lemonade lists them; this build installs cpu and vulkan (auto: vulkan on a Vulkan GPU,
    # else cpu, backends/native_engine.py)
    backends=("cpu", "vulkan", "rocm", "cuda"),
    modes=("image",),
    section="sdcpp",
    backend_key=True,
    args_key=True,
    args_help="Extra arguments for every sd-server",
    args_option_help="Custom arguments to pass to sd-server, e.g. \"--vae-tiling --diffusion-fa\" (must not "
    "conflict with the ones Lemonade sets)",
    panel="Stable Diffusion Options",
    settings=(  # an image model's defaults (lemonade.md's load option defaults)
        Setting("steps", 20, "Default inference steps of an image model", check=check_steps, option="steps",
                metavar="N"),
        Setting("cfg_scale", 7.0, "Default guidance scale of an image model", check=check_not_negative,
                option="cfg_scale", metavar="SCALE"),
        Setting("width", 512, "Default image width in pixels", check=check_side, option="width",
                metavar="PX"),
        Setting("height", 512, "Default image height in pixels", check=check_side, option="height",
                metavar="PX"),
    ),
    model_options=(  # an image model's sampler, else its catalog entry's (backends/sdcpp/engine.py)
        ModelOption("sampling_method", str, "Default sampling method of an image model (e.g. euler)", "METHOD"),
        ModelOption("flow_shift", (int, float), "Default flow shift of a flow image model", "SHIFT",
                    check=check_not_negative),
    ),
    bins=("cpu", "vulkan"),  # backends/native_bins.py
    bin_rule=BinRule("master-820-de298c2", "sd-server"),
)
