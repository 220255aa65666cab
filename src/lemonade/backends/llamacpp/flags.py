"""Which llama-server flags a user may pass, and which ones the installed binary knows.

The rule for `llamacpp_args` from a request or a model's saved options (any API key holder can set
those): **no flag may make the engine read or write a path, or open a network address, that the
admin did not configure.** So flags that take a path or an address are refused, each with the
reason (`PATH_FLAGS`, `ADDRESS_FLAGS`); `--slot-save-path` is confined to a folder under the
server's own slot folder; flags that only tune memory, threads, batching, offload, sampling,
speculative decoding, the cache or logging verbosity (`SAFE_FLAGS`, taken from the pinned build's
`--help`, b11312) are accepted, `--no-mmap`, `--mlock` and `-ngl N` among them. A flag in none of
these lists is refused too: it has not been shown to touch neither files nor the network.

Paths the engine needs (model, projector, template) are ours to choose. The server-wide
`llamacpp.args` is an admin setting and may use any flag but the ones we set ourselves. Either way a
flag the installed `llama-server` does not know is refused with a 400 before it can make every later
load fail, after the documented spellings the pinned build renamed (`--no-mmap`, `--mmap`,
`--mlock`: now `--load-mode`) are translated for it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from functools import lru_cache
from pathlib import Path, PurePosixPath

from lemonade.backends.engine import flags_of, is_number

# Flags Lemonade sets itself; a user value would fight ours (lemonade.md, POST /v1/load).
FORBIDDEN_FLAGS = {
    "-m": "-m", "--model": "-m", "--port": "--port", "--host": "--host", "-c": "--ctx-size",
    "--ctx-size": "--ctx-size", "--jinja": "--jinja", "--mmproj": "--mmproj", "-mm": "--mmproj",
    "--embeddings": "--embeddings", "--embedding": "--embeddings", "--reranking": "--reranking",
    "--rerank": "--reranking",
    "-a": "--alias", "--alias": "--alias", "-dev": "--device (use the llamacpp_device option)",
    "--device": "--device (use the llamacpp_device option)",
    "--rpc": "--rpc (use the rpc_workers option or llamacpp.rpc_workers)",
    "-md": "--model-draft (a model's `draft` checkpoint)", "--model-draft": "--model-draft (a model's `draft` "
    "checkpoint)", "--spec-draft-model": "--model-draft (a model's `draft` checkpoint)",
}

# Flags that name a file or folder the engine would read or write (b11312 `--help`: FNAME, PATH,
# FILE, DIR arguments), and `--tools`, whose built-in tools read files and run commands.
PATH_FLAGS = frozenset("""
-m --model -mm --mmproj -f --file -sysf --system-prompt-file --in-file -bf --binary-file --prompt-cache
--grammar-file -jf --json-schema-file -lcs --lookup-cache-static -lcd --lookup-cache-dynamic
--save-all-logits --kl-divergence-base --image --audio --video --video-ffmpeg-dir --lora --lora-scaled
--control-vector --control-vector-scaled --context-file -o --output --output-file --path --ui-config-file
--webui-config-file --mcp-servers-config --api-key-file --ssl-key-file --ssl-cert-file --media-path
--models-dir --models-preset --chat-template-file --positive-file --negative-file --log-file
--log-prompts-dir --tts-speaker-file --logits-output-dir --spec-draft-model -md --model-draft
--tools --tools-runtime
""".split())
# Flags that name a network address or a remote source the engine would connect to (or, for
# `--api-key`, lock out the server that proxies to it).
ADDRESS_FLAGS = frozenset("""
--host --port --rpc --server-base -mu --model-url -mmu --mmproj-url -dr --docker-repo -hf -hfr --hf-repo
-hff --hf-file -hft --hf-token --spec-draft-hf -hfd -hfrd --hf-repo-draft --api-key --api-prefix
""".split())
SLOT_SAVE_FLAG = "--slot-save-path"  # confined: a folder under the server's slot folder
# The documented spellings (spec examples: `--no-mmap`, `--mlock`) that the pinned build renamed.
LEGACY_LOAD_MODE = {"--no-mmap": "none", "--mmap": "mmap", "--mlock": "mmap+mlock"}
LOAD_MODE_FLAG = "--load-mode"

# Performance, memory, offload, sampling, context, speculative decoding, reasoning and
# logging-verbosity flags: none of them reads or writes a file or opens a connection.
SAFE_FLAGS = frozenset("""
-ngl --gpu-layers --n-gpu-layers --no-mmap --mmap --mlock
-t --threads -tb --threads-batch -C --cpu-mask -Cr --cpu-range --cpu-strict --prio --poll
-Cb --cpu-mask-batch -Crb --cpu-range-batch --cpu-strict-batch --prio-batch --poll-batch
-n --predict --n-predict -b --batch-size -ub --ubatch-size --keep --swa-full -fa --flash-attn
--perf --no-perf -e --escape --no-escape --rope-scaling --rope-scale --rope-freq-base --rope-freq-scale
--yarn-orig-ctx --yarn-ext-factor --yarn-attn-factor --yarn-beta-slow --yarn-beta-fast
-kvo --kv-offload -nkvo --no-kv-offload --repack -nr --no-repack --no-host -ctk --cache-type-k
-ctv --cache-type-v -dt --defrag-thold -lm --load-mode -lzm --lazy-mode --numa -ot --override-tensor
-cmoe --cpu-moe -ncmoe --n-cpu-moe -ncffn --n-cpu-ffn -sm --split-mode -ts --tensor-split -mg --main-gpu
-fit --fit -fitt --fit-target -fitc --fit-ctx --check-tensors --override-kv --op-offload --no-op-offload
--log-disable --log-colors -v --verbose --log-verbose -lv --verbosity --log-verbosity
--log-prefix --no-log-prefix --log-timestamps --no-log-timestamps --offline
--spec-draft-type-k -ctkd --cache-type-k-draft --spec-draft-type-v -ctvd --cache-type-v-draft
--samplers -s --seed --sampler-seq --sampling-seq --ignore-eos --temp --temperature --top-k --top-p
--min-p --top-nsigma --top-n-sigma --xtc-probability --xtc-threshold --typical --typical-p
--repeat-last-n --repeat-penalty --presence-penalty --frequency-penalty --dry-multiplier --dry-base
--dry-allowed-length --dry-penalty-last-n --dry-sequence-breaker --adaptive-target --adaptive-decay
--dynatemp-range --dynatemp-exp --mirostat --mirostat-lr --mirostat-ent -l --logit-bias --grammar
-j --json-schema -bs --backend-sampling
--spec-draft-threads -td --threads-draft --spec-draft-threads-batch -tbd --threads-batch-draft
--spec-draft-cpu-mask -Cd --cpu-mask-draft --spec-draft-cpu-range -Crd --cpu-range-draft
--spec-draft-cpu-strict --cpu-strict-draft --spec-draft-prio --prio-draft --spec-draft-poll --poll-draft
--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft --spec-draft-cpu-strict-batch
--cpu-strict-batch-draft --spec-draft-prio-batch --prio-batch-draft --spec-draft-poll-batch
--poll-batch-draft --spec-draft-override-tensor -otd --override-tensor-draft --spec-draft-cpu-moe
-cmoed --cpu-moe-draft --spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft
--spec-draft-n-max --spec-draft-n-min --spec-synth-len --spec-synth-rates --spec-draft-p-split
--draft-p-split --spec-draft-p-min --draft-p-min --spec-draft-backend-sampling
--no-spec-draft-backend-sampling --spec-draft-device -devd --device-draft --spec-draft-ngl -ngld
--gpu-layers-draft --n-gpu-layers-draft --spec-type --spec-ngram-mod-n-min --spec-ngram-mod-n-max
--spec-ngram-mod-n-match --spec-ngram-simple-size-n --spec-ngram-simple-size-m --spec-ngram-simple-min-hits
--spec-ngram-map-k-size-n --spec-ngram-map-k-size-m --spec-ngram-map-k-min-hits --spec-ngram-map-k4v-size-n
--spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-min-hits
--kv-unified-per-slot -ctxcp --ctx-checkpoints --swa-checkpoints -cms --checkpoint-min-step -cram --cache-ram
-kvu --kv-unified -no-kvu --no-kv-unified --cache-idle-slots --no-cache-idle-slots --context-shift
--no-context-shift -r --reverse-prompt -sp --special --warmup --no-warmup --spm-infill --pooling
-np --parallel -cb --cont-batching -nocb --no-cont-batching --mmproj-offload --no-mmproj-offload
-mmdev --mmproj-device --image-min-tokens --image-max-tokens --mtmd-batch-max-tokens --embd-normalize
-to --timeout --sse-ping-interval --threads-http --cache-prompt --no-cache-prompt --cache-reuse
--chat-template-kwargs --reasoning-format -rea --reasoning --reasoning-effort --reasoning-budget
--reasoning-budget-message --reasoning-preserve --no-reasoning-preserve --chat-template
--skip-chat-parsing --no-skip-chat-parsing --prefill-assistant --no-prefill-assistant
-sps --slot-prompt-similarity --sleep-idle-seconds --tags
""".split())

_HELP_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def check_llamacpp_args(text: str, *, trusted: bool = False) -> list[str]:
    """Tokenise `llamacpp_args`; ValueError naming the first flag that is not allowed, and why.
    `trusted`: the admin's server-wide setting, which may use flags outside the allow-list."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"Cannot parse arguments '{text}': {exc}") from None
    for i, token in enumerate(argv):
        if not token.startswith("-") or is_number(token):
            continue
        flag, _, inline = token.partition("=")
        if flag in FORBIDDEN_FLAGS:
            raise ValueError(f"Argument '{flag}' is not allowed in custom arguments: Lemonade sets "
                             f"{FORBIDDEN_FLAGS[flag]} itself. Use the load options instead (e.g. ctx_size).")
        if trusted:
            continue
        if flag == SLOT_SAVE_FLAG:
            value = inline or (argv[i + 1] if i + 1 < len(argv) else "")
            _check_slot_folder(value)
        elif flag in PATH_FLAGS or flag in ADDRESS_FLAGS:
            what = "a file or folder the engine would read or write" if flag in PATH_FLAGS else \
                "a network address the engine would connect to"
            raise ValueError(f"Argument '{flag}' is not allowed in custom arguments: it names {what}, and "
                             "per-model or per-request arguments may not choose those. An admin can set it "
                             "server-wide in llamacpp.args (lemonade config set llamacpp.args=...).")
        elif flag not in SAFE_FLAGS:
            raise ValueError(f"Argument '{flag}' is not allowed in custom arguments: only engine flags known to "
                             "touch neither files nor the network may be set per model or per request (threads, "
                             "memory, offload, batch sizes, cache types, sampling, ...). An admin can set other "
                             "flags server-wide in llamacpp.args.")
    return argv


