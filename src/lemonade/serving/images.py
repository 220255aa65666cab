"""Pictures through the router: every image field's check, and the one path that makes them.

Every field is checked before any model loads, and a bad one is a 400 naming it: `size` is
`WIDTHxHEIGHT` in multiples of 64 from 64 to 2048, `n` 1 to 10, `response_format` only `b64_json`,
`steps` 1 to 100, `cfg_scale` 0 or more, `seed` an integer (omitted: a random seed; the same seed
gives the same bytes). A request for n images asks the engine n times with seeds seed, seed+1, ...
(each answer one PNG), so n is not bounded by the engine's batch limit and every image is
reproducible on its own.

The engine (described by `backends/`) serves `images/generations` (JSON) and `images/edits`
(multipart). A client that hangs up while its picture is made stops the engine's work (the engine
description says how: `ImageEngine.cancel_running`, given what it may do: unload the model when no
other request uses it). The engine's progress lines (steps) go to the log stream.

`generate_images` is the one path the HTTP routes (api/openai/images.py), Ollama's `/api/generate`,
the MCP tool and the omni tools use.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import logging
import re
import time
from typing import Any

from lemonade.backends.image_engine import MAX_SIDE, MAX_STEPS, MIN_SIDE, MIN_STEPS, SIZE_STEP, ImageEngine
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.request_context import ClientGone, until_gone_or
from lemonade.services import Services
from lemonade.serving.models import check_model, engine_path, resolve

log = logging.getLogger("lemonade.images")

SIZE_RE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
MAX_N = 10
MAX_SEED = 2**63 - 1
MAX_IMAGE_BYTES = 50 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ----- checks ------------------------------------------------------------------------------------------
def parse_size(size: Any, default: tuple[int, int]) -> tuple[int, int]:
    """`WIDTHxHEIGHT`, multiples of 64 within the engine's limits; None/"auto" is the default."""
    if size is None or size == "auto":
        return default
    m = SIZE_RE.match(size) if isinstance(size, str) else None
    if m is None:
        raise APIError(400, f"Invalid value for 'size': {json.dumps(size)}. Use WIDTHxHEIGHT, e.g. 512x512",
                       code="invalid_argument")
    width, height = int(m.group(1)), int(m.group(2))
    for side in (width, height):
        if side % SIZE_STEP or not MIN_SIDE <= side <= MAX_SIDE:
            raise APIError(400, f"Invalid value for 'size': '{size}'. Width and height must be multiples of "
                                f"{SIZE_STEP} from {MIN_SIDE} to {MAX_SIDE}", code="invalid_argument")
    return width, height


def parse_n(value: Any) -> int:
    n = _integer("n", value, 1)
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"Invalid value for 'n': {n}. It must be from 1 to {MAX_N}", code="invalid_argument")
    return n


def check_response_format(value: Any) -> None:
    if value is not None and value != "b64_json":
        raise APIError(400, f"Invalid value for 'response_format': {json.dumps(value)}. Only 'b64_json' is "
                            "supported (the image comes back base64-encoded in data[].b64_json)",
                       code="invalid_argument")


def _integer(name: str, value: Any, default: int | None) -> int:
    if value is None or value == "":
        if default is None:
            raise APIError(400, f"Missing required field '{name}'", code="missing_argument")
        return default
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise APIError(400, f"Invalid value for '{name}': {json.dumps(value)} is not an integer",
                           code="invalid_argument") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"Invalid value for '{name}': {json.dumps(value)} is not an integer",
                       code="invalid_argument")
    return value


def parse_steps(value: Any) -> int | None:
    if value is None or value == "":
        return None
    steps = _integer("steps", value, None)
    if not MIN_STEPS <= steps <= MAX_STEPS:
        raise APIError(400, f"Invalid value for 'steps': {steps}. It must be from {MIN_STEPS} to {MAX_STEPS}",
                       code="invalid_argument")
    return steps


