"""What stable-diffusion.cpp takes for a picture, as data: the bounds of steps, sizes and guidance.

One place for them: the `sdcpp` config keys and the image load options check against them
(backends/sdcpp/descriptor.py), and so do the `/v1/images/*` requests (serving/images.py), so a
server-wide default can never be one that every request would be refused for.
"""

from __future__ import annotations

from typing import Any

# stable-diffusion.cpp clamps steps to 1..100 in its server; sizes go in multiples of 64 because the
# latent is 1/8 of the picture and the UNet halves it three times; 2048 per side is the practical ceiling.
MIN_STEPS, MAX_STEPS = 1, 100
SIZE_STEP, MIN_SIDE, MAX_SIDE = 64, 64, 2048


def check_steps(what: str, value: Any) -> str | None:
    return None if MIN_STEPS <= value <= MAX_STEPS else f"'{what}' must be {MIN_STEPS} to {MAX_STEPS}, got {value}"


def check_side(what: str, value: Any) -> str | None:
    if value % SIZE_STEP or not MIN_SIDE <= value <= MAX_SIDE:
        return f"'{what}' must be a multiple of {SIZE_STEP} from {MIN_SIDE} to {MAX_SIDE}, got {value}"
    return None


def check_not_negative(what: str, value: Any) -> str | None:
    return None if value >= 0 else f"'{what}' must be 0 or more, got {value}"
