"""Writing the Hugging Face cache layout: blobs, snapshot links, refs, pending markers, deletion.

Layout of one repository folder (see local.py for the reading side)::

    blobs/<etag>                    verified file content
    blobs/<etag>.incomplete         a partial download, resumed with an HTTP Range request
    snapshots/<commit>/<path>       relative symlink to ../../blobs/<etag>, created after verification
    refs/main                       the commit of the last complete pull
    .lemonade_registry.json         provenance: the registry, and per model the snapshot its last pull processed
    .lemonade-pending/<commit>.<key>.json   files a pull still has to verify (and their etags)

Deleting a model removes its snapshot links, except those of files another model still uses (the
caller names those models' checkpoints in this repo), then every blob (complete or partial) that no
snapshot link and no pending marker still refers to, so files shared with another model survive.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Collection
from pathlib import Path

from lemonade.checkpoints.local import PENDING_DIR, list_snapshot_files, pending_files, repo_folder
from lemonade.checkpoints.variants import match_variant, parse_checkpoint
from lemonade.util.atomic import atomic_write_bytes, atomic_write_json

log = logging.getLogger("lemonade.downloads")


def blob_path(folder: Path, etag: str) -> Path:
    return folder / "blobs" / etag


def partial_path(folder: Path, etag: str) -> Path:
    return folder / "blobs" / f"{etag}.incomplete"


def snapshot_path(folder: Path, commit: str, relpath: str) -> Path:
    return folder / "snapshots" / commit / relpath


def link_into_snapshot(folder: Path, commit: str, relpath: str, etag: str) -> Path:
    """Point `snapshots/<commit>/<relpath>` at the blob (relative link, like huggingface_hub)."""
    link = snapshot_path(folder, commit, relpath)
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob_path(folder, etag), link.parent)
    tmp = link.with_name(f".{link.name}.lemonade-link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(target, tmp)
    except OSError:  # no symlinks on this filesystem: a copy is what huggingface_hub falls back to
        shutil.copyfile(blob_path(folder, etag), tmp)
    os.replace(tmp, link)
    return link


def write_ref(folder: Path, commit: str) -> None:
    atomic_write_bytes(folder / "refs" / "main", commit.encode())


REGISTRY_FILE = ".lemonade_registry.json"


def write_provenance(folder: Path, model_name: str, commit: str, source: str, checkpoint: str) -> None:
    """Record which registry a repository came from and the snapshot a pull of `model_name` processed,
    where Lemonade keeps it (tools that read a shared cache look there). A file that cannot be read
    is replaced: it is a record of pulls, not state anything depends on."""
    path = folder / REGISTRY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or not isinstance(data.get("processed_models"), dict):
        data = {"processed_models": {}}
    data["registry_source"] = source
    data["processed_models"][model_name] = {"snapshot_id": commit, "checkpoint": checkpoint}
    atomic_write_json(path, data)


def pending_key(model_name: str) -> str:
    return hashlib.sha1(model_name.encode()).hexdigest()[:12]


def write_pending(folder: Path, commit: str, key: str, model_name: str, etags: dict[str, str]) -> None:
    """Record the files (path -> etag) a pull of `model_name` has yet to verify in this repo."""
    marker = folder / PENDING_DIR / f"{commit}.{key}.json"
    if not etags:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        with contextlib.suppress(OSError):
            marker.parent.rmdir()  # only when empty
        return
    data = {"commit": commit, "model": model_name, "files": sorted(etags), "etags": etags}
    try:
        atomic_write_json(marker, data)
    except FileNotFoundError:  # another pull removed the (then empty) folder in between: once more
        atomic_write_json(marker, data)


def clear_pending(folder: Path, key: str) -> None:
    pending_dir = folder / PENDING_DIR
    if pending_dir.is_dir():
        for marker in pending_dir.glob(f"*.{key}.json"):
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
        with contextlib.suppress(OSError):
            pending_dir.rmdir()  # only when empty


def _pending_markers(folder: Path) -> list[dict]:
    out = []
    pending_dir = folder / PENDING_DIR
    if pending_dir.is_dir():
        for marker in pending_dir.glob("*.json"):
            try:
                data = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                data["_path"] = marker
                out.append(data)
    return out


def _linked_etags(folder: Path) -> set[str]:
    """Blob names that some snapshot link still points to."""
    out: set[str] = set()
    snaps = folder / "snapshots"
    if not snaps.is_dir():
        return out
    for root, _dirs, names in os.walk(snaps):
        for name in names:
            path = Path(root) / name
            if path.is_symlink():
                out.add(os.path.basename(os.readlink(path)))
    return out


def _unlink_checkpoint(folder: Path, variant: str | None, keep_commit: str | None = None,
                       keep_variants: Collection[str | None] = ()) -> int:
    """Remove the snapshot entries a checkpoint selects, in every snapshot but `keep_commit`, except
    the files that one of `keep_variants` (other models' checkpoints in this repo) selects."""
    freed = 0
    snaps = folder / "snapshots"
    for snap in (p for p in snaps.iterdir() if p.is_dir() and p.name != keep_commit) if snaps.is_dir() else []:
        names = list_snapshot_files(snap)
        dangling = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_symlink() and not p.exists()]
        present = sorted(set(names) | set(dangling))
        kept = {rel for other in keep_variants for rel in match_variant(names, other)}
        for rel in (r for r in match_variant(present, variant) if r not in kept):
            path = snap / rel
            if not path.is_symlink():
                with contextlib.suppress(OSError):
                    freed += path.stat().st_size
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        _prune_empty_dirs(snap)
    return freed


