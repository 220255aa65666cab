"""`POST /v1/systemone` (llamacpp-newer.md): typed questions about content, answered by a decision model.

The request is checked here in full before anything loads: the body, `state`, every question
(`type` choice / score / noul, `instructions`, `criteria` of the type's shape), `images` (data URLs)
and `ctx_size`, then the model: it must carry the `classification` and `systemone` labels, and its
engine must answer SystemOne questions (`"systemone"` in the engine description's endpoints).

What this build does: the llama.cpp engine it pins (llama-server b11312, from the llama-cpp-python
0.3.36 sdist) has no `/v1/systemone` route, so its description lists no such endpoint, and a valid
request for a decision model gets the spec's 400 "its backend does not answer SystemOne questions",
before any load. An engine whose description lists `systemone` would get the request forwarded
unchanged (options in their order); no engine of this build does, so that path is untested.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lemonade.api.body import json_object
from lemonade.api.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.services import Services
from lemonade.serving.models import engine_path, resolve

router = APIRouter(tags=["llama.cpp"])
ENDPOINT = "systemone"
LABELS = ("classification", "systemone")
TYPES = ("choice", "score", "noul")
MIN_LEVELS, MAX_LEVELS = 2, 10
QUESTION_KEYS = ("type", "instructions", "criteria")
TOP_KEYS = ("model", "state", "questions", "images", "ctx_size")


def _invalid(message: str) -> APIError:
    return APIError(400, message, code="invalid_argument")


def _missing(field: str, what: str) -> APIError:
    return APIError(400, f"Missing required field '{field}': {what}", code="missing_argument")


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def check_question(qid: str, question: Any) -> None:
    """One question of `questions`, by the shape its type gives; 400 naming the nested field."""
    at = f"questions.{qid}"
    if not isinstance(question, dict):
        raise _invalid(f"Invalid value for '{at}': a question is an object with 'type', 'instructions' and "
                       f"'criteria', got {_json_type(question)}")
    unknown = sorted(set(question) - set(QUESTION_KEYS))
    if unknown:
        raise _invalid(f"Invalid value for '{at}': unknown field(s) {', '.join(unknown)} (a question has "
                       f"{', '.join(QUESTION_KEYS)})")
    if "type" not in question:
        raise _missing(f"{at}.type", f"one of {', '.join(TYPES)}")
    kind = question["type"]
    if kind not in TYPES:
        raise _invalid(f"Invalid value for '{at}.type': {kind!r} is not a question type (one of {', '.join(TYPES)})")
    if "instructions" not in question:
        raise _missing(f"{at}.instructions", "the question to ask about the state")
    if not isinstance(question["instructions"], str) or not question["instructions"].strip():
        raise _invalid(f"Invalid value for '{at}.instructions': a non-empty string is required, got "
                       f"{_json_type(question['instructions'])}")
    criteria = question.get("criteria")
    if kind == "choice":
        if "criteria" not in question:
            raise _missing(f"{at}.criteria", "an object mapping each option to a description or null")
        if not isinstance(criteria, dict) or not criteria:
            raise _invalid(f"Invalid value for '{at}.criteria': a 'choice' question needs an object mapping each "
                           f"option to a description or null, got {_json_type(criteria)}")
        for option, text in criteria.items():
            if not option.strip():
                raise _invalid(f"Invalid value for '{at}.criteria': an option name is empty")
            if text is not None and not isinstance(text, str):
                raise _invalid(f"Invalid value for '{at}.criteria.{option}': a description (string) or null, got "
                               f"{_json_type(text)}")
    elif kind == "score":
        if "criteria" not in question:
            raise _missing(f"{at}.criteria", f"an array of {MIN_LEVELS} to {MAX_LEVELS} levels, lowest first")
        if not isinstance(criteria, list) or not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
            got = f"{len(criteria)} levels" if isinstance(criteria, list) else _json_type(criteria)
            raise _invalid(f"Invalid value for '{at}.criteria': a 'score' question needs an array of {MIN_LEVELS} to "
                           f"{MAX_LEVELS} levels, lowest first; got {got}")
        for i, level in enumerate(criteria):
            if not isinstance(level, str) or not level.strip():
                raise _invalid(f"Invalid value for '{at}.criteria[{i}]': a level is a non-empty string, got "
                               f"{_json_type(level)}")
    elif criteria is not None:  # noul: optional true / false descriptions
        if not isinstance(criteria, dict):
            raise _invalid(f"Invalid value for '{at}.criteria': a 'noul' question takes an object with optional "
                           f"'true' and 'false' descriptions, got {_json_type(criteria)}")
        for key, text in criteria.items():
            if key not in ("true", "false"):
                raise _invalid(f"Invalid value for '{at}.criteria': unknown key '{key}' (only 'true' and 'false')")
            if text is not None and not isinstance(text, str):
                raise _invalid(f"Invalid value for '{at}.criteria.{key}': a description (string) or null, got "
                               f"{_json_type(text)}")


def check_request(body: dict[str, Any]) -> None:
    """Everything the spec's schema says about the body, before a model is looked at."""
    unknown = sorted(set(body) - set(TOP_KEYS))
    if unknown:
        raise _invalid(f"Unknown field(s) {', '.join(unknown)}: the request takes {', '.join(TOP_KEYS)}")
    if "model" in body and body["model"] is not None and (not isinstance(body["model"], str) or not body["model"]):
        raise _invalid(f"Invalid value for 'model': a model name (string), got {_json_type(body['model'])}")
    if "state" not in body:
        raise _missing("state", "the content to judge (a string, any JSON value, or null to ask about images only)")
    if "questions" not in body:
        raise _missing("questions", "an object mapping each question id to a question")
    questions = body["questions"]
    if not isinstance(questions, dict) or not questions:
        raise _invalid("Invalid value for 'questions': an object mapping each question id to a question is "
                       f"required, got {_json_type(questions) if questions != {} else 'an empty object'}")
    for qid, question in questions.items():
        if not qid.strip():
            raise _invalid("Invalid value for 'questions': a question id is empty")
        check_question(qid, question)
    images = body.get("images")
    if images is not None:
        if not isinstance(images, list):
            raise _invalid(f"Invalid value for 'images': an array of data URLs, got {_json_type(images)}")
        for i, url in enumerate(images):
            if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
                raise _invalid(f"Invalid value for 'images[{i}]': an image as a data URL "
                               "(data:image/png;base64,...) is required")
    if body["state"] is None and not images:
        raise _invalid("Invalid value for 'state': null asks about the images only, and no 'images' are given")
    ctx = body.get("ctx_size")
    if ctx is not None and (not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < -1 or ctx == 0):
        raise _invalid(f"Invalid value for 'ctx_size': a positive number of tokens, or -1 (automatic); got {ctx!r}")


