"""Which llama-server flags a user may pass, and which ones the installed binary knows.

`llamacpp_args` from a request or a model's saved options (any API key holder can set those) may
only use flags that touch neither the filesystem nor the network: an allow-list taken from the
pinned build's `--help` (b11312). Paths the engine needs (model, projector, template) are ours to
choose. The server-wide `llamacpp.args` is an admin setting and may use any flag but the ones we
set ourselves. Either way a flag the installed `llama-server` does not know is refused with a 400
before it can make every later load fail.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

from lemonade.backends.engine import check_flags, flags_of

# Flags Lemonade sets itself; a user value would fight ours (lemonade.md, POST /v1/load).
FORBIDDEN_FLAGS = {
    "-m": "-m", "--model": "-m", "--port": "--port", "--host": "--host", "-c": "--ctx-size",
    "--ctx-size": "--ctx-size", "-ngl": "-ngl", "--n-gpu-layers": "-ngl", "--gpu-layers": "-ngl",
    "--jinja": "--jinja", "--mmproj": "--mmproj", "-mm": "--mmproj", "--embeddings": "--embeddings",
    "--embedding": "--embeddings", "--reranking": "--reranking", "--rerank": "--reranking",
    "-a": "--alias", "--alias": "--alias", "-dev": "--device (use the llamacpp_device option)",
    "--device": "--device (use the llamacpp_device option)",
    "--rpc": "--rpc (use the rpc_workers option or llamacpp.rpc_workers)",
    "-md": "--model-draft (a model's `draft` checkpoint)", "--model-draft": "--model-draft (a model's `draft` "
    "checkpoint)", "--spec-draft-model": "--model-draft (a model's `draft` checkpoint)",
}

# Performance, sampling, context, speculative decoding, reasoning and logging-verbosity flags:
# none of them reads or writes a file or opens a connection.
SAFE_FLAGS = frozenset("""
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
    """Tokenise `llamacpp_args`; ValueError naming the first flag that is not allowed. `trusted`:
    the admin's server-wide setting, which may use flags outside the allow-list."""
    return check_flags(text, FORBIDDEN_FLAGS, None if trusted else SAFE_FLAGS.__contains__)


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
