"""`POST /v1/images/generations`, `/edits`, `/variations`, `/upscale` (openai.md): pictures in PNG.

The routes read the JSON or multipart body; every field is checked, and the pictures made, by
serving/images.py (the path Ollama's `/api/generate`, the MCP tool and the omni tools use too), before
any model loads. A variation is an edit of the image with a neutral prompt, as upstream Lemonade does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import UploadFile

from lemonade.api.body import json_object
from lemonade.api.errors import APIError
from lemonade.api.openapi import json_body
from lemonade.backends.image_engine import MAX_STEPS, MIN_STEPS
from lemonade.services import Services
from lemonade.serving.images import (
    MAX_N,
    check_image_bytes,
    check_prompt,
    check_response_format,
    decode_base64_image,
    default_size,
    edit_images,
    generate_images,
    image_model,
    parse_cfg_scale,
    parse_n,
    parse_seed,
    parse_size,
    parse_steps,
    upscale_image,
    upscale_model,
)

router = APIRouter(tags=["openai"])
MAX_FIELD_BYTES = 1024 * 1024
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
    size = parse_size(body.get("size"), default_size(model))
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
    size = parse_size(_field(form, "size"), default_size(model))
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
    size = parse_size(_field(form, "size"), default_size(model))
    return await edit_images(svc, model, engine, VARIATION_PROMPT, images[:1], None, size=size, n=n, steps=steps,
                             cfg_scale=cfg, seed=seed, endpoint="images/variations")


@router.post("/images/upscale", openapi_extra=json_body(UpscaleRequest))
async def upscale(request: Request) -> dict[str, Any]:
    svc: Services = request.app.state.services
    body = await json_object(request)
    if body.get("image") in (None, ""):
        raise APIError(400, "Missing 'image' field (base64 encoded)", code="missing_argument")
    model, engine = upscale_model(svc, body.get("model"))
    png = decode_base64_image(body["image"])
    return await upscale_image(svc, model, engine, png)