def decision_model(svc: Services, name: str | None) -> ModelInfo:
    """The model to ask: named, or the one classification model loaded; checked before it loads."""
    if name is None:
        loaded = [lm.model for lm in svc.router.models("classification")]
        if len(loaded) != 1:
            which = f"{len(loaded)} are loaded" if loaded else "none is loaded"
            raise APIError(400, "Missing field 'model': it may be omitted only when exactly one classification model "
                           f"is loaded, and {which}. Name the decision model in 'model'.", code="missing_argument")
        model = loaded[0]
    else:
        model = resolve(svc, name)
    missing = [label for label in LABELS if label not in model.labels]
    if model.is_collection or missing:
        raise APIError(400, f"Model {model.public} cannot answer SystemOne questions: it lacks the "
                       f"{' and '.join(repr(m) for m in missing) or 'classification'} label(s). Only a decision model "
                       "registered with the labels 'classification' and 'systemone' serves /systemone.",
                       code="invalid_argument")
    engine = svc.engines.get(model.recipe)
    if engine is None or not engine.available or ENDPOINT not in engine.endpoints:
        raise APIError(400, f"Model {model.public} cannot answer SystemOne questions: its backend (recipe "
                       f"'{model.recipe}') does not answer them in this server (the engine build it pins has no "
                       "SystemOne endpoint).", code="model_load_refused")
    return model


EXAMPLE = {"model": "Laya-GGUF", "state": "Customer message: I was charged twice for my order.",
           "questions": {"route": {"type": "choice", "instructions": "Which team should handle this?",
                                   "criteria": {"billing": None, "shipping": None, "technical": None}},
                         "angry": {"type": "noul", "instructions": "Is the customer angry?"}}}


@router.post("/systemone", openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "object", "required": ["state", "questions"]}, "example": EXAMPLE}}}})
async def systemone(request: Request) -> Any:
    """One answer per question, from a decision model (no tokens generated)."""
    svc: Services = request.app.state.services
    body = await json_object(request)
    check_request(body)
    model = decision_model(svc, body.get("model"))
    if body.get("ctx_size") is not None and svc.router.resident(model.name) is None:
        options = svc.options.resolve(model.name, model.recipe, request={"ctx_size": body["ctx_size"]})
        await svc.router.ensure_loaded(model, options)
    payload = {**{k: v for k, v in body.items() if k != "ctx_size"}, "model": model.public}
    return await svc.proxy.post_json(model, engine_path(svc, model, ENDPOINT), payload, ENDPOINT)