def _check_slot_folder(value: str) -> None:
    """A per-load `--slot-save-path` names a folder inside the server's slot folder: a relative path
    with no `..` (it becomes `<cache>/slots/<value>`), so slot saves never land anywhere else."""
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or "\\" in value or ":" in value:
        raise ValueError(f"Argument '{SLOT_SAVE_FLAG}' with '{value}' is not allowed in custom arguments: per model "
                         "or per request it names a folder inside the server's slot folder (<cache>/slots), as a "
                         f"relative path without '..' (e.g. {SLOT_SAVE_FLAG} my-chats). An admin can set any folder "
                         "server-wide in llamacpp.args.")


def place_slot_folders(argv: list[str], slot_root: Path) -> list[str]:
    """`--slot-save-path` values that are relative (the per-load kind) made folders under `slot_root`,
    created; absolute ones (only an admin can set those) are kept."""
    out = list(argv)
    for i, token in enumerate(out):
        flag, eq, inline = token.partition("=")
        if flag != SLOT_SAVE_FLAG:
            continue
        value = inline if eq else (out[i + 1] if i + 1 < len(out) else "")
        if not value or Path(value).is_absolute():
            continue
        folder = slot_root / value
        folder.mkdir(parents=True, exist_ok=True)
        if eq:
            out[i] = f"{flag}={folder}"
        else:
            out[i + 1] = str(folder)
    return out