def remove_checkpoint(cache: Path, checkpoint: str, source: str, key: str,
                      keep_variants: Collection[str | None] = ()) -> int:
    """Remove one checkpoint's files (every snapshot, partial downloads included) but those that
    `keep_variants` (other models' checkpoints in the same repo) select; bytes freed."""
    ckpt = parse_checkpoint(checkpoint)
    folder = repo_folder(cache, ckpt.repo, source)
    if not folder.is_dir():
        return 0
    freed = _unlink_checkpoint(folder, ckpt.variant, keep_variants=keep_variants)
    # Our own pending markers go; another model's marker keeps the partial files it is still fetching.
    clear_pending(folder, key)
    freed += gc_repo(folder)
    return freed


def prune_old_snapshots(cache: Path, checkpoint: str, source: str, keep_commit: str) -> int:
    """After an update: drop the checkpoint's files from older snapshots, and blobs left unused."""
    ckpt = parse_checkpoint(checkpoint)
    folder = repo_folder(cache, ckpt.repo, source)
    snaps = folder / "snapshots"
    if not snaps.is_dir() or not any(p.name != keep_commit for p in snaps.iterdir()):
        return 0
    return _unlink_checkpoint(folder, ckpt.variant, keep_commit) + gc_repo(folder)


def gc_repo(folder: Path) -> int:
    """Delete blobs nothing refers to any more; remove the repo folder when nothing is left."""
    keep = _linked_etags(folder)
    for marker in _pending_markers(folder):
        keep.update(str(e) for e in (marker.get("etags") or {}).values())
    freed = 0
    blobs = folder / "blobs"
    if blobs.is_dir():
        for blob in blobs.iterdir():
            etag = blob.name.split(".", 1)[0]
            if etag in keep:
                continue
            with contextlib.suppress(OSError):
                freed += blob.stat().st_size
                blob.unlink()
    snaps = folder / "snapshots"
    if snaps.is_dir():
        for snap in list(snaps.iterdir()):
            _prune_empty_dirs(snap)
    has_snapshots = snaps.is_dir() and any(snaps.iterdir())
    has_blobs = blobs.is_dir() and any(blobs.iterdir())
    if not has_snapshots and not has_blobs and not pending_files(folder):
        shutil.rmtree(folder, ignore_errors=True)
    return freed


def _prune_empty_dirs(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    for path in sorted((p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()),
                       key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def disk_free(path: Path) -> int | None:
    for candidate in [path, *path.parents]:
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None
