"""Checkpoint strings and GGUF variant selection, shared by listing (offline) and pulling (online).

A checkpoint is `owner/repo`, `owner/repo:VARIANT` (a quantization such as `Q4_K_M`, matched
against file names or a variant folder), `owner/repo:path/file.ext` (one exact file) or
`owner/repo:folder/` (every file under that folder, e.g. Kokoro's `voices/`) or `owner/repo:*` (every
GGUF of the repository: a model published as one shard set, e.g. ggml-org's gpt-oss-120b).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHARD_RE = re.compile(r"[-._](\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # `-`, `.` or `_` before the index
# A quantization named anywhere in a file name, between separators (`Model-Q4_K_M-imatrix.gguf`,
# `x.UD-Q4_K_XL.gguf`, `m-IQ4_XS-00001-of-00002.gguf`).
_QUANT_TOKEN_RE = re.compile(
    r"(?:^|[-._/])((?:UD[-_])?(?:Q\d+(?:_\d)?(?:_K)?(?:_(?:M|S|L|XL|XXL))?|IQ\d+(?:_(?:M|S|L|XS|XXS|NL))?|"
    r"F16|F32|BF16|MXFP\d+(?:_MOE)?))(?=[-._/]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Checkpoint:
    repo: str
    variant: str | None

    def __str__(self) -> str:
        return f"{self.repo}:{self.variant}" if self.variant else self.repo


def parse_checkpoint(text: str) -> Checkpoint:
    """Split `owner/repo[:variant]`; raises ValueError naming what is malformed."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("checkpoint must be a non-empty string like 'owner/repo:Q4_K_M'")
    repo, _, variant = text.strip().partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise ValueError(f"checkpoint '{text}' must name a repository as 'owner/repo'")
    return Checkpoint(repo, variant or None)


def is_mmproj(path: str) -> bool:
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


def is_draft_companion(path: str) -> bool:
    """A draft model published beside its main model, named as Lemonade's pulls recognise them
    (upstream 2505215d2): `dflash-*.gguf` / `dflash.gguf` (a DFlash drafter) and `mtp-*.gguf` (an MTP
    head, e.g. unsloth's Gemma 4 assistants). `My-MTP-Model-Q8_0.gguf` is a main model."""
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and (name.startswith(("dflash-", "mtp-")) or name == "dflash.gguf")


def _is_model_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf") and not is_mmproj(path) and not is_draft_companion(path)


def quant_token(name: str) -> str | None:
    """The quantization a file name states (upper case), or None."""
    m = _QUANT_TOKEN_RE.search(name)
    return m.group(1).upper() if m else None


def shard_info(path: str) -> tuple[int, int] | None:
    """(index, count) for `...-0000N-of-0000M.gguf` (or `.0000N-`, `_0000N-`), else None."""
    m = _SHARD_RE.search(path)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _strip_shard(name: str) -> str:
    return _SHARD_RE.sub(".gguf", name)


def is_exact_file_variant(variant: str) -> bool:
    return "/" in variant or "." in variant.rsplit("/", 1)[-1]


def match_variant(files: list[str], variant: str | None) -> list[str]:
    """Repo-relative files that make up `variant`, main file first; [] when nothing matches.

    `None` means the whole repository (its model GGUFs first); `*` its GGUF files (mmproj files and
    draft companions aside); `folder/` every file under it. A file variant matches that path (or a
    unique basename). A quantization matches a variant folder (`Q8_0/...`) or files whose name, shard
    suffix removed, ends in `-Q4_K_M.gguf` / `.Q4_K_M.gguf` / `_Q4_K_M.gguf`; mmproj files and draft
    companions (`is_draft_companion`) never match.
    """
    if variant is None:  # a GGUF repository's model file is its main file, whatever sorts first
        return sorted(files, key=lambda f: (not _is_model_gguf(f), f))
    if variant == "*":
        return sorted(f for f in files if _is_model_gguf(f))
    if variant.endswith("/"):
        return sorted(f for f in files if f.startswith(variant))
    if is_exact_file_variant(variant):
        if variant in files:
            return [variant]
        same_base = [f for f in files if f.rsplit("/", 1)[-1] == variant]
        return same_base if len(same_base) == 1 else []
    low = variant.lower()
    ggufs = [f for f in files if _is_model_gguf(f)]
    in_folder = [f for f in ggufs if "/" in f and f.rsplit("/", 1)[0].split("/")[-1].lower() == low]
    if in_folder:
        chosen = in_folder
    else:
        pattern = re.compile(r"(^|[-_./])" + re.escape(low) + r"\.gguf$")
        chosen = [f for f in ggufs if pattern.search(_strip_shard(f.lower()))]
    if not chosen:
        return []
    # Keep one group: a single file, or one complete-looking shard set.
    singles = [f for f in chosen if shard_info(f) is None]
    shards = sorted(f for f in chosen if shard_info(f) is not None)
    if singles and not shards:
        return [sorted(singles, key=len)[0]]
    if shards:
        first_prefix = _SHARD_RE.sub("", shards[0])
        return [f for f in shards if _SHARD_RE.sub("", f) == first_prefix]
    return sorted(chosen)


def missing_shards(files: list[str]) -> bool:
    """True when `files` is a shard set with gaps (e.g. 1 and 3 of 3 present)."""
    infos = [shard_info(f) for f in files]
    if not infos or any(i is None for i in infos):
        return False
    count = infos[0][1]  # type: ignore[index]
    return sorted(i[0] for i in infos) != list(range(1, count + 1))  # type: ignore[index]
