"""Ollama's model management: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, `/api/pull`,
`/api/delete`, and 501 for what Lemonade does not do (`/api/create`, `/api/copy`, `/api/push`).

Pulls and deletes go through the server's download manager (`svc.downloads`), so they behave like
`lemonade pull` / `POST /v1/delete`; pull progress is re-shaped into Ollama's NDJSON statuses.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lemonade import __version__
from lemonade.api.body import parse_body
from lemonade.api.errors import APIError
from lemonade.api.ollama import models as om
from lemonade.api.ollama import translate as tr
from lemonade.api.ollama.protocol import NamedRequest, PullRequest, ShowRequest
from lemonade.api.openapi import json_body
from lemonade.model_info import ModelInfo
from lemonade.services import Services
from lemonade.serving.models import delete_model

log = logging.getLogger("lemonade.ollama")
router = APIRouter()

# The Ollama release whose API this layer follows; some apps check it before using newer features.
OLLAMA_COMPAT_VERSION = "0.16.1"
NDJSON = "application/x-ndjson"


def _svc(request: Request) -> Services:
    return request.app.state.services


# ----- models --------------------------------------------------------------------------------------

@router.get("/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Downloaded models (the ones a client can use without a pull)."""
    svc = _svc(request)
    entries = []
    for model in svc.catalog.all():
        if model.is_collection:  # listed once all its components are (under its `user.` id, as Lemonade does)
            if svc.catalog.is_downloaded(model):
                entries.append(om.tags_entry(svc, model, om.collection_files(svc, model)))
            continue
        files = svc.catalog.local_files(model)
        if files is not None:
            entries.append(om.tags_entry(svc, model, files))
    return {"models": entries}


@router.post("/show", openapi_extra=json_body(ShowRequest))
async def show(request: Request) -> dict[str, Any]:
    body = await parse_body(request, ShowRequest)
    svc = _svc(request)
    return om.show(svc, om.resolve(svc, body.target), verbose=body.verbose)


@router.get("/ps")
async def ps(request: Request) -> dict[str, Any]:
    svc = _svc(request)
    entries = [om.ps_entry(svc, loaded) for loaded in svc.router.describe()]
    return {"models": [e for e in entries if e is not None]}


@router.get("/version")
async def version() -> dict[str, Any]:
    return {"version": OLLAMA_COMPAT_VERSION, "lemonade_version": __version__}


@router.delete("/delete", openapi_extra=json_body(NamedRequest))
async def delete(request: Request) -> Response:
    body = await parse_body(request, NamedRequest)
    svc = _svc(request)
    model = om.resolve(svc, body.target)
    if not svc.catalog.is_downloaded(model):
        raise APIError(404, f"model '{body.target}' not found (it is not downloaded)", type="not_found",
                       code="model_not_found")
    if not await delete_model(svc, model):
        raise APIError(404, f"model '{body.target}' not found (no files to delete)", type="not_found",
                       code="model_not_found")
    return Response(status_code=200)


@router.post("/pull", openapi_extra=json_body(PullRequest))
async def pull(request: Request) -> Response:
    body = await parse_body(request, PullRequest)
    svc = _svc(request)
    model = om.resolve(svc, body.target)
    downloads = svc.downloads
    if not body.stream:
        async for _event in downloads.pull_events(model):
            pass
        return JSONResponse({"status": "success"})
    return StreamingResponse(_pull_lines(downloads, model), media_type=NDJSON, headers={"Cache-Control": "no-cache"})


async def _pull_lines(downloads: Any, model: ModelInfo) -> AsyncIterator[bytes]:
    """Download progress as Ollama's pull NDJSON: manifest, one `pulling <digest>` per file, success."""
    yield tr.ndjson_line({"status": "pulling manifest"})
    try:
        async for event in downloads.pull_events(model):
            name = str(event.get("file") or model.name)
            digest = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
            line: dict[str, Any] = {"status": f"pulling {digest[7:19]}", "digest": digest}
            if event.get("bytes_total") is not None:
                line["total"] = int(event["bytes_total"])
            if event.get("bytes_downloaded") is not None:
                line["completed"] = int(event["bytes_downloaded"])
            yield tr.ndjson_line(line)
    except APIError as exc:
        yield tr.ndjson_line({"error": exc.message})
        return
    except Exception as exc:  # noqa: BLE001 - the stream has started; report instead of cutting it
        log.exception("Pull of %s failed", model.name)
        yield tr.ndjson_line({"error": f"pull of {model.public} failed: {exc}"})
        return
    for status in ("verifying sha256 digest", "writing manifest", "success"):
        yield tr.ndjson_line({"status": status})


# ----- not supported -------------------------------------------------------------------------------

def _not_supported(what: str) -> APIError:
    return APIError(501, f"{what} is not supported by Lemonade. Register models with `lemonade pull` or "
                    "POST /v1/models/register instead.", type="not_implemented", code="not_supported")


@router.post("/create")
async def create() -> None:
    raise _not_supported("Creating models (/api/create)")


@router.post("/copy")
async def copy() -> None:
    raise _not_supported("Copying models (/api/copy)")


@router.post("/push")
async def push() -> None:
    raise _not_supported("Pushing models (/api/push)")


@router.post("/blobs/{digest}")
@router.head("/blobs/{digest}")  # a route of its own: its own OpenAPI operationId
async def blobs(digest: str) -> None:
    raise _not_supported("Uploading blobs (/api/blobs)")
