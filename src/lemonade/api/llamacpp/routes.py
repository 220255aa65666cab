"""llama.cpp-specific endpoints (llamacpp-newer.md): rerank, tokenize, slots.

Rerank goes to the model it names; tokenize (when it names none) and slots go to the most
recently used loaded model, which must be a llama.cpp model.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.body import parse_body
from lemonade.api.errors import APIError
from lemonade.runtime.router import LoadedModel
from lemonade.services import Services
from lemonade.serving.models import check_model, engine_path, resolve

router = APIRouter(tags=["llama.cpp"])


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(..., min_length=1, examples=["bge-reranker-v2-m3-GGUF"])
    query: str
    documents: list[str] = Field(..., min_length=1)
    top_n: int | None = Field(None, ge=1)
    ctx_size: int | None = Field(None, description="Context size to load the model with, when this request "
                                                    "loads it", ge=-1)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    content: str
    model: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class SlotActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    filename: str | None = None


def _llamacpp_target(svc: Services, endpoint: str) -> LoadedModel:
    """The most recently used loaded model, which must serve `endpoint` (a llama.cpp model)."""
    lm = svc.router.most_recent()
    if lm is None:
        raise APIError(400, "No model is loaded. Load a llama.cpp model first (POST /v1/load or any chat request).",
                       code="no_model_loaded")
    if endpoint not in lm.engine.endpoints:
        raise APIError(400, f"The most recently used model {lm.model.public} is not a llama.cpp model",
                       code="invalid_argument")
    return lm


async def rerank(request: Request, body: RerankRequest) -> dict[str, Any]:
    svc: Services = request.app.state.services
    model = check_model(svc, resolve(svc, body.model), "reranking", "/rerank")
    engine_path(svc, model, "rerank")
    payload = body.model_dump(exclude_unset=True, exclude={"ctx_size"})
    p = svc.proxy
    if body.ctx_size is not None and svc.router.resident(model.name) is None:
        options = svc.options.resolve(model.name, model.recipe, request={"ctx_size": body.ctx_size})
        await svc.router.ensure_loaded(model, options)
    data = await p.post_json(model, "/v1/rerank", payload, "rerank")
    # llama-server ranks by score (and `top_n` keeps the best); the spec answers in input order,
    # since clients index the results by position (api-llamacpp.md).
    results = sorted(data.get("results", []), key=lambda r: r.get("index", 0))
    return {"model": model.public, "object": "list", "results": results, "usage": data.get("usage", {})}


for _path in ("/rerank", "/reranking", "/reranker"):
    router.add_api_route(_path, rerank, methods=["POST"], name=f"rerank{_path.replace('/', '_')}")


@router.post("/tokenize")
async def tokenize(request: Request, body: TokenizeRequest) -> Any:
    svc: Services = request.app.state.services
    payload = body.model_dump(exclude={"model"})
    p = svc.proxy
    if body.model:
        model = resolve(svc, body.model)
        return await p.post_json(model, engine_path(svc, model, "tokenize"), payload, "tokenize")
    lm = _llamacpp_target(svc, "tokenize")
    return await p.post_json(lm.model, "/tokenize", payload, "tokenize", lm=lm)


@router.get("/slots")
async def slots(request: Request) -> Any:
    svc: Services = request.app.state.services
    return await svc.proxy.get_json(_llamacpp_target(svc, "slots"), "/slots")


@router.post("/slots/{slot_id}")
async def slot_action(request: Request, slot_id: int,
                      action: Literal["save", "restore", "erase"] = Query(...)) -> Any:
    svc: Services = request.app.state.services
    if not 0 <= slot_id <= 2**31 - 1:
        raise APIError(400, f"Slot id {slot_id} is out of range (0 to 2147483647)", code="invalid_argument")
    body = await parse_body(request, SlotActionRequest)
    if action in ("save", "restore") and not body.filename:
        raise APIError(400, f"Missing required field 'filename' for action '{action}'", code="missing_argument")
    lm = _llamacpp_target(svc, "slots")
    payload = {"filename": body.filename} if body.filename else {}
    return await svc.proxy.post_json(lm.model, f"/slots/{slot_id}?action={action}", payload, "slots", lm=lm)