def parse_cfg_scale(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        cfg = float(value)
        if not 0 <= cfg <= 100:
            raise ValueError
    except (TypeError, ValueError):
        raise APIError(400, f"Invalid value for 'cfg_scale': {json.dumps(value)}. Use a number from 0 to 100",
                       code="invalid_argument") from None
    return cfg


def parse_seed(value: Any) -> int | None:
    if value is None or value == "":
        return None
    seed = _integer("seed", value, None)
    if not -MAX_SEED <= seed <= MAX_SEED:
        raise APIError(400, f"Invalid value for 'seed': {seed} is out of range", code="invalid_argument")
    return seed


def check_prompt(value: Any, field: str = "prompt") -> str:
    if value is None:
        raise APIError(400, f"Missing required field '{field}'", code="missing_argument")
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, f"Invalid value for '{field}': the prompt must be non-empty text",
                       code="invalid_argument")
    return value


def check_image_bytes(data: bytes, field: str) -> bytes:
    """A PNG (or JPEG, which the engine reads too); anything else is refused before any work."""
    if not data:
        raise APIError(400, f"Invalid value for '{field}': the file is empty", code="invalid_argument")
    if len(data) > MAX_IMAGE_BYTES:
        raise APIError(400, f"Invalid value for '{field}': the image is larger than "
                            f"{MAX_IMAGE_BYTES // (1024 * 1024)} MB", code="invalid_argument")
    if not (data.startswith(PNG_MAGIC) or data.startswith(b"\xff\xd8\xff")):
        raise APIError(400, f"Invalid value for '{field}': not a PNG image", code="invalid_image")
    return data


def image_model(svc: Services, name: Any, endpoint: str) -> tuple[ModelInfo, ImageEngine]:
    """The model, checked to be an image generation model this server runs, and its engine."""
    model = check_model(svc, resolve(svc, name), "image", endpoint)
    engine = svc.engines.get(model.recipe)
    if not isinstance(engine, ImageEngine):
        raise APIError(400, f"Model {model.public} (recipe '{model.recipe}') does not serve {endpoint}",
                       code="invalid_argument")
    if engine.is_upscaler(model):
        raise APIError(400, f"Model {model.public} is an upscaling model and cannot serve {endpoint}; use "
                            "/images/upscale instead", code="model_mode_mismatch")
    return model, engine


# ----- running -----------------------------------------------------------------------------------------
async def _ask(svc: Services, model: ModelInfo, endpoint: str, call: Any) -> dict[str, Any]:
    """One engine call; a client that leaves meanwhile stops the engine's work."""
    try:
        return await call
    except ClientGone:
        engine = svc.engines.get(model.recipe)
        log.info("%s: the client of an image request went away; stopping the engine's work", model.public)
        if isinstance(engine, ImageEngine):
            _background(engine.cancel_running(model, functools.partial(_unload_if_idle, svc, model)))
        raise


async def _unload_if_idle(svc: Services, model: ModelInfo) -> bool:
    """Unload `model` unless another request is using it (its turn comes after the running work);
    True when it was unloaded."""
    lm = svc.router.resident(model.name)
    if lm is None or lm.active > 0:
        return False
    await svc.router.unload(model.name)
    return True


_TASKS: set[asyncio.Task[Any]] = set()


def _background(coro: Any) -> None:
    """Run `coro` after the request ends (kept referenced until done)."""
    task = asyncio.ensure_future(coro)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


def _png(answer: dict[str, Any], model: ModelInfo) -> str:
    items = answer.get("data") or []
    b64 = items[0].get("b64_json") if items and isinstance(items[0], dict) else None
    if not b64:
        raise APIError(500, f"{model.public}: the engine answered without an image", type="server_error",
                       code="backend_error")
    return b64


