"""The Ollama API at `/api/*`: a translation layer over our router and llama-server's OpenAI endpoints.

Chat and generate go to `/v1/chat/completions` (or `/v1/completions` for `raw` prompts), embeddings
to `/v1/embeddings`; model management (tags, show, ps, pull, delete) is in management.py. Streams are
re-shaped event by event into NDJSON, never buffered. Errors are `{"error": "..."}` (the error
handler picks Ollama's shape from the `/api/` path). Serve on port 11434 (`lemonade serve --port
11434`) and Ollama-only apps find the server where they look for Ollama.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lemonade.api.body import parse_body
from lemonade.api.errors import APIError
from lemonade.api.ollama import management
from lemonade.api.ollama import models as om
from lemonade.api.ollama import translate as tr
from lemonade.api.ollama.protocol import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    KeepAlive,
    Options,
)
from lemonade.api.openapi import json_body
from lemonade.api.relay import response
from lemonade.model_info import ModelInfo
from lemonade.route_table import OLLAMA_PREFIX
from lemonade.runtime.proxy import Relay
from lemonade.services import Services
from lemonade.serving import images
from lemonade.serving.load import load_for_request
from lemonade.serving.models import accepts_images, check_model

log = logging.getLogger("lemonade.ollama")
router = APIRouter(prefix=OLLAMA_PREFIX, tags=["ollama"])

router.include_router(management.router)
NDJSON = "application/x-ndjson"


def _svc(request: Request) -> Services:
    return request.app.state.services


def _unloads(keep_alive: KeepAlive) -> bool:
    """Ollama's `keep_alive: 0` (also "0", "0s", "0m") means: unload now."""
    if isinstance(keep_alive, (int, float)) and not isinstance(keep_alive, bool):
        return keep_alive == 0
    return isinstance(keep_alive, str) and keep_alive.strip() in ("0", "0s", "0m", "0h")


OLLAMA_ENDPOINTS = {"chat": "/api/chat or /api/generate", "embeddings": "/api/embed"}


def _chat_model(svc: Services, name: str, endpoint: str) -> ModelInfo:
    return check_model(svc, om.resolve(svc, name), "chat", endpoint, hint=OLLAMA_ENDPOINTS)


def _require_vision(svc: Services, model: ModelInfo, where: str) -> None:
    if not accepts_images(svc, model):
        raise APIError(400, f"Invalid value for '{where}': model {model.public} does not accept images (it has no "
                       "vision projector); use a vision model", code="invalid_argument")


async def _load(svc: Services, model: ModelInfo, options: Options | None, timer: tr.Timer) -> None:
    """Load the model unless it is resident, timing it (load_duration); `num_ctx` applies to this load."""
    if svc.router.resident(model.name) is not None:
        return
    request = {"ctx_size": options.num_ctx} if options is not None and options.num_ctx else {}
    start = time.perf_counter_ns()
    if request:
        await load_for_request(svc, model, request)
    else:
        await svc.router.ensure_loaded(model, lambda: svc.options.resolve(model.name, model.recipe))
    timer.load_ns = time.perf_counter_ns() - start


def _residency_reply(model_name: str, reason: str, chat: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model_name, "created_at": tr.now_iso()}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body.update({"done": True, "done_reason": reason})
    return body


# ----- chat and generate ---------------------------------------------------------------------------

