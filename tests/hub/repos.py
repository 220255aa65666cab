"""Repos on disk, as the hub serves them: files, hashes, commits, LFS.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