async def generate_images(svc: Services, model: ModelInfo, engine: ImageEngine, prompt: str, *, size: tuple[int, int],
                          n: int = 1, steps: int | None = None, cfg_scale: float | None = None,
                          seed: int | None = None) -> dict[str, Any]:
    """`{"created", "data": [{"b64_json"}]}` for n pictures of `prompt`."""
    prompt = check_prompt(prompt)  # also for the callers that are not the route (Ollama, MCP)
    path = engine_path(svc, model, "images/generations")
    first = engine.resolve_seed(seed)
    started = time.monotonic()
    data = []
    for i in range(n):
        body = engine.generation_body(prompt, size[0], size[1], steps, cfg_scale, first + i)
        answer = await _ask(svc, model, "images/generations",
                            svc.proxy.post_json(model, path, body, "images/generations"))
        data.append({"b64_json": _png(answer, model)})
    log.info("%s: %d image(s) of %dx%d in %.1f s (seed %d)", model.public, n, size[0], size[1],
             time.monotonic() - started, first)  # the proxy counted each request in /metrics
    return {"created": int(time.time()), "data": data}


async def edit_images(svc: Services, model: ModelInfo, engine: ImageEngine, prompt: str, images: list[bytes],
                      mask: bytes | None, *, size: tuple[int, int], n: int = 1, steps: int | None = None,
                      cfg_scale: float | None = None, seed: int | None = None,
                      endpoint: str = "images/edits") -> dict[str, Any]:
    path = engine_path(svc, model, "images/edits")
    first = engine.resolve_seed(seed)
    data = []
    for i in range(n):
        body, content_type = engine.edit_body(prompt, images, mask, size[0], size[1], steps, cfg_scale, first + i)
        answer = await _ask(svc, model, endpoint, _json(svc.proxy.post_raw(model, path, body, content_type)))
        data.append({"b64_json": _png(answer, model)})
    svc.metrics.record_inference(model.public, endpoint, None, None)
    return {"created": int(time.time()), "data": data}


async def _json(answer: Any) -> dict[str, Any]:
    """The engine's raw answer (an awaitable of bytes) as JSON."""
    return json.loads(await answer)


def default_size(model: ModelInfo) -> tuple[int, int]:
    """The spec's 512x512 unless the model's catalog entry says otherwise."""
    defaults = model.image_defaults or {}
    return int(defaults.get("width", 512)), int(defaults.get("height", 512))


def upscale_model(svc: Services, name: Any) -> tuple[ModelInfo, ImageEngine]:
    """The Real-ESRGAN model named `name`; the spec's 400/404 otherwise."""
    if name is None or name == "":
        raise APIError(400, "Missing 'model' field", code="missing_argument")
    if not isinstance(name, str):
        raise APIError(400, "Invalid value for 'model': a model name (string) is expected", code="invalid_argument")
    try:
        model = resolve(svc, name)
    except APIError as exc:
        if exc.status == 404:
            raise APIError(404, f"Upscale model not found: {name}", type="invalid_request_error",
                           code="model_not_found") from None
        raise
    engine = svc.engines.get(model.recipe)
    if not isinstance(engine, ImageEngine) or not engine.is_upscaler(model):
        raise APIError(404, f"Upscale model not found: {name}", type="invalid_request_error", code="model_not_found")
    return model, engine


def decode_base64_image(value: Any, field: str = "image") -> bytes:
    """Base64 (or a `data:image/...;base64,` URL) of a PNG/JPEG; a 400 naming `field` otherwise."""
    if not isinstance(value, str):
        raise APIError(400, f"Invalid value for '{field}': base64-encoded PNG text is expected",
                       code="invalid_argument")
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"Invalid value for '{field}': not valid base64", code="invalid_argument") from None
    return check_image_bytes(data, field)


async def upscale_image(svc: Services, model: ModelInfo, engine: ImageEngine, png: bytes) -> dict[str, Any]:
    files = await svc.downloads.files_for_load(model)
    started = time.monotonic()
    out = await engine.upscale(files, png, until_gone_or)  # a client that leaves stops the work
    log.info("%s: upscaled %d bytes to %d bytes in %.1f s", model.public, len(png), len(out),
             time.monotonic() - started)
    svc.metrics.record_inference(model.public, "images/upscale", None, None)
    return {"created": int(time.time()), "data": [{"b64_json": base64.b64encode(out).decode()}]}
