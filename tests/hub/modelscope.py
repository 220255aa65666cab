"""The ModelScope API of the hub.

ModelScope endpoints (``MODELSCOPE_ENDPOINT`` = the same url; default revision ``master``)
-----------------------------------------------------------------------------------------
``GET /openapi/v1/models?search=&sort=&page_number=&page_size=&filter.library=&filter.task=&owner=``
    The public OpenAPI search (what Lemonade's C++ server calls)::

        {"success": true, "request_id": "...", "code": "OK", "message": "success",
         "data": {"models": [{"id": "owner/name", "name", "owner", "display_name",
                              "description", "downloads", "likes", "stars",
                              "tags": ["gguf", ..., "library:gguf", "task:text-generation"],
                              "tasks": ["text-generation"], "libraries": ["gguf"],
                              "license", "created_at", "last_modified"}],
                  "total_count": N, "page_number": 1, "page_size": 10}}

    ``search`` words must all occur in the id (case-insensitive); ``filter.library=gguf``
    keeps repos with a ``.gguf`` file or a gguf tag; ``sort``: downloads (default), likes,
    last_modified, created_at; ``page_size`` at most 50.
``PUT|POST /api/v1/dolphin/models`` with a JSON body, or ``GET`` with the same keys as query
    The website search.  Body: ``{"PageSize": 10, "PageNumber": 1, "Name": "<query>",
    "SortBy": "Default"|"DownloadsCount"|"StarsCount"|"GmtModified", "Target": "",
    "Criterion": [{"category": "libraries"|"tasks"|"tags"|"organizations",
    "predicate": "contains", "values": [...]}], "SingleCriterion": []}``.  Answer::

        {"Code": 200, "Success": true, "Message": "success", "RequestId": "...",
         "Data": {"Model": {"TotalCount": N,
                            "Models": [{"Id": 123, "Name": "<repo>", "Path": "<owner>",
                                        "ChineseName": "...", "Description": "...",
                                        "Downloads": 0, "Stars": 0, "Tags": ["gguf", ...],
                                        "Tasks": [{"Name": "text-generation"}],
                                        "Libraries": ["gguf"], "License": "...",
                                        "Organization": {"Name": "<owner>"},
                                        "CreatedBy": "<owner>", "StorageSize": bytes,
                                        "CreatedTime": epoch_s, "LastUpdatedTime": epoch_s}]}}}

    The repo id is ``Path + "/" + Name`` (there is no id field, as on the real site).
``GET /api/v1/models/{owner}/{repo}``
    ``{"Code": 200, "Success": true, "Data": {<same fields as a dolphin item>, "Revision"}}``.
``GET /api/v1/models/{owner}/{repo}/repo/files?Revision=master&Recursive=true&Root=<dir>``
    ``{"Code": 200, "Success": true, "Data": {"Files": [{"Name", "Path", "Type": "blob"|"tree",
    "Size", "Sha256", "IsLFS", "Revision", "CommitId", "CommittedDate"}]}}``.
``HEAD|GET /api/v1/models/{owner}/{repo}/repo?Revision=master&FilePath=<path>`` and
``HEAD|GET /models/{owner}/{repo}/resolve/{rev}/{path}``
    The file bytes (Range supported); LFS files 302 to the CDN like the HF route.
    ModelScope errors: HTTP 404 + ``{"Code": 10010205001, "Success": false, "Message": "..."}``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from tests.hub.handler import HandlerBase
from tests.hub.hf_api import _sort_repos
from tests.hub.repos import Repo, _iso, _truthy
from tests.hub.state import HubError


class ModelScopeRoutes(HandlerBase):
    def _ms_error(self, err: HubError) -> None:
        self._json(err.status, {"Code": 10010205001, "Success": False, "Message": err.message,
                                "RequestId": uuid.uuid4().hex})

    def _ms_openapi_search(self, query: dict[str, list[str]]) -> None:
        words = (query.get("search") or [""])[0].lower().split()
        library = (query.get("filter.library") or [None])[0]
        task = (query.get("filter.task") or [None])[0]
        owner = (query.get("owner") or query.get("author") or [None])[0]
        repos = [r for r in self.hub.all_repos()
                 if all(w in r.repo_id.lower() for w in words)
                 and (not owner or r.owner == owner)
                 and (not library or _ms_has_library(r, library))
                 and (not task or _ms_task(r) == task)]
        sort = (query.get("sort") or ["downloads"])[0]
        _sort_repos(repos, {"last_modified": "lastModified", "created_at": "createdAt"}.get(sort, sort), "-1")
        page_number = max(1, int((query.get("page_number") or ["1"])[0] or 1))
        page_size = max(1, min(50, int((query.get("page_size") or ["10"])[0] or 10)))
        page = repos[(page_number - 1) * page_size: page_number * page_size]
        models = []
        for r in page:
            tags = r.tags()
            libs = ["gguf"] if r.has_gguf() else []
            task_name = _ms_task(r)
            models.append({
                "id": r.repo_id, "name": r.name, "owner": r.owner,
                "display_name": r.meta.get("chinese_name") or r.name,
                "description": r.meta.get("description", ""),
                "downloads": int(r.meta.get("downloads", 0)), "likes": int(r.meta.get("likes", 0)),
                "stars": int(r.meta.get("likes", 0)),
                "tags": tags + [f"library:{lib}" for lib in libs]
                + ([f"task:{task_name}"] if task_name else []),
                "tasks": [task_name] if task_name else [], "libraries": libs,
                "license": r.meta.get("license", "apache-2.0"),
                "created_at": r.meta.get("createdAt") or _iso(r.last_modified),
                "last_modified": _iso(r.last_modified),
            })
        self._json(200, {"success": True, "code": "OK", "message": "success", "request_id": uuid.uuid4().hex,
                         "data": {"models": models, "total_count": len(repos), "page_number": page_number,
                                  "page_size": page_size}})

    def _ms_dolphin_search(self, query: dict[str, list[str]]) -> None:
        body: dict[str, Any] = {}
        if self._body_cache.strip():
            body = json.loads(self._body_cache)
        for key, values in query.items():
            body.setdefault(key, values[0])
        words = str(body.get("Name") or "").lower().split()
        criteria = list(body.get("Criterion") or []) + list(body.get("SingleCriterion") or [])
        repos = []
        for r in self.hub.all_repos():
            if not all(w in r.repo_id.lower() for w in words):
                continue
            if all(_ms_criterion_ok(r, c) for c in criteria if isinstance(c, dict)):
                repos.append(r)
        sort = str(body.get("SortBy") or "Default")
        sort_key = {"StarsCount": "likes", "GmtModified": "lastModified"}.get(sort, "downloads")
        _sort_repos(repos, sort_key, "-1")
        page_size = max(1, int(body.get("PageSize") or 10))
        page_number = max(1, int(body.get("PageNumber") or 1))
        page = repos[(page_number - 1) * page_size: page_number * page_size]
        data = {"Model": {"Models": [_ms_model(r) for r in page], "TotalCount": len(repos)}}
        self._json(200, {"Code": 200, "Success": True, "Message": "success", "RequestId": uuid.uuid4().hex,
                         "Data": data})

    def _ms_info(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        self._json(200, {"Code": 200, "Success": True, "Message": "success", "RequestId": uuid.uuid4().hex,
                         "Data": {**_ms_model(repo), "Revision": commit}})

    def _ms_files(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        recursive = _truthy((query.get("Recursive") or query.get("recursive") or [None])[0])
        root = (query.get("Root") or query.get("root") or [""])[0].strip("/")
        prefix = f"{root}/" if root else ""
        out: list[dict[str, Any]] = []
        for d in sorted(repo.directories()):
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix):]):
                out.append({"Name": d.rsplit("/", 1)[-1], "Path": d, "Type": "tree", "Size": 0,
                            "Sha256": "", "IsLFS": False, "Revision": commit, "CommitId": commit})
        for p, e in repo.files.items():
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):]):
                out.append({"Name": p.rsplit("/", 1)[-1], "Path": p, "Type": "blob", "Size": e.size,
                            "Sha256": e.sha256, "IsLFS": e.lfs, "Revision": commit, "CommitId": commit,
                            "CommittedDate": int(e.mtime), "Id": e.blob_id, "Mode": "33188"})
        self._json(200, {"Code": 200, "Success": True, "Message": "success", "RequestId": uuid.uuid4().hex,
                         "Data": {"Files": out}})


def _ms_task(repo: Repo) -> str | None:
    return repo.meta.get("pipeline_tag") or ("text-generation" if repo.has_gguf() else None)


def _ms_has_library(repo: Repo, library: str) -> bool:
    lib = library.lower()
    return (lib == "gguf" and repo.has_gguf()) or lib in {t.lower() for t in repo.tags()} \
        or lib == str(repo.library_name() or "").lower()


def _ms_criterion_ok(repo: Repo, crit: dict[str, Any]) -> bool:
    values = [str(v).lower() for v in crit.get("values") or []]
    if not values:
        return True
    category = str(crit.get("category") or "").lower()
    if category == "libraries":
        return any(_ms_has_library(repo, v) for v in values)
    if category == "tasks":
        return (_ms_task(repo) or "").lower() in values
    if category == "organizations":
        return repo.owner.lower() in values
    if category == "tags":
        return bool({t.lower() for t in repo.tags()} & set(values))
    return True


def _ms_model(repo: Repo) -> dict[str, Any]:
    meta = repo.meta
    task = _ms_task(repo)
    return {
        "Id": int(hashlib.sha1(repo.repo_id.encode()).hexdigest()[:7], 16),
        "Name": repo.name,
        "Path": repo.owner,
        "ChineseName": meta.get("chinese_name") or repo.name,
        "Description": meta.get("description", ""),
        "Downloads": int(meta.get("downloads", 0)),
        "Stars": int(meta.get("likes", 0)),
        "Tags": repo.tags(),
        "Tasks": [{"Name": task, "ChineseName": task}] if task else [],
        "Libraries": ["gguf"] if repo.has_gguf() else [],
        "License": meta.get("license", "Apache License 2.0"),
        "Organization": {"Name": repo.owner, "FullName": repo.owner},
        "CreatedBy": repo.owner,
        "StorageSize": sum(e.size for e in repo.files.values()),
        "CreatedTime": int(repo.last_modified),
        "LastUpdatedTime": int(repo.last_modified),
    }
