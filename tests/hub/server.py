"""A small local Hugging Face Hub (plus the ModelScope endpoints we use), for tests.

The real ``huggingface_hub`` client talks to it unchanged: point ``HF_ENDPOINT`` at ``url``
(and ``MODELSCOPE_ENDPOINT`` at the same ``url``).  Everything stays on 127.0.0.1.

Repos are folders: ``ROOT/<owner>/<repo>/<files...>``.  Several roots may be given; the first
root holding a repo wins (the test plugin puts a writable scratch root in front of the cached,
read-only fixture root).  Per repo, optional hidden files (never listed as repo files):

- ``.hub.json``   -- card metadata merged into the API answers: ``downloads``, ``likes``, ``tags``,
  ``pipeline_tag``, ``library_name``, ``gguf``, ``cardData``, ``createdAt``, ``gated``,
  ``description`` and ``chinese_name`` (ModelScope), ...
- ``.commit``     -- forces the commit sha (40 hex; anything else is hashed to 40 hex).
- ``.hub-hashes.json`` -- hash cache (sha256 / git blob sha1 keyed by path+size+mtime_ns).
- ``.git/`` and any name starting with ``.hub`` are ignored; ``.gitattributes`` is a normal file.

The commit sha of a repo is content based: sha1 over the sorted ``(path, etag)`` pairs, so
changing a file's content (or adding/removing a file) changes the commit, while copying or
touching a repo does not.  Revisions accepted: ``main``, ``master``, the full commit sha or a
prefix of at least 7 characters; anything else is ``RevisionNotFound``.

A file is "LFS" when its suffix is a weights suffix (``.gguf``, ``.safetensors``, ``.bin``,
``.onnx``, ...) or it is larger than 1 MiB.  As on the real Hub: an LFS file's ETag is its
sha256, its git ``blobId``/tree ``oid`` is the sha1 of its LFS pointer file; a regular file's
ETag and ``blobId`` are its git blob sha1.

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

Test controls (JSON bodies, never query strings; not recorded in the request log)
-------------------------------------------------------------------------------
``GET  /_admin/health``    -> ``{"ok": true, "url", "cdn_url", "roots"}``
``GET  /_admin/requests``  -> list of every non-admin request, oldest first: ``{"id", "time",
    "server": "hub"|"cdn", "method", "path" (decoded), "query", "kind" ("resolve", "cdn",
    "api", "ms-file", ...), "repo", "file", "range", "status", "bytes_sent", "completed",
    "injected", "authorization" (bool), "download_counter" (bool), "user_agent"}``.
``POST /_admin/clear_requests``  empties the log.
``POST /_admin/reset``     clears the log, every rule below and the config.
``POST /_admin/throttle {"bytes_per_sec": N, "path": "substr"?}``  (N null/0 removes it).
``POST /_admin/fail {"path": "substr", "status": 500, "count": 1, "method"?, "server"?,
    "retry_after"?, "error_code"?}``  -- the next ``count`` matching requests get ``status``
    (``count`` null = forever).
``POST /_admin/drop {"path": "substr", "after_bytes": N, "count": 1}``  -- send N body bytes of
    the next matching download, then cut the connection (the client sees a truncated body).
``POST /_admin/delay {"path": "substr", "seconds": S, "count": 1, "method"?}``  -- stall first.
``POST /_admin/corrupt {"repo", "path", "offset"?, "count"?}``  -- serve that file with one byte
    flipped (default: the middle byte) while every header still announces the true sha256.
``POST /_admin/config {"lfs_redirect": "cdn"|"none", "tree_page_size": N,
    "models_page_size": N}``
``GET  /_admin/repos``     -> ``{repo_id: {"commit", "root", "files": {path: {size, sha256, lfs}}}}``

A ``path`` pattern matches when it is a substring of the decoded URL path or of
``"<repo_id>/<file path>"``; ``""`` matches every request.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

LFS_SUFFIXES = frozenset(
    {
        ".gguf", ".safetensors", ".bin", ".onnx", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
        ".model", ".npz", ".npy", ".pb", ".tflite", ".ot", ".zip", ".tar", ".gz", ".xz", ".7z",
        ".arrow", ".parquet", ".wasm", ".mlmodel", ".joblib", ".pkl", ".pickle",
    }
)
LFS_MIN_SIZE = 1024 * 1024
HASH_CACHE_NAME = ".hub-hashes.json"
META_NAME = ".hub.json"
COMMIT_NAME = ".commit"
DEFAULT_CONFIG: dict[str, Any] = {"lfs_redirect": "cdn", "tree_page_size": 1000, "models_page_size": 1000}
_HEX = set("0123456789abcdef")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in {"1", "true", "yes", "on"}


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file the real Hub stores in git for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs_path(path: str, size: int) -> bool:
    return Path(path).suffix.lower() in LFS_SUFFIXES or size > LFS_MIN_SIZE


def hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1 of the raw content) of a file, in one pass."""
    size = path.stat().st_size
    h256 = hashlib.sha256()
    h1 = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while block := f.read(4 * 1024 * 1024):
            h256.update(block)
            h1.update(block)
    return h256.hexdigest(), h1.hexdigest()


