"""Getting models onto disk and managing them: pull, downloads, variants, registry search, delete, updates.

The HTTP edge only: validation, response shapes and SSE framing. The work is in
`lemonade.downloads` (manager, hub, variant listing, search).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import StreamingResponse

from lemonade.api.errors import APIError, bad_request, registration_error
from lemonade.api.lemonade.protocol import DeleteRequest, DownloadControlRequest, PullRequest
from lemonade.catalog import collection_file
from lemonade.catalog.catalog import USER_PREFIX, RegistrationError
from lemonade.catalog.naming import reserved_problem
from lemonade.checkpoints.variants import parse_checkpoint
from lemonade.downloads import search as registry_search
from lemonade.downloads.hub import HubError, canonical_source, list_repo, read_small_file, split_repo_url
from lemonade.downloads.manager import hub_api_error, offline_error
from lemonade.downloads.plan import plan_model
from lemonade.downloads.variant_listing import collection_file_name, describe_collection, describe_repo
from lemonade.model_info import ModelInfo
from lemonade.runtime.options import OptionsError
from lemonade.services import Services
from lemonade.serving.models import delete_model, resolve

router = APIRouter(tags=["downloads"])

REGISTRATION_KEYS = ("checkpoint", "checkpoints", "recipe", "components", "models", "mmproj", "routing")
MAX_COLLECTION_FILE_BYTES = 5 * 1024 * 1024  # a collection file is a few KB; anything this big is not one
PROGRESS_EVENT_FIELDS = ("file", "file_index", "total_files", "bytes_downloaded", "bytes_total", "percent",
                         "total_download_size", "bytes_previously_downloaded")


def _services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def _source(svc: Services, body: dict[str, Any]) -> str | None:
    """Canonical `source`/`registry_source` of a request, None when neither is given."""
    values = []
    for key in ("source", "registry_source"):
        if body.get(key) is not None:
            try:
                values.append(canonical_source(body[key]))
            except ValueError as exc:
                raise registration_error(str(exc).replace("'source'", f"'{key}'")) from None
    if len(set(values)) > 1:
        raise registration_error("'source' and 'registry_source' name different registries; give one of them")
    return values[0] if values else None


def _normalise_checkpoints(body: dict[str, Any], source: str | None) -> str | None:
    """Turn registry URLs in `checkpoint`/`checkpoints` into `owner/repo[:variant]`; returns their registry."""
    url_source = None

    def fix(text: Any) -> Any:
        nonlocal url_source
        if not isinstance(text, str) or not text.startswith(("http://", "https://")):
            return text
        repo, found = split_repo_url(text)
        if source is not None and found != source:
            raise registration_error(f"Checkpoint URL '{text}' is on {found}, but 'source' is '{source}'")
        url_source = found
        return repo

    if "checkpoint" in body:
        body["checkpoint"] = fix(body["checkpoint"])
    if isinstance(body.get("checkpoints"), dict):
        body["checkpoints"] = {k: fix(v) for k, v in body["checkpoints"].items()}
    return url_source


def _recipe_options(svc: Services, model_name: str, recipe: str, raw: Any) -> dict[str, Any]:
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, dict):
        raise registration_error(f"Model '{model_name}': 'recipe_options' must be an object")
    try:
        return svc.options.parse_request(recipe, raw)
    except OptionsError as exc:
        raise registration_error(f"Model '{model_name}': {exc}") from None


async def _register(svc: Services, body: dict[str, Any], name: str, source: str | None) -> ModelInfo:
    """Validate (including against the registry), then store a `user.*` definition from a pull body."""
    reg = dict(body)
    reg["model_name"] = name
    url_source = _normalise_checkpoints(reg, source)
    reg["source"] = source or url_source or svc.config.get("default_model_source")
    if svc.offline:
        raise offline_error(f"register and download {name}")
    try:
        candidate = svc.catalog.validate_registration(reg)
    except RegistrationError as exc:
        raise registration_error(str(exc)) from None
    saved_options = _recipe_options(svc, name, candidate.recipe, body.get("recipe_options"))
    if not candidate.is_collection:
        try:  # a definition whose files do not exist is refused before anything is registered
            await asyncio.to_thread(plan_model, candidate, svc.catalog.hub_cache())
        except HubError as exc:
            raise hub_api_error(exc) from None
    embedded_new = [m for m in body.get("models") or [] if isinstance(m, dict)
                    and isinstance(m.get("model_name"), str) and svc.catalog.find(m["model_name"]) is None]
    try:
        model = svc.catalog.register(reg)
    except RegistrationError as exc:
        raise registration_error(str(exc)) from None
    if saved_options:
        svc.options.merge_saved(model.name, saved_options)
    for definition in embedded_new:  # components created from an exported file keep their options
        comp = svc.catalog.find(definition["model_name"]) or svc.catalog.find(USER_PREFIX + definition["model_name"])
        if comp is not None and isinstance(definition.get("recipe_options"), dict) and definition["recipe_options"]:
            svc.options.merge_saved(comp.name, _recipe_options(svc, comp.name, comp.recipe,
                                                               definition["recipe_options"]))
    return model


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _stream(first: dict[str, Any] | None, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    last = first
    try:
        if first is not None:
            yield _sse("progress", {k: first[k] for k in PROGRESS_EVENT_FIELDS if k in first})
            async for event in events:
                last = event
                yield _sse("progress", {k: event[k] for k in PROGRESS_EVENT_FIELDS if k in event})
        total = last["total_files"] if last else 0
        yield _sse("complete", {"file_index": total, "total_files": total, "percent": 100})
    except APIError as exc:
        yield _sse("error", {"error": exc.message, "code": exc.code})


@router.post("/pull")
async def pull(request: Request, req: PullRequest = Body(..., examples=[
        {"model_name": "Qwen3-0.6B-GGUF"},
        {"model_name": "user.Phi-4-Mini-GGUF", "checkpoint": "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M",
         "recipe": "llamacpp", "stream": True}])) -> Any:
    svc = _services(request)
    body = req.model_dump(exclude_unset=True)  # registration reads the definition as given
    body["model_name"] = name = req.model_name
    stream = bool(req.stream)
    subscribe = req.subscribe is not False
    upgrade = not req.do_not_upgrade
    source = _source(svc, body)
    existing = svc.catalog.find(name)
    registering = any(body.get(k) is not None for k in REGISTRATION_KEYS) and not (
        existing is not None and existing.origin in ("builtin", "extra"))
    if registering:
        problem = reserved_problem(name)
        if problem:
            raise registration_error(problem)
        model = await _register(svc, body, name, source)
    elif existing is None:
        unknown = APIError(404, f"Model {name} is not a known model. Register it by giving 'recipe' and "
                                f"'checkpoint' (as 'user.{name.removeprefix(USER_PREFIX)}'), or run `lemonade list` "
                                "to see model names.", type="not_found", code="model_not_found")
        if stream and not subscribe:  # a server-owned job reports through its state, as Lemonade's server does
            return svc.downloads.failed_job(name, unknown.message)
        raise unknown
    else:
        model = existing
    downloaded = svc.catalog.is_downloaded(model)
    if svc.offline and not downloaded:
        raise offline_error(f"download {model.public}")
    if stream and not subscribe:
        return svc.downloads.start_job(model)
    events = svc.downloads.pull_events(model, upgrade=upgrade)
    if stream:
        try:
            first = await events.__anext__()  # errors before any progress get a proper HTTP status
        except StopAsyncIteration:
            first = None
        return StreamingResponse(_stream(first, events), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    async for _event in events:
        pass
    # The message names the model as the request did (the spec's examples: `user.X` registered, a
    # built-in by its name); `model_name` is its public id, as /v1/models lists it.
    return {"status": "success", "message": f"Installed model: {name}", "model_name": model.public}


@router.get("/downloads")
async def downloads(request: Request) -> list[dict[str, Any]]:
    return _services(request).downloads.list_jobs()


@router.post("/downloads/control")
async def downloads_control(request: Request, body: DownloadControlRequest = Body(..., examples=[
        {"id": "model:Qwen3-0.6B-GGUF", "action": "pause"}])) -> dict[str, Any]:
    return _services(request).downloads.control(body.id, body.action)


@router.get("/registry/search")
async def registry_search_route(request: Request, query: str | None = Query(None), q: str | None = Query(None),
                                source: str | None = Query(None), limit: str | None = Query(None),
                                format: str | None = Query(None)) -> dict[str, Any]:  # noqa: A002 - spec name
    svc = _services(request)
    text = (query if query is not None else q or "").strip()
    if len(text) < 3:
        raise bad_request("'query' must be at least 3 characters long (after trimming); 'q' is accepted too"
                          if text else "Missing required query parameter 'query' (or 'q')")
    try:
        canonical = canonical_source(source)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    count = 12
    if limit is not None:
        try:
            count = int(limit)
        except ValueError:
            count = 0
        if not 1 <= count <= 50:
            raise bad_request(f"'limit' must be an integer from 1 to 50 (got {limit!r})")
    if format is not None and format != "gguf":
        raise bad_request(f"'format' must be 'gguf', the only supported value (got {format!r})")
    if svc.offline:
        raise offline_error(f"search {canonical}")
    try:
        return await registry_search.search(canonical, text, count, format == "gguf")
    except HubError as exc:
        status = 429 if exc.status == 429 else 502
        extra = {"upstream_status": exc.upstream_status} if exc.upstream_status else None
        raise APIError(status, exc.message, code="rate_limited" if status == 429 else "upstream_error",
                       extra=extra) from None


def _variants_refusal(message: str, status: int = 400) -> APIError:
    """A bad `/pull/variants` query or a repository the registry does not have: `{"error": "<message>"}`,
    the shape Lemonade's model manager reads."""
    return APIError(status, message, code="invalid_argument" if status == 400 else "checkpoint_not_found",
                    plain=True)


