"""OpenAI inference endpoints: chat, completions, embeddings, responses.

Each validates its body, resolves the model (auto-loading it), checks that the model's
deployment mode serves this endpoint, and hands the request to the engine through the proxy.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lemonade.api.errors import APIError
from lemonade.api.openai import omni_chat, routing
from lemonade.api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ResponsesRequest,
    legacy_max_tokens,
    thinking_controls,
)
from lemonade.api.relay import response
from lemonade.api.sse import drop_null_events
from lemonade.model_info import ModelInfo
from lemonade.omni.definitions import OMNI_RECIPE
from lemonade.runtime import forced_call
from lemonade.runtime.proxy import Proxy
from lemonade.services import Services
from lemonade.serving.chat import CHAT_PATH, ENDPOINT, answer, auto_load, forcing
from lemonade.serving.models import check_model, resolve

router = APIRouter(tags=["openai"])


def proxy(request: Request) -> Proxy:
    return request.app.state.services.proxy


async def relay(request: Request, model: ModelInfo, path: str, body: dict[str, Any], stream: bool,
                endpoint: str) -> Response:
    p = proxy(request)
    relayed = await p.stream(model, path, body, endpoint) if stream else await p.forward(model, path, body, endpoint)
    return response(relayed)


def has_image_parts(body: ChatCompletionRequest) -> bool:
    return any(isinstance(m.content, list) and any(p.get("type") in ("image_url", "input_image") for p in m.content)
               for m in body.messages)


@router.post("/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    svc: Services = request.app.state.services
    target = resolve(svc, body.model)
    if target.recipe == OMNI_RECIPE:  # the server-side tool loop (openai.md "Server-side tools")
        return await omni_chat.chat(svc, target, body)
    payload = body.model_dump(exclude_unset=True)
    # a collection.router model: its policy picks the member that answers
    return await routing.answered(svc, target, payload,
                                  lambda model: chat_completions_of(request, model, body, payload))


async def chat_completions_of(request: Request, target: ModelInfo, body: ChatCompletionRequest,
                              payload: dict[str, Any]) -> Response:
    svc: Services = request.app.state.services
    model = check_model(svc, target, "chat", "/chat/completions", images=has_image_parts(body))
    legacy_max_tokens(payload)
    thinking_controls(payload)
    await auto_load(svc, model, payload)
    sent, name = forcing(payload)
    if name is not None:  # a named tool: asked for under a grammar, answered as its call (runtime/forced_call.py)
        if body.stream:
            return response(await proxy(request).stream(model, CHAT_PATH, sent, ENDPOINT,
                                                        transform=forced_call.as_call_stream(name)))
        return JSONResponse(await answer(svc, model, sent, name))
    return await relay(request, model, CHAT_PATH, payload, body.stream, ENDPOINT)


@router.post("/completions")
async def completions(request: Request, body: CompletionRequest) -> Response:
    svc: Services = request.app.state.services
    payload = body.model_dump(exclude_unset=True)
    return await routing.answered(svc, resolve(svc, body.model), payload,
                                  lambda model: completions_of(request, model, body, payload))


async def completions_of(request: Request, target: ModelInfo, body: CompletionRequest,
                         payload: dict[str, Any]) -> Response:
    svc: Services = request.app.state.services
    model = check_model(svc, target, "chat", "/completions")
    await auto_load(svc, model, payload)
    if body.stream and body.logprobs:
        raise APIError(400, "'logprobs' is only available with stream=false", code="invalid_argument")
    if payload.pop("echo", False) and not body.stream:
        # llama-server does not echo; the prompt is put in front of each choice's text here.
        data = await proxy(request).post_json(model, "/v1/completions", payload, "completions")
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        for choice in data.get("choices", []):
            prompt = prompts[choice.get("index", 0)] if choice.get("index", 0) < len(prompts) else ""
            if isinstance(prompt, str):
                choice["text"] = prompt + choice.get("text", "")
        return JSONResponse(data)
    if body.stream and not isinstance(body.prompt, str):
        return response(await proxy(request).stream(model, "/v1/completions", payload, "completions",
                                                    transform=drop_null_events))
    return await relay(request, model, "/v1/completions", payload, body.stream, "completions")


@router.post("/embeddings")
async def embeddings(request: Request, body: EmbeddingRequest) -> Response:
    svc: Services = request.app.state.services
    model = check_model(svc, resolve(svc, body.model), "embeddings", "/embeddings")
    return await relay(request, model, "/v1/embeddings", body.model_dump(exclude_unset=True), False, "embeddings")


@router.post("/responses")
async def responses(request: Request, body: ResponsesRequest) -> Response:
    svc: Services = request.app.state.services
    payload = body.model_dump(exclude_unset=True)
    return await routing.answered(svc, resolve(svc, body.model), payload,
                                  lambda model: relay(request, check_model(svc, model, "chat", "/responses"),
                                                      "/v1/responses", payload, body.stream, "responses"))
