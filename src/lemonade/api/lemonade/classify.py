"""`POST /v1/classify` (api-lemonade.md): label scores of an encoder text classifier.

Every malformed request is refused with a 400 naming the field before any model is loaded.
`input` (alias `text`) is one string, answered as the spec shows (`labels`), or, as an extension, a
list of strings, answered with one entry per text in `data` (like OpenAI's embeddings list):
`{"object": "list", "model", "data": [{"object": "classification", "index", "labels"}]}`. `model`
may be omitted while exactly one classification model is loaded. The work is
`serving/classification.py`, which the routing engine calls too.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.errors import APIError
from lemonade.services import Services
from lemonade.serving.classification import classifier, classify_with

router = APIRouter(tags=["lemonade"])
MAX_TOP_K = 1_000_000


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = Field(None, min_length=1, description="An onnxruntime classification model; optional while "
                                                              "exactly one classification model is loaded")
    input: str | list[str] | None = Field(None, description="The text to classify, or a list of texts (a batch)")
    text: str | list[str] | None = Field(None, description="Alias of 'input'")
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K, description="Return only the k highest-scoring labels")


def _texts(body: ClassifyRequest) -> tuple[list[str], bool]:
    """The texts to classify and whether the request was a batch."""
    if body.input is not None and body.text is not None:
        raise APIError(400, "Give the text in 'input' or in its alias 'text', not both", code="invalid_argument")
    field, value = ("input", body.input) if body.input is not None else ("text", body.text)
    if value is None:
        raise APIError(400, "Missing required field 'input' (or its alias 'text'): the text to classify",
                       code="missing_argument")
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise APIError(400, f"Invalid value for '{field}': the list of texts is empty", code="invalid_argument")
    for i, text in enumerate(texts):
        if not text.strip():
            where = f"'{field}'" if isinstance(value, str) else f"'{field}[{i}]'"
            raise APIError(400, f"Invalid value for {where}: the text to classify is empty", code="invalid_argument")
    return texts, not isinstance(value, str)


@router.post("/classify")
async def classify(request: Request, body: ClassifyRequest = Body(..., examples=[
        {"model": "Phishing-Email-Detection-ONNX", "input": "Please verify your account now."}])) -> dict[str, Any]:
    """Per-label scores in [0, 1] of the text (`labels`), or of each text of a list (`data`)."""
    svc: Services = request.app.state.services
    texts, batch = _texts(body)
    model = classifier(svc, body.model)
    results = await classify_with(svc, model, texts, body.top_k)
    if not batch:
        return {"object": "classification", "model": model.public, "labels": results[0]}
    return {"object": "list", "model": model.public,
            "data": [{"object": "classification", "index": i, "labels": labels} for i, labels in enumerate(results)]}
