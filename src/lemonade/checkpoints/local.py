"""What is on disk: model files in the Hugging Face cache layout.

`models--owner--repo/snapshots/<commit>/<file>` (ModelScope: `modelscope--models--owner--repo`,
so the two registries never collide) is only created once a file is complete and verified
(partial data lives in `blobs/<etag>.incomplete`), so a snapshot file's presence means the file
finished downloading.

A multi-file download (a whole repository, a shard set) can be interrupted between two files, so
while a pull is under way it lists the files it still has to fetch in a pending marker,
`<repo folder>/.lemonade-pending/<commit>.<id>.json`. A snapshot with a pending file of the
requested set does not count as downloaded; the marker is removed once every file is verified.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lemonade.checkpoints.variants import match_variant, missing_shards, parse_checkpoint

PENDING_DIR = ".lemonade-pending"


def hub_cache_dir(models_dir: str = "") -> Path:
    """`models_dir` from config, else (also for "auto", as Lemonade's guide writes it) huggingface_hub's
    cache, which honours HF_HUB_CACHE / HF_HOME."""
    if models_dir and models_dir != "auto":
        return Path(models_dir).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(cache: Path, repo: str, source: str = "huggingface") -> Path:
    prefix = "modelscope--models--" if source == "modelscope" else "models--"
    return cache / (prefix + repo.replace("/", "--"))


def snapshot_dirs(cache: Path, repo: str, source: str = "huggingface") -> list[Path]:
    """Snapshots of a repo, the one `refs/main` points at first, then newest first."""
    folder = repo_folder(cache, repo, source)
    snaps = folder / "snapshots"
    if not snaps.is_dir():
        return []
    dirs = sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    ref = folder / "refs" / "main"
    if ref.is_file():
        head = ref.read_text().strip()
        dirs.sort(key=lambda p: p.name != head)
    return dirs


def list_snapshot_files(snapshot: Path) -> list[str]:
    out = []
    for root, _dirs, names in os.walk(snapshot):
        for name in names:
            full = Path(root) / name
            if full.exists():  # a dangling symlink is not a file we have
                out.append(full.relative_to(snapshot).as_posix())
    return out


def pending_files(folder: Path) -> dict[str, set[str]]:
    """commit -> repo-relative files that a pull (running or interrupted) has not verified yet."""
    pending_dir = folder / PENDING_DIR
    out: dict[str, set[str]] = {}
    if not pending_dir.is_dir():
        return out
    for marker in pending_dir.glob("*.json"):
        try:
            data = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue  # being written (atomic rename) or damaged: ignore rather than guess
        if isinstance(data, dict) and isinstance(data.get("commit"), str):
            out.setdefault(data["commit"], set()).update(str(f) for f in data.get("files") or [])
    return out


def resolve_local(cache: Path, checkpoint: str, source: str = "huggingface") -> tuple[Path, list[Path]] | None:
    """(snapshot dir, files) of a fully present checkpoint, main file first; None if incomplete."""
    try:
        ckpt = parse_checkpoint(checkpoint)
    except ValueError:
        return None
    snaps = snapshot_dirs(cache, ckpt.repo, source)
    if not snaps:
        return None
    pending = pending_files(repo_folder(cache, ckpt.repo, source))
    for snap in snaps:
        files = list_snapshot_files(snap)
        chosen = match_variant(files, ckpt.variant)
        if not chosen or missing_shards(chosen):
            continue
        unfinished = pending.get(snap.name, set()) - set(files)  # links only appear once verified
        if unfinished and unfinished.intersection(match_variant(sorted(set(files) | unfinished), ckpt.variant)):
            continue
        return snap, [snap / f for f in chosen]
    return None


def snapshot_commit(snapshot: Path) -> str:
    return snapshot.name
