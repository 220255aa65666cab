"""Anthropic's Messages API: `POST /v1/messages` (and `/v1/messages/count_tokens`), under every prefix.

A translation layer over the OpenAI chat path, not a second implementation: the request becomes a
chat completion for the same router and proxy (auto-load, residency, stats and metrics behave as
for `/v1/chat/completions`), and the answer or stream is re-shaped into Anthropic's format.
llama-server has a native `/v1/messages` too; translating here instead keeps validation, warnings
and error shapes ours, and works for any engine that speaks OpenAI chat. Query parameters such as
`?beta=true` are accepted and ignored. Ignored fields are listed in the `x-lemonade-warning`
header and logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lemonade.api.anthropic import translate
from lemonade.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from lemonade.api.relay import response
from lemonade.runtime import forced_call
from lemonade.services import Services
from lemonade.serving.chat import CHAT_PATH, ENDPOINT, answer, chat_model, forcing
from lemonade.serving.models import check_model, resolve

log = logging.getLogger("lemonade.anthropic")
router = APIRouter(tags=["anthropic"])
WARNING_HEADER = "x-lemonade-warning"


def warning_header(warnings: list[str]) -> dict[str, str]:
    """The warnings as one header value (latin-1 safe, one line), or no header."""
    if not warnings:
        return {}
    text = " | ".join(warnings)
    return {WARNING_HEADER: re.sub(r"[^\x20-\x7e]", "?", text)[:4000]}


def _log_warnings(model: str, warnings: list[str]) -> None:
    if warnings:
        log.warning("/v1/messages (%s): %s", model, "; ".join(warnings))


@router.post("/messages")
async def messages(request: Request, body: MessagesRequest) -> Response:
    svc: Services = request.app.state.services
    model = resolve(svc, body.model)
    tr = translate.to_openai(body, model.name)
    images = any(isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
                 for m in tr.body["messages"])
    model = check_model(svc, model, "chat", "/messages", images=images)  # or the same model on a peer
    _log_warnings(model.name, tr.warnings)
    headers = warning_header(tr.warnings)
    sent, name = forcing(tr.body)  # tool_choice {type: tool}: the call is forced (runtime/forced_call.py)
    if body.stream:
        payload = {**sent, "stream": True, "stream_options": {"include_usage": True}}

        def transform(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            if name is not None:
                source = forced_call.as_call_stream(name)(source)
            return translate.anthropic_stream(source, body.model, tr)

        return response(await svc.proxy.stream(model, CHAT_PATH, payload, ENDPOINT, transform=transform), headers)
    data = await answer(svc, model, sent, name)
    return JSONResponse(translate.to_anthropic(data, body.model, tr), headers=headers)


@router.post("/messages/count_tokens")
async def count_tokens(request: Request, body: CountTokensRequest) -> Response:
    """Tokens of the prompt the model would see: the chat template applied, then tokenized by the engine."""
    svc: Services = request.app.state.services
    model = chat_model(svc, body.model, "/messages/count_tokens")
    tr = translate.to_openai(body, model.name)
    _log_warnings(model.name, tr.warnings)
    proxy = svc.proxy
    template_body: dict[str, Any] = {k: v for k, v in tr.body.items() if k in ("messages", "tools", "tool_choice",
                                                                                 "chat_template_kwargs")}
    if not isinstance(template_body.get("tool_choice"), str):  # a named tool: llama-server takes strings only
        template_body.pop("tool_choice", None)
    applied = await proxy.post_json(model, "/apply-template", template_body, "apply-template")
    tokens = await proxy.post_json(model, "/tokenize", {"content": applied.get("prompt", ""), "add_special": False,
                                                        "parse_special": True}, "tokenize")
    return JSONResponse({"input_tokens": len(tokens.get("tokens") or [])}, headers=warning_header(tr.warnings))
