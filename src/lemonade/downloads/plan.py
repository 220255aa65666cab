"""Which remote files make up a model: every checkpoint role resolved against its repository listing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lemonade.checkpoints.local import repo_folder
from lemonade.checkpoints.variants import is_exact_file_variant, match_variant, missing_shards, parse_checkpoint
from lemonade.downloads.hub import HubError, RemoteFile, RepoListing, list_repo
from lemonade.downloads.variant_listing import group_variants
from lemonade.model_info import ModelInfo


@dataclass(frozen=True)
class PlannedFile:
    role: str
    listing: RepoListing
    remote: RemoteFile
    folder: Path

    @property
    def size(self) -> int:
        return self.remote.size or 0


def available_variants(paths: list[str]) -> list[str]:
    return [v.name for v in group_variants(paths, {})]


def plan_model(model: ModelInfo, cache: Path) -> list[PlannedFile]:
    """Files to fetch for `model`, main checkpoint first; HubError names what does not exist."""
    listings: dict[str, RepoListing] = {}
    out: list[PlannedFile] = []
    seen: set[tuple[str, str]] = set()
    roles = sorted(model.file_checkpoints.items(), key=lambda kv: kv[0] != "main")
    for role, text in roles:
        ckpt = parse_checkpoint(text)
        if ckpt.repo not in listings:
            listings[ckpt.repo] = list_repo(model.source, ckpt.repo)
        listing = listings[ckpt.repo]
        chosen = match_variant(listing.paths(), ckpt.variant)
        if not chosen:
            if ckpt.variant and is_exact_file_variant(ckpt.variant):
                raise HubError(404, f"Model {model.public}: file '{ckpt.variant}' ({role}) is not in repository "
                                    f"{ckpt.repo}")
            known = available_variants(listing.paths())
            hint = f" Available variants: {', '.join(known)}." if known else " It holds no GGUF variants."
            raise HubError(404, f"Model {model.public}: repository {ckpt.repo} has no files for variant "
                                f"'{ckpt.variant}' ({role}).{hint}")
        if missing_shards(chosen):
            raise HubError(404, f"Model {model.public}: the shard set for '{text}' is incomplete in {ckpt.repo}")
        folder = repo_folder(cache, ckpt.repo, model.source)
        for path in chosen:
            if (ckpt.repo, path) in seen:
                continue
            seen.add((ckpt.repo, path))
            out.append(PlannedFile(role, listing, listing.get(path), folder))
    return out