@router.post("/chat", openapi_extra=json_body(ChatRequest))
async def chat(request: Request) -> Response:
    body = await parse_body(request, ChatRequest)
    svc = _svc(request)
    timer = tr.Timer()
    model = _chat_model(svc, body.model, "/api/chat")
    if not body.messages:
        # Ollama's convention: no messages loads the model, or unloads it with keep_alive 0.
        if _unloads(body.keep_alive):
            await om.unload(svc, model)
            return JSONResponse(_residency_reply(body.model, "unload", chat=True))
        await _load(svc, model, body.options, timer)
        return JSONResponse(_residency_reply(body.model, "load", chat=True))
    payload: dict[str, Any] = {"model": model.name, "messages": tr.openai_messages(body.messages),
                               **tr.sampling_params(body.options), **tr.format_params(body.format),
                               **tr.think_params(body.think)}
    for i, msg in enumerate(body.messages):
        if msg.images:
            _require_vision(svc, model, f"messages.{i}.images")
    if body.tools:
        payload["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
    return await _run(svc, model, body.model, payload, body.options, body.stream, timer, "chat",
                      unload_after=_unloads(body.keep_alive))


@router.post("/generate", openapi_extra=json_body(GenerateRequest))
async def generate(request: Request) -> Response:
    body = await parse_body(request, GenerateRequest)
    svc = _svc(request)
    timer = tr.Timer()
    model = om.resolve(svc, body.model)
    if model.mode == "image":
        return await _generate_image(svc, model, body)
    model = _chat_model(svc, body.model, "/api/generate")
    if body.suffix:
        raise APIError(400, "Invalid value for 'suffix': fill-in-the-middle is not supported by this server",
                       code="invalid_argument")
    if not body.prompt and not body.images:
        if _unloads(body.keep_alive):
            await om.unload(svc, model)
            return JSONResponse(_residency_reply(body.model, "unload", chat=False))
        await _load(svc, model, body.options, timer)
        return JSONResponse(_residency_reply(body.model, "load", chat=False))
    for field in ("template", "context"):
        if getattr(body, field) is not None:
            log.warning("/api/generate: ignoring '%s' (not supported; the model's own chat template is used)", field)
    params = {**tr.sampling_params(body.options), **tr.format_params(body.format)}
    if body.raw:
        if body.images:
            raise APIError(400, "Invalid value for 'images': images need raw=false (they go through the chat "
                           "template)", code="invalid_argument")
        payload = {"model": model.name, "prompt": body.prompt, **params}
        kind = "generate-raw"
    else:
        messages: list[dict[str, Any]] = []
        if body.system:
            messages.append({"role": "system", "content": body.system})
        messages.append({"role": "user", "content": tr.user_content(body.prompt, body.images, "images")})
        if body.images:
            _require_vision(svc, model, "images")
        payload = {"model": model.name, "messages": messages, **params, **tr.think_params(body.think)}
        kind = "generate-chat"
    return await _run(svc, model, body.model, payload, body.options, body.stream, timer, kind,
                      unload_after=_unloads(body.keep_alive))


async def _run(svc: Services, model: ModelInfo, reply_name: str, payload: dict[str, Any], options: Options | None,
               stream: bool, timer: tr.Timer, kind: str, unload_after: bool) -> Response:
    """Send a translated request to the engine and shape the answer (NDJSON stream or one object)."""
    path, endpoint = (("/v1/completions", "completions") if kind == "generate-raw"
                      else ("/v1/chat/completions", "chat/completions"))
    await _load(svc, model, options, timer)
    proxy = svc.proxy
    if stream:
        payload = {**payload, "stream": True, "stream_options": {"include_usage": True}}

        def transform(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            return tr.ndjson_stream(source, reply_name, timer, kind)

        relay = await proxy.stream(model, path, payload, endpoint, transform=transform, media_type=NDJSON)
        if unload_after:
            _unload_when_done(relay, svc, model)
        return response(relay)
    data = await proxy.post_json(model, path, payload, endpoint)
    if unload_after:
        await om.unload(svc, model)
    if kind == "chat":
        return JSONResponse(tr.chat_response(reply_name, data, timer))
    return JSONResponse(tr.generate_response(reply_name, data, timer, chat=kind == "generate-chat"))


def _unload_when_done(relay: Relay, svc: Services, model: ModelInfo) -> None:
    """`keep_alive: 0` on a streamed request: unload once the response (and its cleanup) has finished."""
    cleanup = relay.after

    async def after() -> None:
        if cleanup is not None:
            await cleanup()
        await om.unload(svc, model)

    relay.after = after


async def _generate_image(svc: Services, model: ModelInfo, body: GenerateRequest) -> Response:
    """`/api/generate` on an image model: one image, returned base64 in `image` (Ollama's field)."""
    check_model(svc, model, "image", "/api/generate")
    if not body.prompt:
        raise APIError(400, "Missing required field 'prompt'", code="missing_argument")
    timer = tr.Timer()
    opts = body.options.model_dump(exclude_none=True) if body.options else {}
    width = body.width or opts.get("width") or 512
    height = body.height or opts.get("height") or 512
    model, engine = images.image_model(svc, model.public, "/api/generate")
    size = images.parse_size(f"{width}x{height}", (512, 512))
    await _load(svc, model, None, timer)
    data = await images.generate_images(svc, model, engine, body.prompt, size=size,
                                        steps=images.parse_steps(body.steps or opts.get("steps")),
                                        cfg_scale=images.parse_cfg_scale(opts.get("cfg_scale")),
                                        seed=images.parse_seed(opts.get("seed")))
    image = data["data"][0]["b64_json"]
    return JSONResponse({"model": body.model, "created_at": tr.now_iso(), "response": "", "image": image,
                         "done": True, "done_reason": "stop", "total_duration": timer.total(),
                         "load_duration": timer.load_ns})


# ----- embeddings ----------------------------------------------------------------------------------

def _embedding_model(svc: Services, name: str, endpoint: str) -> ModelInfo:
    return check_model(svc, om.resolve(svc, name), "embeddings", endpoint, hint=OLLAMA_ENDPOINTS)


def _truncate(vector: list[float], dimensions: int | None) -> list[float]:
    """Keep the first `dimensions` values, re-normalised (what Ollama's `dimensions` does)."""
    if not dimensions or dimensions >= len(vector):
        return vector
    cut = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in cut)) or 1.0
    return [v / norm for v in cut]


