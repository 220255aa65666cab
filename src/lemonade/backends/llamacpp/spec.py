"""Speculative decoding for llama-server: which `--spec-type` a model is started with, and why.

llama-server (b11312) speculates with a draft model (`--model-draft`: a model's `draft` checkpoint,
as `draft-simple`, `draft-mtp` or `draft-dflash`), with the MTP heads inside an `mtp` model, or
without any second model, from n-grams of the text already in the context (`ngram-*`). Which one a
model gets:

- a `draft` checkpoint: a DFlash drafter (`dflash-*.gguf`) with the `dflash` label runs
  `draft-dflash`, with the `mtp` label `draft-mtp` (Gemma 4's assistant GGUFs), any other draft
  model `draft-simple` (without a type llama-server loads the draft model and never uses it);
  a DFlash drafter without the `dflash` label is not used (as upstream Lemonade);
- the `mtp` label without a draft checkpoint: `draft-mtp` on the model's own MTP heads;
- any other chat model: draftless n-gram speculation (`NGRAM_ARGS`), which every model can have.

The `speculation` option decides whether the model speculates at all: `on`, `off`, or `auto` (the
default), where the server's controller (runtime/speculation.py) keeps it on only while it earns
speed; its verdict reaches this module as `wanted`. A `--spec-type` of the user's own in
`llamacpp_args` is theirs: it is passed on as it is, and nothing here or in the controller changes it.

The pinned llama-server takes no speculative parameters per request (server-schema.cpp has them
under `#if 0`), so speculation is switched per engine: a different verdict takes effect when the
model is started again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.engine import Speculation, flags_of

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

SPEC_TYPE_FLAG = "--spec-type"
# Draftless n-gram speculation. ngram-map-k finds the last 12 tokens earlier in the context and
# proposes the (up to) 48 that followed them there: it drafts only where text repeats (an edit of a
# document in the prompt, code rewritten with a rename, a list continued), so elsewhere it costs a
# lookup per token and nothing else; and it proposes no more tokens after a key than the model accepted
# there last time, so drafts that fail shrink. Chosen over ngram-simple (same speed-up, fewer drafted
# tokens accepted), ngram-mod and shorter n-grams by measurement (docs/performance.md).
# At most 16 drafted tokens (b11312's default is 48): llama-server keeps the logits of every drafted token
# of every slot (a MiB each with Gemma 3's 262k vocabulary, so 392 MiB for 8 slots at 48), which the
# memory estimate counts (backends/llamacpp/memory.py)
NGRAM_DRAFT_MAX = 16
NGRAM_ARGS = [SPEC_TYPE_FLAG, "ngram-map-k", "--spec-ngram-map-k-size-m", str(NGRAM_DRAFT_MAX)]
DRAFT_N_MAX = 3  # ... and a draft model (--spec-draft-n-max, b11312's default)
MTP_ARGS = [SPEC_TYPE_FLAG, "draft-mtp"]  # no draft-length defaults, as upstream since 7715e9e92
DFLASH_ARGS = [SPEC_TYPE_FLAG, "draft-dflash"]
DRAFT_ARGS = [SPEC_TYPE_FLAG, "draft-simple"]


def is_dflash_draft(path: Path) -> bool:
    """A DFlash drafter (`dflash-*.gguf`, as upstream names them): used only with the `dflash` label,
    which selects llama.cpp's DFlash speculative decoding for it."""
    name = path.name.lower()
    return name.startswith("dflash-") or name == "dflash.gguf"


def draft_tokens_max(files: dict[str, list[Path]], options: dict[str, Any], mode: str) -> int:
    """The most tokens one slot may draft at once with this load's speculation (0: none), for the memory
    estimate: llama-server keeps the logits of a slot's drafted tokens too. Counted unless the option
    says off (in `auto` the controller may turn it on); a user's own draft lengths are not read."""
    if mode != "chat" or options.get("speculation") == "off":
        return 0
    return DRAFT_N_MAX if files.get("draft") else NGRAM_DRAFT_MAX


def _own_type(user_args: list[str]) -> str | None:
    """The user's own `--spec-type` value in `llamacpp_args`, if any."""
    for i, token in enumerate(user_args):
        flag, eq, inline = token.partition("=")
        if flag == SPEC_TYPE_FLAG:
            return inline if eq else (user_args[i + 1] if i + 1 < len(user_args) else "")
    return None


def _value(args: list[str]) -> str:
    return args[args.index(SPEC_TYPE_FLAG) + 1]


def speculation_args(model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any], user_args: list[str],
                     wanted: bool = True) -> tuple[list[str], Speculation]:
    """The flags that give `model` its speculative decoding, and what it runs. `options`: the
    load's (`speculation`: auto, on or off); `wanted`: the controller's verdict, for `auto` only."""
    mode = str(options.get("speculation") or "auto")
    draft = next(iter(files.get("draft", [])), None)
    dflash = draft is not None and is_dflash_draft(draft)
    usable = draft if draft is not None and (not dflash or "dflash" in model.labels) else None
    own = _own_type(user_args) if SPEC_TYPE_FLAG in flags_of(user_args) else None
    if own is not None:  # the user's own choice; the draft model is ours to give (--model-draft is refused)
        if own == "none" or not usable:
            return [], Speculation(None if own == "none" else own, "args")
        return ["--model-draft", str(usable)], Speculation(own, "args")
    if model.mode != "chat" or mode == "off" or (mode == "auto" and not wanted):
        return [], Speculation(None, mode if model.mode == "chat" else "off")
    if usable is not None:
        args = DFLASH_ARGS if dflash else MTP_ARGS if "mtp" in model.labels else DRAFT_ARGS
        return ["--model-draft", str(usable), *args], Speculation(_value(args), mode)
    args = MTP_ARGS if "mtp" in model.labels else NGRAM_ARGS
    return list(args), Speculation(_value(args), mode)
