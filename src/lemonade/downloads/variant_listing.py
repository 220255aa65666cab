"""`GET /v1/pull/variants`: the GGUF quantizations a repository offers, as an install form wants them.

Companion files are listed apart, never as variants: `mmproj_files` (vision projectors) and
`draft_files` (draft models beside the main model, `dflash-*` and `mtp-*`, as Lemonade lists them
since upstream 2505215d2): a pull that finds exactly one makes it the model's `draft` checkpoint.

Variant names are chosen so that pulling `repo:<name>` (variants.match_variant) selects exactly the
files listed here: a quant folder (`Q8_0/...`) is named after the folder, a file after the quant
suffix of its name (`...-UD-Q4_K_XL.gguf` -> `UD-Q4_K_XL`), anything else after its whole stem.

A repository without GGUFs that holds `<RepoName>.json` is a shared collection (custom-models.md,
"Share a collection"): `repo_kind` says which kind a repository is, so a client (`lemonade pull
org/<Collection>`) knows to send the collection's pointer rather than a variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lemonade.checkpoints.variants import is_draft_companion, is_mmproj, match_variant, shard_info
from lemonade.downloads.hub import RepoListing
from lemonade.recipes import recipe_for_format

PREFERRED = ("Q4_K_M", "UD-Q4_K_XL", "Q8_0", "Q4_0")  # most used in the built-in model list
TOP_N = 5
_QUANT_RE = re.compile(
    r"(?:^|[-_.])((?:UD-)?(?:[IT]?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|FP16|FP32|MXFP4(?:_[A-Z0-9]+)*))$",
    re.IGNORECASE)
_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$", re.IGNORECASE)


@dataclass
class Variant:
    name: str
    files: list[str]
    size_bytes: int

    @property
    def sharded(self) -> bool:
        return len(self.files) > 1 or any(shard_info(f) for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "primary_file": self.files[0], "files": list(self.files),
                "sharded": self.sharded, "size_bytes": self.size_bytes}


def variant_name(path: str) -> str:
    """The name that selects `path` when pulling `repo:<name>`."""
    parts = path.split("/")
    if len(parts) > 1 and _QUANT_RE.search("-" + parts[-2]):
        return parts[-2]
    stem = _SHARD_SUFFIX.sub("", parts[-1][: -len(".gguf")] if parts[-1].lower().endswith(".gguf") else parts[-1])
    match = _QUANT_RE.search(stem)
    return match.group(1) if match else stem


def _rank(name: str) -> tuple[int, str]:
    upper = [p.upper() for p in PREFERRED]
    return (upper.index(name.upper()), "") if name.upper() in upper else (len(PREFERRED), name)


def group_variants(paths: list[str], sizes: dict[str, int | None]) -> list[Variant]:
    """Every variant in the repository, ranked (preferred quants first, then by name)."""
    ggufs = [p for p in paths if p.lower().endswith(".gguf") and not is_mmproj(p) and not is_draft_companion(p)]
    names: dict[str, None] = {}
    for path in sorted(ggufs):
        names.setdefault(variant_name(path), None)
    out: list[Variant] = []
    claimed: set[tuple[str, ...]] = set()
    for name in sorted(names, key=_rank):
        files = match_variant(paths, name)
        if not files or tuple(files) in claimed:
            continue
        claimed.add(tuple(files))
        out.append(Variant(name, files, sum(sizes.get(f) or 0 for f in files)))
    return out


def describe_repo(listing: RepoListing, checkpoint: str) -> dict[str, Any]:
    paths = listing.paths()
    sizes = {f.path: f.size for f in listing.files}
    mmproj = sorted(p.rsplit("/", 1)[-1] for p in paths if is_mmproj(p) and p.lower().endswith(".gguf"))
    drafts = sorted(p.rsplit("/", 1)[-1] for p in paths if is_draft_companion(p))
    repo_lower = listing.repo.lower()
    labels = []
    if mmproj:
        labels.append("vision")
    if "embed" in repo_lower:
        labels.append("embeddings")
    if "rerank" in repo_lower:
        labels.append("reranking")
    return {
        "checkpoint": checkpoint,
        "source": listing.source,
        "recipe": recipe_for_format("gguf"),
        "repo_kind": "gguf",
        "suggested_name": listing.repo.split("/", 1)[1],
        "suggested_labels": labels,
        "mmproj_files": mmproj,
        "draft_files": drafts,
        "variants": [v.as_dict() for v in group_variants(paths, sizes)[:TOP_N]],
    }


def collection_file_name(listing: RepoListing) -> str | None:
    """`<RepoName>.json` when the repository is laid out as a shared collection (that file at its top,
    no GGUF beside it), else None."""
    name = listing.repo.split("/", 1)[1] + ".json"
    paths = listing.paths()
    if name in paths and not any(p.lower().endswith(".gguf") for p in paths):
        return name
    return None


def describe_collection(listing: RepoListing, checkpoint: str, recipe: str, components: list[str],
                        size: float | None) -> dict[str, Any]:
    """What `/pull/variants` says of a shared collection (as Lemonade's does): no variants, the recipe,
    how many components its file lists and, when the file gives it, its size in GB."""
    out: dict[str, Any] = {
        "checkpoint": checkpoint, "source": listing.source, "recipe": recipe, "repo_kind": "collection",
        "suggested_name": listing.repo.split("/", 1)[1], "suggested_labels": [], "mmproj_files": [],
        "variants": [], "component_count": len(components)}
    if size is not None:
        out["size"] = size
    return out
