"""The shared state of one hub: where its repos live, the test controls (rules, throttles,
config; tests/hub/admin.py sets them) and the request log.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.hub.repos import _HEX, COMMIT_NAME, HASH_CACHE_NAME, META_NAME, FileEntry, Repo, hash_file, iter_repo_files

DEFAULT_CONFIG: dict[str, Any] = {"lfs_redirect": "cdn", "tree_page_size": 1000, "models_page_size": 1000}


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
