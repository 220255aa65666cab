"""What `/v1/images/*` asks of an image engine, so the API names no recipe.

An image engine serves `images/generations` (a JSON body per picture) and `images/edits` (a
multipart body per picture) through its loaded model's process, and may upscale with a model that
is run per request instead of loaded. The API checks the request, then asks the engine for the
body of one picture (`generation_body`, `edit_body`) and sends it through the router and proxy
like any other request; `cancel_running` is what the API calls when the client of a running
picture hangs up. The engine knows nothing of the router: what it may do is passed in.
"""

from __future__ import annotations

import asyncio
import random
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.engine import Engine

# What every image engine of this build takes (stable-diffusion.cpp's, the only one): the API checks
# requests against these, the `sdcpp` config keys and load options check against the same.
from lemonade.backends.sdcpp.settings import MAX_SIDE, MAX_STEPS, MIN_SIDE, MIN_STEPS, SIZE_STEP

__all__ = ["MAX_SEED", "MAX_SIDE", "MAX_STEPS", "MIN_SIDE", "MIN_STEPS", "SIZE_STEP", "ImageEngine"]

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

MAX_SEED = 2**31 - 1


class ImageEngine(Engine):

    def is_upscaler(self, model: ModelInfo) -> bool:
        """A model run per request by `upscale`, never loaded."""
        return False

    def resolve_seed(self, seed: int | None) -> int:
        """The seed a picture is made with: the given one, or a random one."""
        return seed if seed is not None and seed >= 0 else random.randint(0, MAX_SEED)

    @abstractmethod
    def generation_body(self, prompt: str, width: int, height: int, steps: int | None, cfg_scale: float | None,
                        seed: int) -> dict[str, Any]:
        """The engine's JSON body for one PNG of `prompt`."""

    @abstractmethod
    def edit_body(self, prompt: str, images: list[bytes], mask: bytes | None, width: int, height: int,
                  steps: int | None, cfg_scale: float | None, seed: int) -> tuple[bytes, str]:
        """The engine's body for one edited PNG: (bytes, content type)."""

    async def cancel_running(self, model: ModelInfo, unload_if_idle: Callable[[], Awaitable[bool]]) -> None:
        """Stop work the engine is doing for a client that left (nothing, where closing the
        connection is enough). `unload_if_idle()` unloads the model unless another request uses
        it, and says whether it did."""

    async def upscale(self, files: dict[str, list[Path]], image: bytes,
                      wait: Callable[[asyncio.Future[Any]], Awaitable[Any]]) -> bytes:
        """The picture upscaled with the upscaling model whose files these are. `wait(work)` awaits
        the engine's work for the request: it raises instead when the request's client leaves
        first, and the work is then stopped."""
        raise NotImplementedError
