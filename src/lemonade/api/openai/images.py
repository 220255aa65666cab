"""`POST /v1/images/generations`, `/edits`, `/variations`, `/upscale` (openai.md): pictures in PNG.

Every field is checked here, before any model loads, and a bad one is a 400 naming it: `size` is
`WIDTHxHEIGHT` in multiples of 64 from 64 to 2048, `n` 1 to 10, `response_format` only `b64_json`,
`steps` 1 to 100, `cfg_scale` 0 or more, `seed` an integer (omitted: a random seed; the same seed
gives the same bytes). A request for n images asks the engine n times with seeds seed, seed+1, ...
(each answer one PNG), so n is not bounded by the engine's batch limit and every image is
reproducible on its own.

The engine (described by `backends/`) serves `images/generations` (JSON) and `images/edits`
(multipart); a variation is an edit of the image with a neutral prompt, as upstream Lemonade does.
A client that hangs up while its picture is made stops the engine's work (the engine description
says how: `Engine.cancel_running`). The engine's progress lines (steps) go to the log stream.

`generate_images` is the one path the HTTP route, Ollama's `/api/generate` and the MCP tool use.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import UploadFile

from lemonade.api.body import json_object
from lemonade.api.errors import APIError
from lemonade.api.openapi import json_body
from lemonade.backends.image_engine import ImageEngine
from lemonade.model_info import ModelInfo
from lemonade.runtime.request_context import ClientGone
from lemonade.services import Services

log = logging.getLogger("lemonade.images")
router = APIRouter(tags=["openai"])

SIZE_RE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
SIZE_STEP, MIN_SIDE, MAX_SIDE = 64, 64, 2048
MAX_N = 10
MIN_STEPS, MAX_STEPS = 1, 100
MAX_SEED = 2**63 - 1
MAX_IMAGE_BYTES = 50 * 1024 * 1024
MAX_FIELD_BYTES = 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VARIATION_PROMPT = "a variation of this image"
# OpenAI fields accepted and not passed on (openai.md, /images/edits and /variations).
IGNORED_FIELDS = ("user", "background", "quality", "input_fidelity", "output_compression", "style", "moderation",
                  "output_format", "partial_images", "stream")


class GenerationRequest(BaseModel):
    """`/images/generations` as documented (the route checks the body itself, naming the field)."""

    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str
    size: str | None = Field(None, description="WIDTHxHEIGHT, multiples of 64 from 64 to 2048 (default 512x512)")
    n: int | None = Field(None, ge=1, le=MAX_N)
    response_format: str | None = Field(None, description="Only b64_json")
    steps: int | None = Field(None, ge=MIN_STEPS, le=MAX_STEPS)
    cfg_scale: float | None = Field(None, ge=0)
    seed: int | None = None


class UpscaleRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    image: str = Field(..., description="A base64-encoded PNG")
    model: str = Field(..., description="A Real-ESRGAN model, e.g. RealESRGAN-x4plus")


def _multipart(required: tuple[str, ...], fields: tuple[str, ...]) -> dict[str, Any]:
    props: dict[str, Any] = {f: {"type": "string"} for f in fields}
    props.update({f: {"type": "string", "format": "binary"} for f in ("image", "image[]", "mask") if f in fields})
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": list(required), "properties": props}}}}}


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
    model = svc.check_model(svc.resolve(name), "image", endpoint)
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
            _background(engine.cancel_running(svc.router, model))
        raise


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
    path = svc.engine_path(model, "images/generations")
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
    path = svc.engine_path(model, "images/edits")
    first = engine.resolve_seed(seed)
    data = []
    for i in range(n):
        body, content_type = engine.edit_body(prompt, images, mask, size[0], size[1], steps, cfg_scale, first + i)
        raw = svc.proxy.post_raw(model, path, body, content_type)
        answer = await _ask(svc, model, endpoint, _json(raw))
        data.append({"b64_json": _png(answer, model)})
    svc.metrics.record_inference(model.public, endpoint, None, None)
    return {"created": int(time.time()), "data": data}


async def _json(raw: Any) -> dict[str, Any]:
    return json.loads(await raw)


def _default_size(svc: Services, model: ModelInfo) -> tuple[int, int]:
    """The spec's 512x512 unless the model's catalog entry says otherwise."""
    defaults = model.image_defaults or {}
    return int(defaults.get("width", 512)), int(defaults.get("height", 512))


# ----- routes ------------------------------------------------------------------------------------------
@router.post("/images/generations", openapi_extra=json_body(GenerationRequest))
async def generations(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    body = await json_object(request)
    prompt = check_prompt(body.get("prompt"))
    check_response_format(body.get("response_format"))
    n = parse_n(body.get("n"))
    steps, cfg, seed = parse_steps(body.get("steps")), parse_cfg_scale(body.get("cfg_scale")), \
        parse_seed(body.get("seed"))
    model, engine = image_model(svc, body.get("model"), "/images/generations")
    size = parse_size(body.get("size"), _default_size(svc, model))
    return await generate_images(svc, model, engine, prompt, size=size, n=n, steps=steps, cfg_scale=cfg, seed=seed)


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, UploadFile):
        return None
    return str(value)


async def _form(request: Request, endpoint: str) -> Any:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(400, f"Send {endpoint} as multipart/form-data with the image as a file part 'image'",
                       code="invalid_argument")
    return await request.form(max_part_size=MAX_FIELD_BYTES)


async def _images(form: Any, names: tuple[str, ...]) -> list[bytes]:
    uploads = [u for name in names for u in form.getlist(name) if isinstance(u, UploadFile)]
    if not uploads:
        raise APIError(400, f"Missing required field '{names[0]}' (the source image, as a multipart file part)",
                       code="missing_argument")
    return [check_image_bytes(await u.read(), names[0]) for u in uploads]


@router.post("/images/edits", openapi_extra=_multipart(
    ("model", "image", "prompt"), ("model", "image", "image[]", "mask", "prompt", "size", "n", "response_format",
                                   "steps", "cfg_scale", "seed")))
async def edits(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    form = await _form(request, "/images/edits")
    images = await _images(form, ("image", "image[]"))
    mask_upload = form.get("mask")
    mask = check_image_bytes(await mask_upload.read(), "mask") if isinstance(mask_upload, UploadFile) else None
    prompt = check_prompt(_field(form, "prompt"))
    check_response_format(_field(form, "response_format"))
    n = parse_n(_field(form, "n"))
    steps, cfg, seed = parse_steps(_field(form, "steps")), parse_cfg_scale(_field(form, "cfg_scale")), \
        parse_seed(_field(form, "seed"))
    model, engine = image_model(svc, _field(form, "model"), "/images/edits")
    size = parse_size(_field(form, "size"), _default_size(svc, model))
    return await edit_images(svc, model, engine, prompt, images, mask, size=size, n=n, steps=steps, cfg_scale=cfg,
                             seed=seed)


@router.post("/images/variations", openapi_extra=_multipart(
    ("model", "image"), ("model", "image", "size", "n", "response_format", "steps", "cfg_scale", "seed")))
async def variations(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    form = await _form(request, "/images/variations")
    images = await _images(form, ("image",))
    check_response_format(_field(form, "response_format"))
    n = parse_n(_field(form, "n"))
    steps, cfg, seed = parse_steps(_field(form, "steps")), parse_cfg_scale(_field(form, "cfg_scale")), \
        parse_seed(_field(form, "seed"))
    model, engine = image_model(svc, _field(form, "model"), "/images/variations")
    size = parse_size(_field(form, "size"), _default_size(svc, model))
    return await edit_images(svc, model, engine, VARIATION_PROMPT, images[:1], None, size=size, n=n, steps=steps,
                             cfg_scale=cfg, seed=seed, endpoint="images/variations")


def upscale_model(svc: Services, name: Any) -> tuple[ModelInfo, ImageEngine]:
    """The Real-ESRGAN model named `name`; the spec's 400/404 otherwise."""
    if name is None or name == "":
        raise APIError(400, "Missing 'model' field", code="missing_argument")
    if not isinstance(name, str):
        raise APIError(400, "Invalid value for 'model': a model name (string) is expected", code="invalid_argument")
    try:
        model = svc.resolve(name)
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
    files = await svc.files_for_load(model)
    started = time.monotonic()
    out = await engine.upscale(files, png)
    log.info("%s: upscaled %d bytes to %d bytes in %.1f s", model.public, len(png), len(out),
             time.monotonic() - started)
    svc.metrics.record_inference(model.public, "images/upscale", None, None)
    return {"created": int(time.time()), "data": [{"b64_json": base64.b64encode(out).decode()}]}


@router.post("/images/upscale", openapi_extra=json_body(UpscaleRequest))
async def upscale(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    body = await json_object(request)
    if body.get("image") in (None, ""):
        raise APIError(400, "Missing 'image' field (base64 encoded)", code="missing_argument")
    model, engine = upscale_model(svc, body.get("model"))
    png = decode_base64_image(body["image"])
    return await upscale_image(svc, model, engine, png)
