"""Text classification as a service: `/v1/classify` and the routing engine's classifier conditions.

One way in for every caller: `classify(svc, model, texts)` resolves the model (any accepted name;
it must be a `classification` model of an engine that serves `/classify`, i.e. the `onnxruntime`
recipe), loads it on demand through the router like any other request, and returns one
`{label: score}` per text (scores in [0, 1], highest first). Batches go to the engine in one request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.serving.models import check_model, engine_path, resolve

if TYPE_CHECKING:
    from lemonade.services import Services

ENDPOINT = "classify"


def loaded_classifier(svc: Services) -> ModelInfo:
    """The model to use when a request names none: the one classification model that is loaded."""
    loaded = [lm.model for lm in svc.router.models("classification") if ENDPOINT in lm.engine.endpoints]
    if len(loaded) != 1:
        which = (f"{len(loaded)} are loaded ({', '.join(m.public for m in loaded)})" if loaded
                 else "none is loaded")
        raise APIError(400, "Missing field 'model': it may be omitted only when exactly one classification model is "
                       f"loaded, and {which}. Name the classifier in 'model'.", code="missing_argument")
    return loaded[0]


def classifier(svc: Services, name: str | None) -> ModelInfo:
    """The classification model `name` names (or the loaded one); 4xx when it cannot classify."""
    if name is None:
        return loaded_classifier(svc)
    model = check_model(svc, resolve(svc, name), "classification", "/classify")
    engine_path(svc, model, ENDPOINT)
    return model


async def classify_with(svc: Services, model: ModelInfo, texts: list[str],
                        top_k: int | None = None) -> list[dict[str, float]]:
    """Scores of each text by an already resolved classifier (see `classify`)."""
    payload = {"texts": texts, "top_k": top_k}
    data = await svc.proxy.post_json(model, engine_path(svc, model, ENDPOINT), payload, ENDPOINT)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or len(results) != len(texts) or \
            not all(isinstance(r, dict) and isinstance(r.get("labels"), dict) for r in results):
        raise APIError(500, f"The classifier {model.public} returned an unexpected response", type="server_error",
                       code="backend_error")
    return [r["labels"] for r in results]


async def classify(svc: Services, model: str | None, texts: list[str],
                   top_k: int | None = None) -> list[dict[str, float]]:
    """Per-label scores of each of `texts` by the classifier `model` (None: the one loaded).

    Returns one `{label: score}` per text, in order, each sorted highest first (`top_k`: only the
    best k). Raises `APIError` (404 unknown model, 400 not a classifier / bad text, 5xx engine
    failure), which the routing engine may treat as "no decision".
    """
    return await classify_with(svc, classifier(svc, model), texts, top_k)
