"""Models found in the user's extra models directory (GGUF files they already have).

Naming rules: a GGUF at the root is `extra.<file name>`; a folder holding one model (a main file
or one shard set, plus optional `mmproj*.gguf`) is `extra.<folder>`; a folder holding several
variants lists each as `extra.<file stem>`. When two places want the same name, the one whose
path sorts first keeps it and the others are named by their relative path (`a--b--model`), so
names do not depend on scan order and stay stable across restarts.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lemonade.backends.registry import recipe_for_format
from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.checkpoints.variants import is_mmproj, shard_info
from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.catalog")
PREFIX = "extra."


def _groups(files: list[Path]) -> list[list[Path]]:
    """Distinct models among a folder's main files: single files, or shard sets by prefix."""
    groups: dict[str, list[Path]] = {}
    for f in sorted(files):
        info = shard_info(f.name)
        key = f.name[: -len(f"-{info[0]:05d}-of-{info[1]:05d}.gguf")] if info else f.name
        groups.setdefault(key, []).append(f)
    return list(groups.values())


def _stem(group: list[Path]) -> str:
    name = group[0].name
    info = shard_info(name)
    return name[: -len(f"-{info[0]:05d}-of-{info[1]:05d}.gguf")] if info else name[: -len(".gguf")]


def scan_extra_dir(root: Path) -> list[ModelInfo]:
    if not root or not Path(root).is_dir():
        return []
    root = Path(root)
    candidates: list[tuple[str, str, list[Path], list[Path]]] = []  # (name, relpath key, files, mmproj)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        ggufs = [here / n for n in sorted(filenames) if n.lower().endswith(".gguf")]
        if not ggufs:
            continue
        mmprojs = [f for f in ggufs if is_mmproj(f.name)]
        mains = [f for f in ggufs if not is_mmproj(f.name)]
        groups = _groups(mains)
        rel = here.relative_to(root)
        if here == root:
            for group in groups:
                candidates.append((group[0].name, group[0].name, group, []))
        elif len(groups) == 1:
            candidates.append((here.name, rel.as_posix(), groups[0], mmprojs))
        else:
            for group in groups:
                candidates.append((_stem(group), (rel / _stem(group)).as_posix(), group, mmprojs))
    taken: set[str] = set()
    models: list[ModelInfo] = []
    for name, key, files, mmprojs in sorted(candidates, key=lambda c: (c[1].count("/"), c[1])):
        public = name if name not in taken else key.replace("/", "--")
        taken.add(public)
        model = _describe(PREFIX + public, files, mmprojs)
        if model is not None:
            models.append(model)
    return models


def _describe(name: str, files: list[Path], mmprojs: list[Path]) -> ModelInfo | None:
    try:
        info = gguf_info(files[0])
    except (OSError, GGUFError) as exc:
        log.warning("Skipping %s in the extra models dir: %s", files[0], exc)
        return None
    if info.is_mmproj:
        return None
    labels = ["custom"]
    if info.deployment_mode != "chat":
        labels.append(info.deployment_mode)
    local: dict[str, list[Path]] = {"main": files}
    if mmprojs:
        labels.append("vision")
        local["mmproj"] = mmprojs[:1]
    size = sum(f.stat().st_size for group in local.values() for f in group)
    return ModelInfo(name=name, recipe=recipe_for_format("gguf"), mode=info.deployment_mode, labels=labels,
                     size=round(size / 1e9, 3), suggested=False, source="local", origin="extra",
                     checkpoints={"main": str(files[0])}, local_files=local)
