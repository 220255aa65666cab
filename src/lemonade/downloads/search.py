"""`GET /v1/registry/search`: candidate repositories from Hugging Face or ModelScope metadata.

Results are hints (the Model Manager validates each with /v1/pull/variants). With `format=gguf`
GGUF repositories are searched first and ranked ahead of the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from lemonade.downloads.hub import (
    METADATA_TIMEOUT,
    HubError,
    check_modelscope_status,
    hf_endpoint,
    hf_error,
    hf_token,
    modelscope_endpoint,
    modelscope_headers,
)
from lemonade.util.http_client import async_client


def _result(source: str, repo_id: str, *, description: str = "", tags: list[str] | None = None, task: str = "",
            downloads: int = 0, likes: int = 0, has_gguf: bool = False, display_name: str | None = None
            ) -> dict[str, Any]:
    return {"repository_id": repo_id, "display_name": display_name or repo_id.rsplit("/", 1)[-1],
            "source": source, "repository_type": "model", "description": description or "",
            "tags": list(tags or []), "task": task or "", "downloads": int(downloads or 0),
            "likes": int(likes or 0), "has_gguf": bool(has_gguf)}


def _hf_models(params: dict[str, str]) -> list[dict[str, Any]]:
    """One page of `GET /api/models` through huggingface_hub's session (no retry loop: a rate limit
    is passed on to the client at once instead of stalling the request for half a minute)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    resp = get_session().get(f"{hf_endpoint()}/api/models", params=params, headers=build_hf_headers(token=hf_token()),
                             timeout=METADATA_TIMEOUT)
    hf_raise_for_status(resp)
    data = resp.json()
    if not isinstance(data, list):
        raise HubError(502, "Hugging Face search: the answer is not a list of models", resp.status_code)
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _search_huggingface(query: str, limit: int, gguf: bool) -> tuple[int, list[dict[str, Any]]]:
    params = {"search": query, "sort": "downloads", "direction": "-1", "limit": str(limit)}
    found: dict[str, dict[str, Any]] = {}
    try:
        if gguf:
            for item in _hf_models({**params, "filter": "gguf"}):
                found.setdefault(item["id"], item)
        if len(found) < limit:
            for item in _hf_models(params):
                found.setdefault(item["id"], item)
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise hf_error(exc, "Hugging Face search") from None
    results = []
    for item in found.values():
        tags = [str(t) for t in item.get("tags") or []]
        has_gguf = "gguf" in tags or item.get("library_name") == "gguf"
        results.append(_result("huggingface", item["id"], tags=tags, task=item.get("pipeline_tag") or "",
                               downloads=item.get("downloads") or 0, likes=item.get("likes") or 0,
                               has_gguf=has_gguf))
    if gguf:
        results.sort(key=lambda r: not r["has_gguf"])  # stable: registry order within each group
    return len(results), results[:limit]


async def _search_modelscope(query: str, limit: int, gguf: bool) -> tuple[int, list[dict[str, Any]]]:
    params = {"search": query, "page_size": str(limit), "page_number": "1", "sort": "downloads"}
    if gguf:
        params["filter.library"] = "gguf"
    url = modelscope_endpoint() + "/openapi/v1/models"
    try:
        async with async_client(timeout=METADATA_TIMEOUT, follow_redirects=True) as client:
            resp = await client.get(url, params=params, headers=modelscope_headers())
    except httpx.HTTPError as exc:
        raise HubError(502, f"ModelScope search: cannot reach {modelscope_endpoint()} ({exc})") from None
    check_modelscope_status(resp.status_code, "ModelScope search", not_found=False)
    try:
        body = resp.json()
        data = body["data"]
        models = data["models"]
        total = int(data.get("total_count", len(models)))
    except (ValueError, KeyError, TypeError):
        raise HubError(502, "ModelScope search: the answer could not be parsed", resp.status_code) from None
    results = []
    for item in models if isinstance(models, list) else []:
        if not isinstance(item, dict) or not item.get("id"):
            continue
        tags = [str(t) for t in item.get("tags") or []]
        libraries = [str(x).lower() for x in item.get("libraries") or []]
        tasks = [str(t) for t in item.get("tasks") or []]
        results.append(_result("modelscope", str(item["id"]), description=str(item.get("description") or ""),
                               tags=tags, task=tasks[0] if tasks else "", downloads=item.get("downloads") or 0,
                               likes=item.get("likes") or item.get("stars") or 0,
                               has_gguf="gguf" in libraries or "gguf" in (t.lower() for t in tags),
                               display_name=str(item.get("name") or "") or None))
    return total, results[:limit]


async def search(source: str, query: str, limit: int, gguf: bool) -> dict[str, Any]:
    if source == "modelscope":
        total, results = await _search_modelscope(query, limit, gguf)
    else:
        total, results = await asyncio.to_thread(_search_huggingface, query, limit, gguf)
    out: dict[str, Any] = {"source": source, "query": query}
    if gguf:
        out["format"] = "gguf"
    out["total"] = total
    out["results"] = results
    return out
