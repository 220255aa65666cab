"""Models found in the user's extra models directory (GGUF files they already have).

Naming (guide-configuration-custom-models.md: every such model is `extra.NAME`; how NAME is
chosen follows Lemonade's extra-models-dir rules, src/cpp/Extra-Models-Dir-Spec.md upstream):

- a GGUF at the root is named by its stem: `Qwen3-8B-Q4_K_M.gguf` -> `extra.Qwen3-8B-Q4_K_M`;
  a shard set (`x-00001-of-00003.gguf`, ...) is one model named by its series, `extra.x`;
- a folder is split into one model per variant when it holds several and every one of them names
  its quantization (`Qwen3-8B-Q4_K_M.gguf`, `Qwen3-8B-Q8_0.gguf` -> `extra.Qwen3-8B-Q4_K_M`,
  `extra.Qwen3-8B-Q8_0`; a shard set counts as one variant, named by its series). The folder name
  stays accepted (bare or `extra.`, never listed) for the variant of the first file by name, so old
  requests keep working, and it takes that name from a built-in model as any extra model would;
- any other folder (one model, one shard set, or files that do not all name a quantization) is one
  model, `extra.<folder>`, served from its first file (a shard set's first shard) by name; a Hugging
  Face cache snapshot (`models--org--repo/snapshots/<commit>/`) is named after its repo when
  `refs/main` points at that commit;
- shard sets are files naming the same series (`-`, `.` or `_` before `00001-of-00003`); sharing a
  quantization is not enough (`Model-Q4_K_M.gguf` and `Model-Q4_K_M-imatrix.gguf` are two models);
- `mmproj*.gguf` files are never models: the first one by name is the projector of every model in
  its folder, which gets the `vision` label (at the root they are ignored);
- when two models want one name, root files claim first, then folders in sorted path order; a later
  claimant is qualified with the folder that groups it (`<folder>-<name>`, then `-2`, `-3`...), so a
  name always means the same file across restarts, whatever order the disk lists files in.

A model's checkpoint is its file (a folder model's: the folder), its size the GiB of its files (a
folder model's: every GGUF in the folder), as Lemonade reports them. Each root file also answers to
its old id `extra.<file name>.gguf` (hidden, never listed).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.checkpoints.variants import is_mmproj, quant_token, shard_info
from lemonade.model_info import ModelInfo
from lemonade.recipes import recipe_for_format

log = logging.getLogger("lemonade.catalog")
PREFIX = "extra."
GIB = 1024 ** 3  # sizes in GiB, as Lemonade reports extra models


@dataclass
class _Candidate:
    name: str                 # wanted bare name
    qualifier: str            # folder name used when `name` is taken
    files: list[Path]         # the main file, or the shard set in order
    mmprojs: list[Path]
    hidden: list[str]         # extra input names (not listed)
    checkpoint: Path | None = None  # what the model is shown as, when not its first file (a folder model)
    size_files: list[Path] | None = None  # the files its size counts, when not its own files and projector


def series_stem(file_name: str) -> str:
    """`model-Q4_K_M-00001-of-00003.gguf` -> `model-Q4_K_M`; `x.gguf` -> `x`."""
    info = shard_info(file_name)
    if info:
        return file_name[: -len(f"-{info[0]:05d}-of-{info[1]:05d}.gguf")]
    return file_name[: -len(".gguf")] if file_name.lower().endswith(".gguf") else file_name


def _groups(files: list[Path]) -> list[list[Path]]:
    """Distinct models among a folder's main files: single files, or shard sets by series."""
    groups: dict[str, list[Path]] = {}
    for f in sorted(files):
        key = series_stem(f.name) if shard_info(f.name) else f.name
        groups.setdefault(key, []).append(f)
    return list(groups.values())


def _folder_name(here: Path) -> str:
    """A folder's model name: its own name, or the repo's for the `refs/main` snapshot of a Hugging
    Face (or ModelScope) cache folder moved in as it is."""
    repo_dir = here.parent.parent
    if here.parent.name == "snapshots" and repo_dir.name.startswith(("models--", "modelscope--models--")):
        try:
            main = (repo_dir / "refs" / "main").read_text().strip()
        except OSError:
            main = ""
        if main == here.name:
            return repo_dir.name.split("--")[-1]
    return here.name


def _folder_candidates(root: Path, here: Path, ggufs: list[Path]) -> list[_Candidate]:
    mmprojs = [f for f in ggufs if is_mmproj(f.name)]
    groups = _groups([f for f in ggufs if not is_mmproj(f.name)])
    if not groups:
        return []
    folder = _folder_name(here)
    if len(groups) > 1 and all(quant_token(g[0].name) for g in groups):  # named variants: one model each
        return [_Candidate(series_stem(g[0].name), folder, g, mmprojs, [PREFIX + folder] if i == 0 else [])
                for i, g in enumerate(groups)]
    parent = here.parent
    if folder != here.name:  # a cache snapshot: grouped by its org (`models--org--repo`)
        qualifier = parent.parent.name.split("--")[-2]
    else:
        qualifier = parent.name if parent != root else folder
    return [_Candidate(folder, qualifier, groups[0], mmprojs, [], checkpoint=here, size_files=ggufs)]


def _candidates(root: Path) -> list[_Candidate]:
    root_files: list[_Candidate] = []
    folders: list[tuple[str, list[_Candidate]]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        ggufs = [here / n for n in sorted(filenames) if n.lower().endswith(".gguf")]
        if not ggufs:
            continue
        if here == root:
            groups = _groups([f for f in ggufs if not is_mmproj(f.name)])
            root_files += [_Candidate(series_stem(g[0].name), "", g, [], [PREFIX + g[0].name]) for g in groups]
        else:
            folders.append((here.relative_to(root).as_posix(), _folder_candidates(root, here, ggufs)))
    return root_files + [c for _, found in sorted(folders, key=lambda f: f[0]) for c in found]


def scan_extra_dir(root: Path | None) -> list[ModelInfo]:
    if not root or not Path(root).is_dir():
        return []
    taken: set[str] = set()
    models: list[ModelInfo] = []
    for cand in _candidates(Path(root)):
        name = cand.name
        if name in taken:
            base = f"{cand.qualifier}-{cand.name}" if cand.qualifier else cand.name
            name, n = base, 2
            while name in taken:
                name, n = f"{base}-{n}", n + 1
        taken.add(name)
        model = _describe(PREFIX + name, cand)
        if model is not None:
            model.hidden_names = list(cand.hidden)
            models.append(model)
    return models


def _describe(name: str, cand: _Candidate) -> ModelInfo | None:
    files = cand.files
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
    checkpoints = {"main": str(cand.checkpoint or files[0])}
    if cand.mmprojs:
        labels.append("vision")
        local["mmproj"] = cand.mmprojs[:1]
        checkpoints["mmproj"] = cand.mmprojs[0].name
    counted = cand.size_files if cand.size_files is not None else files
    size = sum(f.stat().st_size for f in counted)
    return ModelInfo(name=name, recipe=recipe_for_format("gguf"), mode=info.deployment_mode, labels=labels,
                     size=round(size / GIB, 3), suggested=False, source="local", origin="extra",
                     checkpoints=checkpoints, local_files=local)