@router.get("/pull/variants")
async def pull_variants(request: Request, checkpoint: str | None = Query(None),
                        source: str | None = Query(None)) -> dict[str, Any]:
    svc = _services(request)
    if checkpoint is None or not checkpoint.strip():
        raise _variants_refusal("Missing required query parameter 'checkpoint' (a repository id like "
                                "'unsloth/Qwen3-8B-GGUF')")
    repo, url_source = split_repo_url(checkpoint.strip())
    try:
        requested = canonical_source(source) if source is not None else None
    except ValueError as exc:
        raise _variants_refusal(str(exc)) from None
    if requested and url_source and requested != url_source:
        raise _variants_refusal(f"The checkpoint URL uses {url_source}, but source was set to '{requested}'; "
                                "drop 'source' or give a repository id instead of the URL")
    try:
        ckpt = parse_checkpoint(repo)
    except ValueError as exc:
        raise _variants_refusal(f"Invalid value for 'checkpoint': {exc} (owner/name, e.g. "
                                "'unsloth/Qwen3-8B-GGUF')") from None
    if svc.offline:
        raise offline_error(f"list the variants of {ckpt.repo}")
    src = requested or url_source or svc.config.get("default_model_source")
    try:
        listing = await asyncio.to_thread(list_repo, src, ckpt.repo)
    except HubError as exc:  # a registry that cannot be reached is a 502 (or its 429), never our 500
        if exc.status == 404:  # worded as Lemonade's, which its model manager and tests look for
            registry = "ModelScope" if src == "modelscope" else "Hugging Face"
            private = "" if src == "modelscope" else " (or it is private: set HF_TOKEN for the server)"
            raise _variants_refusal(f"Checkpoint '{ckpt.repo}' not found on {registry}{private}", 404) from None
        raise APIError(exc.status, exc.message,
                       extra={"upstream_status": exc.upstream_status} if exc.upstream_status else None) from None
    manifest = collection_file_name(listing)
    if manifest is None:
        return describe_repo(listing, ckpt.repo)
    try:  # a shared collection: its file is read to check it is one, never stored (the pull fetches it)
        raw = await asyncio.to_thread(read_small_file, listing, manifest, MAX_COLLECTION_FILE_BYTES)
        found = collection_file.parse(raw, manifest)
    except HubError as exc:
        raise hub_api_error(exc) from None
    except collection_file.CollectionFileError as exc:
        raise _variants_refusal(f"Repository {ckpt.repo} holds {manifest}, but it is not a collection file "
                                f"Lemonade exports: {exc}") from None
    return describe_collection(listing, ckpt.repo, found["recipe"], found["components"], found["size"])


@router.post("/delete")
async def delete(request: Request, body: DeleteRequest = Body(..., examples=[
        {"model_name": "Qwen3-0.6B-GGUF"}])) -> dict[str, Any]:
    svc = _services(request)
    try:
        model = resolve(svc, body.model_name)
    except APIError as exc:
        if exc.status == 404:  # Lemonade's server answers an unknown name with 422 here (its app and tests rely on it)
            exc.status = 422
        raise
    if not await delete_model(svc, model):
        raise bad_request(f"Model {model.public} is not downloaded; there is nothing to delete",
                          code="model_not_downloaded")
    return {"status": "success", "message": f"Deleted model: {body.model_name}"}  # as the request names it


@router.post("/models/check-updates")
async def check_updates(request: Request) -> dict[str, Any]:
    svc = _services(request)
    found = [svc.catalog.find(name) for name in await svc.downloads.check_updates()]
    models = sorted(m.public for m in found if m is not None)
    return {"status": "success", "updates_available": len(models), "models": models}
