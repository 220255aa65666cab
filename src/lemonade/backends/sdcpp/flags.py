"""Which sd-server flags `sdcpp_args` may carry (Lemonade's `sdcpp_args` recipe option).

Taken from the pinned stable-diffusion.cpp's `sd-server` argument parser (its usage text). sd-server
refuses an unknown flag and exits, so every flag is checked against that list before a load.

- Per model or per request (any API key holder): flags that touch neither files nor the network:
  compute and memory placement (threads, flash attention, offloading, tiling, weight types) and
  generation defaults (sampler, scheduler, guidance, seed, ...).
- Server-wide `sdcpp.args` (the admin's): any flag the pinned server knows, also those naming files
  (LoRA and embedding folders, extra encoders, control nets, init images, an HTML page to serve).
- Never: the flags Lemonade sets itself for every load (model files, listen address, and the
  steps, guidance and size that the load options `steps`, `cfg_scale`, `width`, `height` set);
  nor `--help`, which is no flag to run with (it prints the usage and exits).
"""

from __future__ import annotations

from lemonade.backends.engine import check_native_args
from lemonade.backends.sdcpp.install import SDCPP_VERSION

FORBIDDEN_FLAGS = {
    "-m": "the model file (-m)", "--model": "the model file (-m)", "--diffusion-model": "the model files",
    "--llm": "the model files", "--qwen2vl": "the model files", "--vae": "the model files",
    "-l": "the listen address", "--listen-ip": "the listen address", "--listen-port": "the port",
    "--steps": "--steps from the load option steps", "--cfg-scale": "--cfg-scale from the load option cfg_scale",
    "-W": "the width from the load option width", "--width": "the width from the load option width",
    "-H": "the height from the load option height", "--height": "the height from the load option height",
}

SAFE_FLAGS = frozenset("""
-v --verbose --color -t --threads --tensor-type-rules --chroma-t5-mask-pad --max-vram --force-sdxl-vae-conv-scale
--offload-to-cpu --mmap --control-net-cpu --clip-on-cpu --vae-on-cpu --fa --diffusion-fa --diffusion-conv-direct
--vae-conv-direct --circular --circularx --circulary --chroma-disable-dit-mask --qwen-image-zero-cond-t
--chroma-enable-t5-mask --type --rng --sampler-rng --prediction --lora-apply-mode -p --prompt -n --negative-prompt
--high-noise-steps --clip-skip -b --batch-count --video-frames --fps --timestep-shift --upscale-repeats
--upscale-tile-size --hires-width --hires-height --hires-steps --hires-upscale-tile-size --img-cfg-scale --guidance
--slg-scale --skip-layer-start --skip-layer-end --eta --flow-shift --high-noise-cfg-scale --high-noise-img-cfg-scale
--high-noise-guidance --high-noise-slg-scale --high-noise-skip-layer-start --high-noise-skip-layer-end
--high-noise-eta --strength --pm-style-strength --control-strength --moe-boundary --vace-strength
--vae-tile-overlap --hires-scale --hires-denoising-strength --increase-ref-index --disable-auto-resize-ref-image
--disable-image-metadata --vae-tiling --hires -s --seed --sampling-method --high-noise-sampling-method --scheduler
--sigmas --skip-layers --high-noise-skip-layers --cache-mode --cache-option --scm-mask --scm-policy --vae-tile-size
--vae-relative-tile-size
""".split())

# Files and folders: encoders, LoRA/embedding/upscaler folders, control nets, PhotoMaker, reference and
# init images, the HTML page sd-server would serve.
ADMIN_ONLY_FLAGS = frozenset("""
--serve-html-path --clip_l --clip_g --clip_vision --t5xxl --llm_vision --qwen2vl_vision --high-noise-diffusion-model
--taesd --tae --control-net --embd-dir --lora-model-dir --hires-upscalers-dir --photo-maker --upscale-model -i
--init-img --end-img --mask --control-image --control-video --pm-id-images-dir --pm-id-embed-path --hires-upscaler
-r --ref-image
""".split())

KNOWN_FLAGS = SAFE_FLAGS | ADMIN_ONLY_FLAGS | frozenset(FORBIDDEN_FLAGS)


def check_sdcpp_args(text: str, *, trusted: bool = False) -> list[str]:
    """Tokenise `sdcpp_args`; ValueError naming the first flag that Lemonade sets itself, that is not
    allowed per model (`trusted`: the admin's server-wide `sdcpp.args`), or that sd-server does not know."""
    return check_native_args(text, trusted=trusted, forbidden=FORBIDDEN_FLAGS, safe=SAFE_FLAGS, known=KNOWN_FLAGS,
                             program=f"sd-server (stable-diffusion.cpp {SDCPP_VERSION})", option="sdcpp_args",
                             config_key="sdcpp.args",
                             examples="threads, flash attention, offloading, tiling, sampler, ...",
                             instead=" Use the load options instead (steps, cfg_scale, width, height).")