@router.post("/embed", openapi_extra=json_body(EmbedRequest))
async def embed(request: Request) -> dict[str, Any]:
    body = await parse_body(request, EmbedRequest)
    svc = _svc(request)
    timer = tr.Timer()
    model = _embedding_model(svc, body.model, "/api/embed")
    inputs = [body.input] if isinstance(body.input, str) else list(body.input)
    await _load(svc, model, body.options, timer)
    if not inputs:
        return {"model": body.model, "embeddings": [], "total_duration": timer.total(),
                "load_duration": timer.load_ns, "prompt_eval_count": 0}
    data = await svc.proxy.post_json(model, "/v1/embeddings", {"model": model.name, "input": inputs}, "embeddings")
    rows = sorted(data.get("data") or [], key=lambda d: d.get("index", 0))
    usage = data.get("usage") or {}
    result = {"model": body.model, "embeddings": [_truncate(r.get("embedding") or [], body.dimensions) for r in rows],
              "total_duration": timer.total(), "load_duration": timer.load_ns,
              "prompt_eval_count": int(usage.get("prompt_tokens") or 0)}
    if _unloads(body.keep_alive):
        await om.unload(svc, model)
    return result


@router.post("/embeddings", openapi_extra=json_body(EmbeddingsRequest))
async def embeddings(request: Request) -> dict[str, Any]:
    """The legacy endpoint: one `prompt`, one `embedding`."""
    body = await parse_body(request, EmbeddingsRequest)
    svc = _svc(request)
    timer = tr.Timer()
    model = _embedding_model(svc, body.model, "/api/embeddings")
    await _load(svc, model, body.options, timer)
    if not body.prompt:
        return {"embedding": []}
    data = await svc.proxy.post_json(model, "/v1/embeddings", {"model": model.name, "input": body.prompt},
                                      "embeddings")
    return {"embedding": ((data.get("data") or [{}])[0]).get("embedding") or []}