def _skip_name(name: str) -> bool:
    return name.startswith(".hub") or name == COMMIT_NAME or name == ".git"


def iter_repo_files(repo_dir: Path) -> Iterable[tuple[str, Path]]:
    """(posix relative path, absolute path) of every served file of a repo folder, sorted."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(repo_dir):
        dirnames[:] = sorted(d for d in dirnames if not _skip_name(d))
        for name in filenames:
            if _skip_name(name):
                continue
            abspath = Path(dirpath) / name
            out.append((abspath.relative_to(repo_dir).as_posix(), abspath))
    return sorted(out)


def write_hash_cache(repo_dir: Path) -> dict[str, dict[str, Any]]:
    """Hash every file of a repo folder and store ``.hub-hashes.json`` (used by the fixtures)."""
    cache: dict[str, dict[str, Any]] = {}
    for rel, abspath in iter_repo_files(repo_dir):
        st = abspath.stat()
        sha256, sha1 = hash_file(abspath)
        cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256, "git_sha1": sha1}
    tmp = repo_dir / f"{HASH_CACHE_NAME}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, repo_dir / HASH_CACHE_NAME)
    return cache


@dataclass(frozen=True)
class FileEntry:
    path: str
    abspath: Path
    size: int
    mtime: float
    sha256: str
    content_sha1: str

    @property
    def lfs(self) -> bool:
        return is_lfs_path(self.path, self.size)

    @property
    def pointer(self) -> bytes:
        return lfs_pointer(self.sha256, self.size)

    @property
    def blob_id(self) -> str:
        return git_blob_sha1(self.pointer) if self.lfs else self.content_sha1

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.content_sha1


@dataclass
class Repo:
    repo_id: str
    root: Path
    path: Path
    files: dict[str, FileEntry]
    commit: str
    meta: dict[str, Any]
    last_modified: float

    @property
    def owner(self) -> str:
        return self.repo_id.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.repo_id.split("/", 1)[1]

    def resolve_revision(self, revision: str) -> str | None:
        rev = revision.strip()
        if rev in ("main", "master", "refs/heads/main", "refs/heads/master"):
            return self.commit
        if len(rev) >= 7 and set(rev.lower()) <= _HEX and self.commit.startswith(rev.lower()):
            return self.commit
        return None

    def directories(self) -> set[str]:
        dirs: set[str] = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return dirs

    def has_gguf(self) -> bool:
        return any(p.lower().endswith(".gguf") for p in self.files)

    def tags(self) -> list[str]:
        tags = self.meta.get("tags")
        if tags is None:
            tags = ["gguf"] if self.has_gguf() else []
        return list(tags)

    def library_name(self) -> str | None:
        return self.meta.get("library_name", "gguf" if self.has_gguf() else None)


@dataclass
class _Rule:
    kind: str
    path: str = ""
    count: int | None = 1
    method: str | None = None
    server: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def matches(self, ctx: _Ctx) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if self.method and self.method.upper() != ctx.method:
            return False
        if self.server and self.server != ctx.server:
            return False
        return ctx.matches_path(self.path)


@dataclass
class _Ctx:
    method: str
    server: str
    path: str
    repo: str | None = None
    file: str | None = None

    def matches_path(self, pattern: str) -> bool:
        if not pattern:
            return True
        if pattern in self.path:
            return True
        return self.repo is not None and self.file is not None and pattern in f"{self.repo}/{self.file}"


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class Hub:
    """Shared state of one hub: where repos live, the test controls and the request log."""

    def __init__(self, roots: Iterable[str | Path]):
        self.roots = [Path(r).resolve() for r in roots]
        if not self.roots:
            raise ValueError("at least one root is required")
        self.lock = threading.RLock()
        self.log: list[dict[str, Any]] = []
        self.rules: list[_Rule] = []
        self.throttles: dict[str, float] = {}
        self.config: dict[str, Any] = dict(DEFAULT_CONFIG)
        self._hashes: dict[tuple[str, int, int, int], tuple[str, str]] = {}
        self._loaded_caches: set[Path] = set()
        self.url = ""
        self.cdn_url = ""

    # ----------------------------------------------------------------- repos
    def _load_hash_cache(self, repo_dir: Path) -> None:
        if repo_dir in self._loaded_caches:
            return
        self._loaded_caches.add(repo_dir)
        try:
            data = json.loads((repo_dir / HASH_CACHE_NAME).read_text())
        except (OSError, ValueError):
            return
        for rel, v in data.items():
            try:
                st = (repo_dir / rel).stat()
            except OSError:
                continue
            if st.st_size == int(v["size"]) and st.st_mtime_ns == int(v["mtime_ns"]):
                key = (str(repo_dir / rel), st.st_ino, st.st_size, st.st_mtime_ns)
                self._hashes[key] = (v["sha256"], v["git_sha1"])

    def _hashes_for(self, abspath: Path, st: os.stat_result) -> tuple[str, str]:
        # The inode is part of the key: files are replaced (new inode) rather than rewritten, so a
        # same-size rewrite within one mtime tick still gets rehashed.
        key = (str(abspath), st.st_ino, st.st_size, st.st_mtime_ns)
        with self.lock:
            cached = self._hashes.get(key)
        if cached is not None:
            return cached
        result = hash_file(abspath)
        with self.lock:
            self._hashes[key] = result
        return result

    def find_repo_dir(self, repo_id: str) -> tuple[Path, Path] | None:
        parts = repo_id.split("/")
        if len(parts) != 2 or not all(parts) or any(p.startswith(".") or p in ("..",) for p in parts):
            return None
        for root in self.roots:
            d = root / parts[0] / parts[1]
            if d.is_dir():
                return root, d
        return None

    def get_repo(self, repo_id: str) -> Repo | None:
        found = self.find_repo_dir(repo_id)
        if found is None:
            return None
        root, repo_dir = found
        with self.lock:
            self._load_hash_cache(repo_dir)
        files: dict[str, FileEntry] = {}
        last_modified = 0.0
        for rel, abspath in iter_repo_files(repo_dir):
            try:
                st = abspath.stat()
            except FileNotFoundError:
                continue
            sha256, sha1 = self._hashes_for(abspath, st)
            files[rel] = FileEntry(rel, abspath, st.st_size, st.st_mtime, sha256, sha1)
            last_modified = max(last_modified, st.st_mtime)
        commit = None
        commit_file = repo_dir / COMMIT_NAME
        if commit_file.is_file():
            text = commit_file.read_text().strip().lower()
            if not (len(text) == 40 and set(text) <= _HEX):
                text = hashlib.sha1(text.encode()).hexdigest()
            commit = text
        if commit is None:
            h = hashlib.sha1(f"repo {repo_id}\n".encode())
            for rel, entry in files.items():
                h.update(f"{rel}\0{entry.etag}\n".encode())
            commit = h.hexdigest()
        meta: dict[str, Any] = {}
        try:
            meta = json.loads((repo_dir / META_NAME).read_text())
        except (OSError, ValueError):
            pass
        return Repo(repo_id, root, repo_dir, files, commit, meta, last_modified or repo_dir.stat().st_mtime)

    def repo_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for root in self.roots:
            if not root.is_dir():
                continue
            for owner in sorted(root.iterdir()):
                if not owner.is_dir() or owner.name.startswith("."):
                    continue
                for repo in sorted(owner.iterdir()):
                    if repo.is_dir() and not repo.name.startswith("."):
                        seen.setdefault(f"{owner.name}/{repo.name}", None)
        return list(seen)

    def all_repos(self) -> list[Repo]:
        return [r for rid in self.repo_ids() if (r := self.get_repo(rid)) is not None]

    # -------------------------------------------------------------- controls
    def reset(self) -> None:
        with self.lock:
            self.log.clear()
            self.rules.clear()
            self.throttles.clear()
            self.config = dict(DEFAULT_CONFIG)

    def take_rule(self, kind: str, ctx: _Ctx) -> _Rule | None:
        """First matching rule of ``kind``; consumes one of its uses."""
        with self.lock:
            for rule in self.rules:
                if rule.kind == kind and rule.matches(ctx):
                    if rule.count is not None:
                        rule.count -= 1
                    return rule
        return None

    def corrupt_offset(self, repo: str, path: str, size: int) -> int | None:
        with self.lock:
            for rule in self.rules:
                if rule.kind != "corrupt" or (rule.count is not None and rule.count <= 0):
                    continue
                if rule.params.get("repo") == repo and rule.params.get("path") == path:
                    if rule.count is not None:
                        rule.count -= 1
                    offset = rule.params.get("offset")
                    return int(offset) if offset is not None else size // 2
        return None

    def rate_for(self, ctx: _Ctx) -> float | None:
        with self.lock:
            rates = [rate for pattern, rate in self.throttles.items() if ctx.matches_path(pattern)]
        return min(rates) if rates else None

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            entry["id"] = len(self.log) + 1
            self.log.append(entry)
        return entry

    def requests_snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(e) for e in self.log]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], hub: Hub, role: str, quiet: bool):
        self.hub = hub
        self.role = role
        self.quiet = quiet
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1.0"
    timeout = 120
    server: _Server

    # ------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if not self.server.quiet:
            sys.stderr.write(f"[hub:{self.server.role}] {self.address_string()} {format % args}\n")

    @property
    def hub(self) -> Hub:
        return self.server.hub

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        self._body = self.rfile.read(length) if length > 0 else b""
        return self._body

    @property
    def _body_cache(self) -> bytes:
        return getattr(self, "_body", b"")

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str | None = "application/json; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("X-Request-Id", uuid.uuid4().hex)
        if content_type:
            self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        if self._entry is not None:
            self._entry["status"] = status
            self._entry["bytes_sent"] = 0 if self.command == "HEAD" else len(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _hf_error(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json(err.status, {"error": err.message}, headers)

    def _ms_error(self, err: HubError) -> None:
        self._json(err.status, {"Code": 10010205001, "Success": False, "Message": err.message,
                                "RequestId": uuid.uuid4().hex})

    # ------------------------------------------------------------- routing
    def _dispatch(self, method: str) -> None:
        self._entry: dict[str, Any] | None = None
        self._body = b""
        self._cut = False
        split = urlsplit(self.path)
        raw_segments = split.path.split("/")[1:]
        segs = [unquote(s) for s in raw_segments]
        decoded_path = "/" + "/".join(segs)
        query = parse_qs(split.query, keep_blank_values=True)
        body = self._read_body() if method in ("POST", "PUT", "DELETE") else b""
        if segs and segs[0] == "_admin":
            try:
                self._admin(method, segs[1:], body)
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, {"error": f"bad admin request: {exc}"})
            return

        ctx = _Ctx(method=method, server=self.server.role, path=decoded_path)
        route = self._route(method, segs, query, ctx)
        self._entry = self.hub.record({
            "time": time.time(), "server": self.server.role, "method": method, "path": decoded_path,
            "query": split.query, "kind": route[0] if route else "unknown", "repo": ctx.repo,
            "file": ctx.file, "range": self.headers.get("Range"), "status": None, "bytes_sent": 0,
            "completed": False, "injected": None,
            "authorization": self.headers.get("Authorization") is not None,
            "download_counter": self.headers.get("X-HF-Download-Counter") is not None,
            "user_agent": self.headers.get("User-Agent"),
        })
        try:
            delay = self.hub.take_rule("delay", ctx)
            if delay is not None:
                self._entry["injected"] = f"delay {delay.params['seconds']}s"
                time.sleep(float(delay.params["seconds"]))
            fail = self.hub.take_rule("fail", ctx)
            if fail is not None:
                self._inject_failure(fail)
            elif route is None:
                self._json(404, {"error": f"Not found: {decoded_path}"})
            else:
                kind, handler, args = route
                try:
                    handler(*args)
                except HubError as err:
                    (self._ms_error if kind.startswith("ms") else self._hf_error)(err)
            self._entry["completed"] = self._entry.get("status") is not None and not self._cut
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self._entry["aborted"] = True
            self.close_connection = True

    def _inject_failure(self, rule: _Rule) -> None:
        status = int(rule.params.get("status", 500))
        assert self._entry is not None
        self._entry["injected"] = f"fail {status}"
        headers = {"X-Error-Message": f"Injected failure ({status})"}
        if rule.params.get("retry_after") is not None:
            headers["Retry-After"] = str(rule.params["retry_after"])
        if rule.params.get("error_code"):
            headers["X-Error-Code"] = str(rule.params["error_code"])
        self._json(status, {"error": f"Injected failure ({status})"}, headers)

    def _route(self, method: str, segs: list[str], query: dict[str, list[str]], ctx: _Ctx):
        """(kind, handler, args) or None.  Also fills ctx.repo / ctx.file for rule matching."""
        n = len(segs)
        if self.server.role == "cdn" or (n >= 1 and segs[0] == "cdn"):
            if n >= 5 and segs[0] == "cdn" and method in ("GET", "HEAD"):
                ctx.repo, ctx.file = f"{segs[2]}/{segs[3]}", "/".join(segs[4:])
                return "cdn", self._cdn, (segs[1], ctx.repo, ctx.file)
            return None
        if n >= 2 and segs[0] == "api" and segs[1] == "agent-harnesses":
            return "api", self._json, (200, {"standardEnvVars": [], "harnesses": {}})
        if n >= 2 and segs[0] == "api" and segs[1] == "models":
            if n == 2 and method == "GET":
                return "api-list", self._list_models, (query,)
            if n >= 4:
                ctx.repo = f"{segs[2]}/{segs[3]}"
                rest = segs[4:]
                if not rest and method == "GET":
                    return "api-info", self._model_info, (ctx.repo, None, query)
                if rest and rest[0] == "revision" and len(rest) >= 2 and method == "GET":
                    return "api-info", self._model_info, (ctx.repo, "/".join(rest[1:]), query)
                if rest and rest[0] == "tree" and len(rest) >= 2 and method == "GET":
                    sub = "/".join(rest[2:]).strip("/")
                    return "api-tree", self._tree, (ctx.repo, rest[1], sub, query)
                if rest and rest[0] == "paths-info" and len(rest) >= 2 and method == "POST":
                    return "api-paths-info", self._paths_info, (ctx.repo, "/".join(rest[1:]))
                if rest == ["refs"] and method == "GET":
                    return "api-refs", self._refs, (ctx.repo,)
            return None
        if n >= 2 and segs[0] == "openapi" and segs[1] == "v1" and n == 3 and segs[2] == "models":
            return "ms-search", self._ms_openapi_search, (query,)
        if n >= 3 and segs[0] == "api" and segs[1] == "v1":
            if segs[2:] == ["dolphin", "models"] and method in ("GET", "PUT", "POST"):
                return "ms-search", self._ms_dolphin_search, (query,)
            if n >= 5 and segs[2] == "models":
                ctx.repo = f"{segs[3]}/{segs[4]}"
                rest = segs[5:]
                rev = (query.get("Revision") or query.get("revision") or ["master"])[0] or "master"
                if not rest and method == "GET":
                    return "ms-info", self._ms_info, (ctx.repo, rev)
                if rest == ["repo", "files"] and method == "GET":
                    return "ms-files", self._ms_files, (ctx.repo, rev, query)
                if rest == ["repo"] and method in ("GET", "HEAD"):
                    ctx.file = (query.get("FilePath") or query.get("filePath") or [""])[0]
                    return "ms-file", self._serve_repo_file, (ctx.repo, rev, ctx.file, "ms")
            return None
        if n >= 6 and segs[0] == "models" and segs[3] == "resolve" and method in ("GET", "HEAD"):
            ctx.repo, ctx.file = f"{segs[1]}/{segs[2]}", "/".join(segs[5:])
            return "ms-file", self._serve_repo_file, (ctx.repo, segs[4], ctx.file, "ms")
        if n >= 5 and segs[2] == "resolve" and method in ("GET", "HEAD"):
            ctx.repo, ctx.file = f"{segs[0]}/{segs[1]}", "/".join(segs[4:])
            return "resolve", self._serve_repo_file, (ctx.repo, segs[3], ctx.file, "hf")
        return None

    # ---------------------------------------------------------------- admin
    def _admin(self, method: str, segs: list[str], body: bytes) -> None:
        hub = self.hub
        payload: dict[str, Any] = json.loads(body) if body.strip() else {}
        action = "/".join(segs)
        if method == "GET" and action == "health":
            return self._json(200, {"ok": True, "url": hub.url, "cdn_url": hub.cdn_url,
                                    "roots": [str(r) for r in hub.roots]})
        if method == "GET" and action == "requests":
            return self._json(200, hub.requests_snapshot())
        if method == "GET" and action == "repos":
            out = {}
            for repo in hub.all_repos():
                out[repo.repo_id] = {
                    "commit": repo.commit, "root": str(repo.root),
                    "files": {p: {"size": e.size, "sha256": e.sha256, "lfs": e.lfs}
                              for p, e in repo.files.items()},
                }
            return self._json(200, out)
        if method == "GET" and action == "config":
            return self._json(200, hub.config)
        if method != "POST":
            return self._json(404, {"error": f"unknown admin endpoint {method} /_admin/{action}"})
        if action == "reset":
            hub.reset()
            return self._json(200, {"ok": True})
        if action == "clear_requests":
            with hub.lock:
                hub.log.clear()
            return self._json(200, {"ok": True})
        if action == "throttle":
            rate = payload.get("bytes_per_sec")
            pattern = payload.get("path") or ""
            with hub.lock:
                if rate:
                    hub.throttles[pattern] = float(rate)
                elif "path" in payload:
                    hub.throttles.pop(pattern, None)
                else:
                    hub.throttles.clear()
                current = dict(hub.throttles)
            return self._json(200, {"ok": True, "throttles": current})
        if action in ("fail", "drop", "delay", "corrupt"):
            count = payload.get("count", None if action == "corrupt" else 1)
            rule = _Rule(kind=action, path=payload.get("path") or "", count=count,
                         method=payload.get("method"), server=payload.get("server"))
            if action == "fail":
                rule.params = {"status": int(payload.get("status", 500)),
                               "retry_after": payload.get("retry_after"),
                               "error_code": payload.get("error_code")}
            elif action == "drop":
                rule.params = {"after_bytes": int(payload["after_bytes"])}
            elif action == "delay":
                rule.params = {"seconds": float(payload["seconds"])}
            else:
                rule.params = {"repo": payload["repo"], "path": payload["path"],
                               "offset": payload.get("offset")}
                rule.path = ""
            with hub.lock:
                hub.rules.append(rule)
            return self._json(200, {"ok": True, "id": rule.id})
        if action == "config":
            unknown = set(payload) - set(DEFAULT_CONFIG)
            if unknown:
                raise ValueError(f"unknown config keys {sorted(unknown)}")
            if payload.get("lfs_redirect", "cdn") not in ("cdn", "none"):
                raise ValueError("lfs_redirect must be 'cdn' or 'none'")
            with hub.lock:
                hub.config.update(payload)
                current = dict(hub.config)
            return self._json(200, current)
        return self._json(404, {"error": f"unknown admin endpoint POST /_admin/{action}"})

    # ------------------------------------------------------ repo lookups
    def _repo(self, repo_id: str) -> Repo:
        repo = self.hub.get_repo(repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        return repo

    def _commit(self, repo: Repo, revision: str) -> str:
        commit = repo.resolve_revision(revision)
        if commit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # ---------------------------------------------------------- file serving
    def _serve_repo_file(self, repo_id: str, revision: str, path: str, flavour: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, revision)
        entry = repo.files.get(path.strip("/"))
        if entry is None:
            raise HubError(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry.etag}"', "Vary": "Origin, Accept"}
        if entry.lfs:
            headers["X-Linked-Size"] = str(entry.size)
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
        if entry.lfs and self.hub.config.get("lfs_redirect") == "cdn" and self.hub.cdn_url:
            sig = hashlib.sha1(f"{entry.sha256}{commit}".encode()).hexdigest()[:32]
            location = (f"{self.hub.cdn_url}/cdn/{entry.sha256}/{repo.repo_id}/{quote(entry.path)}?"
                        + urlencode({"X-Amz-Expires": "3600", "X-Amz-Signature": sig}))
            headers["Location"] = location
            body = f"Found. Redirecting to {location}".encode()
            return self._send(302, body, headers, content_type="text/plain; charset=utf-8")
        self._serve_bytes(repo, entry, headers)

    def _cdn(self, sha256: str, repo_id: str, path: str) -> None:
        repo = self.hub.get_repo(repo_id)
        entry = repo.files.get(path) if repo else None
        if entry is None or entry.sha256 != sha256:
            denied = b"<Error><Code>AccessDenied</Code></Error>"
            return self._send(403, denied, content_type="application/xml")
        self._serve_bytes(repo, entry, {"ETag": f'"{entry.sha256}"'})  # type: ignore[arg-type]

    def _serve_bytes(self, repo: Repo, entry: FileEntry, headers: dict[str, str]) -> None:
        size = entry.size
        start, end = 0, size - 1
        status = 200
        range_header = self.headers.get("Range")
        if range_header:
            parsed = _parse_range(range_header, size)
            if parsed == "unsatisfiable":
                headers = {**headers, "Content-Range": f"bytes */{size}"}
                return self._send(416, b"", headers, content_type=None)
            if parsed is not None:
                start, end = parsed
                status = 206
        length = max(0, end - start + 1)
        name = entry.path.rsplit("/", 1)[-1]
        self.send_response(status)
        self.send_header("X-Request-Id", uuid.uuid4().hex)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        disposition = f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        self.send_header("Content-Disposition", disposition)
        self.send_header("Last-Modified", datetime.fromtimestamp(entry.mtime, tz=UTC)
                         .strftime("%a, %d %b %Y %H:%M:%S GMT"))
        for k, v in headers.items():
            self.send_header(k, v)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        assert self._entry is not None
        self._entry["status"] = status
        if self.command == "HEAD" or length == 0:
            return
        ctx = _Ctx(method=self.command, server=self.server.role, path=unquote(urlsplit(self.path).path),
                   repo=repo.repo_id, file=entry.path)
        drop = self.hub.take_rule("drop", ctx)
        drop_after = int(drop.params["after_bytes"]) if drop is not None else None
        if drop is not None:
            self._entry["injected"] = f"drop after {drop_after}"
        corrupt_at = self.hub.corrupt_offset(repo.repo_id, entry.path, size)
        if corrupt_at is not None:
            self._entry["injected"] = f"corrupt byte {corrupt_at}"
        sent = 0
        pos = start
        with entry.abspath.open("rb") as f:
            f.seek(start)
            while sent < length:
                rate = self.hub.rate_for(ctx)
                chunk = 1024 * 1024 if not rate else int(max(4096, min(1024 * 1024, rate / 20)))
                n = min(chunk, length - sent)
                if drop_after is not None:
                    n = min(n, drop_after - sent)
                    if n <= 0:
                        break
                data = f.read(n)
                if not data:
                    break
                if corrupt_at is not None and pos <= corrupt_at < pos + len(data):
                    buf = bytearray(data)
                    buf[corrupt_at - pos] ^= 0xFF
                    data = bytes(buf)
                self.wfile.write(data)
                sent += len(data)
                pos += len(data)
                self._entry["bytes_sent"] = sent
                if rate:
                    time.sleep(len(data) / rate)
        if sent < length:
            # Either a drop rule or the file shrank under us: cut the connection like a flaky network.
            self._cut = True
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------- HF API
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

    # ------------------------------------------------------------ ModelScope
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



# ------------------------------------------------------------------ helpers
def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """(start, end) inclusive, "unsatisfiable", or None to ignore the header."""
    h = header.strip().lower()
    if not h.startswith("bytes=") or "," in h:
        return None
    spec = h[len("bytes="):].strip()
    first, _, last = spec.partition("-")
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return max(0, size - n), size - 1
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size or start > end:
        return "unsatisfiable"
    return start, min(end, size - 1)


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


class HubServer:
    """Runs a Hub on 127.0.0.1 (hub listener + CDN listener) in background threads.

    >>> with HubServer([root]) as hub:          # doctest: +SKIP
    ...     os.environ["HF_ENDPOINT"] = hub.url
    """

    def __init__(self, roots: Iterable[str | Path], *, host: str = "127.0.0.1", port: int = 0,
                 cdn_port: int = 0, quiet: bool = True):
        self.hub = Hub(roots)
        self.host = host
        self._hub_srv = _Server((host, port), self.hub, "hub", quiet)
        self._cdn_srv = _Server((host, cdn_port), self.hub, "cdn", quiet)
        self.url = f"http://{host}:{self._hub_srv.server_address[1]}"
        self.cdn_url = f"http://{host}:{self._cdn_srv.server_address[1]}"
        self.hub.url, self.hub.cdn_url = self.url, self.cdn_url
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self._hub_srv.server_address[1])

    @property
    def roots(self) -> list[Path]:
        return self.hub.roots

    def start(self) -> HubServer:
        for srv in (self._hub_srv, self._cdn_srv):
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                 name=f"local-hub-{srv.role}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._hub_srv, self._cdn_srv):
            srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hub.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", default=[], help="repo root (repeatable; first wins)")
    parser.add_argument("--fixtures", action="store_true", help="also serve the standard fixture repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    parser.add_argument("--cdn-port", type=int, default=0)
    parser.add_argument("--lfs-redirect", choices=["cdn", "none"], default="cdn")
    parser.add_argument("--ready-file", help="write {url, cdn_url, pid} as JSON here once listening")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    roots = list(args.root)
    if args.fixtures:
        from tests.hub.fixtures import ensure_fixtures

        info = ensure_fixtures()
        for repo, reason in info.skipped.items():
            print(f"fixture {repo} skipped: {reason}", file=sys.stderr)
        roots.append(str(info.root))
    if not roots:
        parser.error("give --root DIR and/or --fixtures")
    server = HubServer(roots, host=args.host, port=args.port, cdn_port=args.cdn_port, quiet=not args.verbose)
    server.hub.config["lfs_redirect"] = args.lfs_redirect
    DEFAULT_CONFIG["lfs_redirect"] = args.lfs_redirect
    server.start()
    print(f"HUB_URL={server.url}\nCDN_URL={server.cdn_url}", flush=True)
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp"
        Path(tmp).write_text(json.dumps({"url": server.url, "cdn_url": server.cdn_url, "pid": os.getpid()}))
        os.replace(tmp, args.ready_file)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
