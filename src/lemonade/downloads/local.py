"""What is on disk: model files in the Hugging Face cache layout.

`models--owner--repo/snapshots/<commit>/<file>` is only created by huggingface_hub once a file
is complete (partial data lives in `blobs/*.incomplete`), so a snapshot file's presence means the
file finished downloading. Integrity beyond that is checked when pulling (downloads/pull.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from lemonade.downloads.variants import match_variant, missing_shards, parse_checkpoint


def hub_cache_dir(models_dir: str = "") -> Path:
    """`models_dir` from config, else huggingface_hub's cache (honours HF_HOME / HF_HUB_CACHE)."""
    if models_dir:
        return Path(models_dir).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def snapshot_dirs(cache: Path, repo: str) -> list[Path]:
    """Snapshots of a repo, the one `refs/main` points at first, then newest first."""
    folder = repo_folder(cache, repo)
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


def resolve_local(cache: Path, checkpoint: str) -> tuple[Path, list[Path]] | None:
    """(snapshot dir, files) of a fully present checkpoint, main file first; None if incomplete."""
    try:
        ckpt = parse_checkpoint(checkpoint)
    except ValueError:
        return None
    for snap in snapshot_dirs(cache, ckpt.repo):
        files = list_snapshot_files(snap)
        chosen = match_variant(files, ckpt.variant)
        if chosen and not missing_shards(chosen):
            return snap, [snap / f for f in chosen]
    return None


def snapshot_commit(snapshot: Path) -> str:
    return snapshot.name
