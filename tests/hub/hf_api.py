"""The Hugging Face API of the hub (what huggingface_hub 2.x calls).

Hugging Face endpoints (what huggingface_hub 2.x calls)
-------------------------------------------------------
``HEAD|GET /{owner}/{repo}/resolve/{revision}/{path}``
    200 with ``X-Repo-Commit``, ``ETag: "<etag>"``, ``Content-Length``, ``Accept-Ranges: bytes``,
    ``Content-Disposition`` and, for LFS files, ``X-Linked-Size`` / ``X-Linked-Etag`` (sha256).
    ``Range: bytes=a-b | a- | -n`` gives 206 + ``Content-Range``; unsatisfiable gives 416.
    With ``lfs_redirect == "cdn"`` (the default, like the real Hub) LFS files answer
    ``302 Found`` with ``Location: <cdn_url>/cdn/<sha256>/<owner>/<repo>/<path>?X-Amz-...`` and the
    same metadata headers.  The CDN is a second listener on another port, i.e. another origin,
    so huggingface_hub treats it exactly like the real CDN: the HEAD stops at the 302 (metadata
    from the 302 itself), the GET goes to the CDN without the ``authorization`` header.  Set
    ``lfs_redirect`` to ``"none"`` to serve every file straight from ``/resolve``.
    Errors: 404 + ``X-Error-Code: RepoNotFound`` -> ``RepositoryNotFoundError``;
    404 + ``RevisionNotFound`` -> ``RevisionNotFoundError``; 404 + ``EntryNotFound`` (with
    ``X-Repo-Commit``, which the client uses to cache the miss) -> ``RemoteEntryNotFoundError``
    (a subclass of ``EntryNotFoundError``).  Every error also has ``X-Error-Message`` and a JSON
    body ``{"error": "..."}``.
``GET /api/models/{owner}/{repo}`` and ``GET /api/models/{owner}/{repo}/revision/{rev}``
    ``{"_id", "id", "modelId", "author", "sha", "lastModified", "createdAt", "private",
    "disabled", "gated", "downloads", "likes", "library_name", "tags", "pipeline_tag",
    "cardData", "gguf"?, "usedStorage", "spaces": [], "siblings": [{"rfilename"}]}``.
    ``?blobs=true`` (``files_metadata=True``) adds ``size``, ``blobId`` and, for LFS files,
    ``lfs: {"sha256", "size", "pointerSize"}`` to each sibling.  ``?expand=...`` returns only
    the named properties (plus ``_id`` and ``id``).
``GET /api/models/{owner}/{repo}/tree/{rev}[/{path}]?recursive=&expand=&cursor=&limit=``
    JSON list of ``{"type": "file", "oid", "size", "path", "lfs"?: {"oid", "size", "pointerSize"}}``
    and ``{"type": "directory", "oid", "size": 0, "path"}``; ``expand=true`` adds ``lastCommit``.
    Paginated with a GitHub style ``Link: <...&cursor=N>; rel="next"`` header; page size 1000
    (config ``tree_page_size``).  Unknown path -> 404 ``EntryNotFound``.
``POST /api/models/{owner}/{repo}/paths-info/{rev}`` (form ``paths=...&expand=...``)
    The same entries for the listed paths that exist.
``GET /api/models/{owner}/{repo}/refs``
    ``{"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": sha}], "tags": [],
    "converts": []}``.
``GET /api/models?search=&author=&filter=&pipeline_tag=&sort=&direction=&limit=&full=&cursor=``
    JSON list of ``{"_id", "id", "modelId", "author", "likes", "downloads", "trendingScore",
    "private", "tags", "pipeline_tag", "library_name", "createdAt"}`` (``full=true`` adds
    ``siblings``, ``sha``, ``lastModified``).  ``search``: every whitespace separated word must
    occur in the repo id (case-insensitive).  ``filter`` (repeatable): must be one of the repo's
    tags, its library or its pipeline tag.  ``sort``: downloads (default), likes,
    lastModified, createdAt, trendingScore or id; ``direction=-1`` (default) descending.
    Paginated with ``Link`` (page size ``limit``, at most ``models_page_size``).
``GET /api/agent-harnesses``
    ``{"standardEnvVars": [], "harnesses": {}}``.  huggingface_hub >= 2 fetches this once from
    ``constants.ENDPOINT`` to build its user agent unless ``HF_HUB_DISABLE_TELEMETRY=1``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.hub.handler import HandlerBase
from tests.hub.repos import FileEntry, Repo, _iso, _truthy
from tests.hub.state import HubError


class HfRoutes(HandlerBase):
    def _hf_error(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json(err.status, {"error": err.message}, headers)

    def _model_info(self, repo_id: str, revision: str | None, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision or "main")
        blobs = _truthy((query.get("blobs") or [None])[0])
        info = _hf_model_dict(repo, commit, blobs=blobs, full=True)
        expand = query.get("expand") or query.get("expand[]")
        if expand:
            wanted = set(expand) | {"_id", "id"}
            info = {k: v for k, v in info.items() if k in wanted}
        self._json(200, info)

    def _tree(self, repo_id: str, revision: str, sub: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        recursive = _truthy((query.get("recursive") or [None])[0])
        expand = _truthy((query.get("expand") or [None])[0])
        dirs = repo.directories()
        if sub and sub not in dirs:
            raise HubError(404, "EntryNotFound", f"{sub} does not exist on \"{revision}\"",
                           {"X-Repo-Commit": commit})
        prefix = f"{sub}/" if sub else ""
        items: list[dict[str, Any]] = []
        for d in sorted(dirs):
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix):]):
                items.append(_tree_dir(repo, d, commit, expand))
        for p, entry in repo.files.items():
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):]):
                items.append(_tree_file(entry, commit, expand, repo))
        items.sort(key=lambda it: it["path"])
        page_size = int((query.get("limit") or [self.hub.config["tree_page_size"]])[0])
        page_size = max(1, min(page_size, int(self.hub.config["tree_page_size"])))
        self._paginated(items, query, page_size)

    def _paginated(self, items: list[Any], query: dict[str, list[str]], page_size: int) -> None:
        offset = int((query.get("cursor") or ["0"])[0] or 0)
        page = items[offset:offset + page_size]
        headers: dict[str, str] = {}
        if offset + page_size < len(items):
            next_query = {k: v for k, v in query.items() if k != "cursor"}
            next_query["cursor"] = [str(offset + page_size)]
            path = urlsplit(self.path).path
            headers["Link"] = f'<{self.hub.url}{path}?{urlencode(next_query, doseq=True)}>; rel="next"'
        self._json(200, page, headers)

    def _paths_info(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        ctype = self.headers.get("Content-Type", "")
        raw = self._body_cache
        if "json" in ctype:
            data = json.loads(raw or b"{}")
            paths = data.get("paths") or []
            expand = bool(data.get("expand"))
        else:
            form = parse_qs(raw.decode(), keep_blank_values=True)
            paths = form.get("paths") or []
            expand = _truthy((form.get("expand") or [None])[0])
        dirs = repo.directories()
        out = []
        for p in paths:
            p = p.strip("/")
            if p in repo.files:
                out.append(_tree_file(repo.files[p], commit, expand, repo))
            elif p in dirs:
                out.append(_tree_dir(repo, p, commit, expand))
        self._json(200, out)

    def _refs(self, repo_id: str) -> None:
        repo = self._repo(repo_id)
        branch = {"name": "main", "ref": "refs/heads/main", "targetCommit": repo.commit}
        self._json(200, {"branches": [branch], "converts": [], "tags": []})

    def _list_models(self, query: dict[str, list[str]]) -> None:
        q = (query.get("search") or [""])[0].lower().split()
        author = (query.get("author") or [None])[0]
        filters = [f.lower() for f in (query.get("filter") or []) if f]
        pipeline = (query.get("pipeline_tag") or [None])[0]
        full = _truthy((query.get("full") or [None])[0])
        repos = []
        for repo in self.hub.all_repos():
            rid = repo.repo_id.lower()
            if q and not all(word in rid for word in q):
                continue
            if author and repo.owner != author:
                continue
            labels = {t.lower() for t in repo.tags()} | {str(repo.library_name() or "").lower(),
                                                          str(repo.meta.get("pipeline_tag") or "").lower()}
            if any(f not in labels for f in filters):
                continue
            if pipeline and repo.meta.get("pipeline_tag") != pipeline:
                continue
            repos.append(repo)
        _sort_repos(repos, (query.get("sort") or ["downloads"])[0], (query.get("direction") or ["-1"])[0])
        items = [_hf_model_dict(r, r.commit, blobs=False, full=full, listing=True) for r in repos]
        limit = (query.get("limit") or [None])[0]
        page_size = int(self.hub.config["models_page_size"])
        if limit:
            page_size = max(1, min(int(limit), page_size))
        self._paginated(items, query, page_size)


def _hf_model_dict(
    repo: Repo, commit: str, *, blobs: bool, full: bool, listing: bool = False
) -> dict[str, Any]:
    meta = repo.meta
    created = meta.get("createdAt") or _iso(repo.last_modified)
    info: dict[str, Any] = {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.owner,
        "likes": int(meta.get("likes", 0)),
        "downloads": int(meta.get("downloads", 0)),
        "trendingScore": int(meta.get("trendingScore", 0)),
        "private": False,
        "tags": repo.tags(),
        "pipeline_tag": meta.get("pipeline_tag"),
        "library_name": repo.library_name(),
        "createdAt": created,
    }
    if listing and not full:
        return info
    info.update({
        "sha": commit,
        "lastModified": meta.get("lastModified") or _iso(repo.last_modified),
        "disabled": False,
        "gated": meta.get("gated", False),
    })
    if listing:
        info["siblings"] = [{"rfilename": p} for p in repo.files]
        return info
    info.update({
        "cardData": meta.get("cardData", {"tags": repo.tags()}),
        "spaces": [],
        "usedStorage": sum(e.size for e in repo.files.values()),
    })
    if "gguf" in meta:
        info["gguf"] = meta["gguf"]
    siblings = []
    for p, e in repo.files.items():
        s: dict[str, Any] = {"rfilename": p}
        if blobs:
            s["blobId"] = e.blob_id
            s["size"] = e.size
            if e.lfs:
                s["lfs"] = {"sha256": e.sha256, "size": e.size, "pointerSize": len(e.pointer)}
        siblings.append(s)
    info["siblings"] = siblings
    return info


def _tree_file(e: FileEntry, commit: str, expand: bool, repo: Repo) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "file", "oid": e.blob_id, "size": e.size, "path": e.path}
    if e.lfs:
        item["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": len(e.pointer)}
    if expand:
        item["lastCommit"] = {"id": commit, "title": "Upload folder using huggingface_hub",
                              "date": _iso(e.mtime)}
        item["securityFileStatus"] = {"status": "safe", "avScan": {"virusFound": False, "virusNames": None},
                                      "pickleImportScan": None}
    return item


def _tree_dir(repo: Repo, d: str, commit: str, expand: bool) -> dict[str, Any]:
    h = hashlib.sha1(f"tree {d}\n".encode())
    for p, e in repo.files.items():
        if p.startswith(d + "/"):
            h.update(f"{p}\0{e.blob_id}\n".encode())
    item: dict[str, Any] = {"type": "directory", "oid": h.hexdigest(), "size": 0, "path": d}
    if expand:
        item["lastCommit"] = {"id": commit, "title": "Upload folder using huggingface_hub",
                              "date": _iso(repo.last_modified)}
    return item


def _sort_repos(repos: list[Repo], sort: str, direction: str) -> None:
    def key(r: Repo) -> Any:
        if sort == "likes":
            return int(r.meta.get("likes", 0))
        if sort in ("lastModified", "last_modified"):
            return r.last_modified
        if sort in ("createdAt", "created_at"):
            return str(r.meta.get("createdAt") or _iso(r.last_modified))
        if sort == "trendingScore":
            return int(r.meta.get("trendingScore", 0))
        if sort == "id":
            return r.repo_id
        return int(r.meta.get("downloads", 0))

    repos.sort(key=lambda r: r.repo_id)
    repos.sort(key=key, reverse=str(direction) != "1")