def translate_legacy_flags(argv: list[str], known: frozenset[str]) -> list[str]:
    """`--no-mmap`, `--mmap`, `--mlock` as `--load-mode none|mmap|mmap+mlock` (`--no-mmap --mlock`
    together: `mlock`) for a llama-server that knows only the new flag; unchanged for one that knows
    the old spellings, or when `known` is empty (a binary whose `--help` could not be read)."""
    legacy = [t for t in argv if t in LEGACY_LOAD_MODE]
    if not legacy or not known or LOAD_MODE_FLAG not in known or all(t in known for t in legacy):
        return argv
    if "--no-mmap" in legacy and "--mlock" in legacy:
        mode = "mlock"
    else:
        mode = LEGACY_LOAD_MODE[legacy[-1]]
    rest = [t for t in argv if t not in LEGACY_LOAD_MODE]
    return rest + [LOAD_MODE_FLAG, mode]


@lru_cache(maxsize=8)
def _help_flags(binary: str, _mtime: float, _size: int) -> frozenset[str]:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30, check=False)
    flags: set[str] = set()
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("-"):
            # The flag column ends at the first wide gap that does not follow a comma ("-t,    --threads N").
            names = re.split(r"(?<![,\s])\s{2,}", line, maxsplit=1)[0]
            flags.update(_HELP_FLAG.findall(names))
    return frozenset(flags)


def installed_flags(binary: Path) -> frozenset[str]:
    """Every flag the llama-server at `binary` lists in its `--help` (memoised per file version)."""
    st = binary.stat()
    return _help_flags(str(binary), st.st_mtime, st.st_size)


def unknown_flags(argv: list[str], binary: Path) -> list[str]:
    """Flags of `argv` that this llama-server does not know (it would refuse to start)."""
    known = installed_flags(binary)
    if not known:  # a binary whose --help we cannot read: let it speak for itself at start
        return []
    return [f for f in flags_of(argv) if f not in known]


class EngineArgsError(ValueError):
    """Arguments the installed engine binary does not take."""
