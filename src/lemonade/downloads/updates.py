"""Are downloaded models behind their registry? (`POST /v1/models/check-updates`, startup check.)

A model has an update when the registry's current commit selects different files for one of
its checkpoints than the ones on disk: another file set, or a file whose content hash (the blob
name the snapshot link points to) changed. A new commit that only touched unrelated files (a
README, another quantization) is not an update for this model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lemonade.checkpoints.local import resolve_local
from lemonade.checkpoints.variants import match_variant, parse_checkpoint
from lemonade.downloads.hub import HubError, RepoListing, list_repo
from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.downloads")


def _local_etag(path: Path) -> str | None:
    if path.is_symlink():
        return os.path.basename(os.readlink(path))
    return None


def checkpoint_outdated(cache: Path, source: str, checkpoint: str, listing: RepoListing) -> bool:
    found = resolve_local(cache, checkpoint, source)
    if found is None:
        return False
    snapshot, files = found
    if snapshot.name == listing.commit:
        return False
    ckpt = parse_checkpoint(checkpoint)
    remote = match_variant(listing.paths(), ckpt.variant)
    local = [f.relative_to(snapshot).as_posix() for f in files]
    if sorted(remote) != sorted(local):
        return bool(remote)  # the variant vanished upstream: nothing newer to fetch
    for rel in local:
        etag = _local_etag(snapshot / rel)
        if etag is not None and etag != listing.get(rel).etag:
            return True
    return False


def find_updates(models: list[ModelInfo], cache: Path) -> tuple[set[str], list[str]]:
    """(names of models with updates, problems met); one registry call per repository."""
    listings: dict[tuple[str, str], RepoListing | None] = {}
    problems: list[str] = []
    outdated: set[str] = set()
    for model in models:
        for checkpoint in model.file_checkpoints.values():
            repo = parse_checkpoint(checkpoint).repo
            key = (model.source, repo)
            if key not in listings:
                try:
                    listings[key] = list_repo(model.source, repo)
                except HubError as exc:
                    problems.append(exc.message)
                    log.warning("Update check skipped %s: %s", repo, exc.message)
                    listings[key] = None
            listing = listings[key]
            if listing is not None and checkpoint_outdated(cache, model.source, checkpoint, listing):
                outdated.add(model.name)
    return outdated, problems
