"""How much context a llama.cpp model gets: chosen before its load, read back from the engine after.

Before a load, `ctx_size: -1` (automatic) means what Lemonade's configuration guide says: the largest
context whose KV cache fits the memory free on the device the model runs on, up to the model's
trained length. The KV cache's size per token comes from the GGUF's own metadata (layers, KV heads,
key/value widths, sliding-window layers, recurrent layers), the way llama.cpp lays the cache out.

After a load, the engine's own figure is the truth: llama-server's `/props` says how many tokens one
request may use (`default_generation_settings.n_ctx`), which a flag such as `-np 8` without
`--kv-unified` divides, and which llama.cpp caps at the trained length. Every place that states or
checks a loaded model's context (`/v1/models`, `/api/show`, `/v1/health`, the prompt-length
refusal, `lemonade status`) reads that figure, so nothing can make them disagree with the engine.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from lemonade.backends.engine import MemoryNeed
from lemonade.catalog.gguf_meta import GGUFError, read_metadata
from lemonade.util.http_client import async_client

log = logging.getLogger("lemonade.llamacpp")

FALLBACK_CTX = 4096          # when neither the GGUF nor the machine tells us more (Lemonade's fallback)
UNKNOWN_TRAINED_CAP = 32768  # a GGUF that does not state its trained length is not given more than this
MIN_AUTO_CTX = 2048          # below this a chat model is of little use; the load is tried anyway
CTX_ALIGN = 256              # llama.cpp sizes its KV cache in steps of 256 cells
GiB = 1 << 30
# Bytes per cached element for llama.cpp's `--cache-type-k/-v` types (ggml block sizes / values).
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                    "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
# llama.cpp's default sliding-window layout per architecture when the GGUF gives only the window
# (`load_swa_pattern(ml, n, dense_first)` in its src/models/*.cpp): one full-attention layer in n.
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "gemma-embedding": (6, False),
    "cohere2": (4, False), "cohere2moe": (4, True), "openai-moe": (2, False), "gpt-oss": (2, False),
    "llama4": (4, False), "exaone4": (4, False), "exaone-moe": (4, False), "olmo2": (4, False),
    "plamo3": (8, False), "smallthinker": (4, True), "modern-bert": (3, True), "afmoe": (4, False),
}


@dataclass(frozen=True)
class KvLayout:
    """What the KV cache of a model costs, from its GGUF metadata."""

    architecture: str
    trained: int | None        # the model's trained context length
    per_token: float           # bytes per token of context, over the layers whose cache grows with it
    fixed: float               # bytes that do not grow with the context (sliding-window layers' cache)


@dataclass(frozen=True)
class ContextChoice:
    """The context a load asks llama-server for, and why (said in the load answer and the log)."""

    ctx_size: int
    reason: str


def _per_layer(value: Any, layers: int, default: int) -> list[int]:
    if isinstance(value, list) and len(value) >= layers:
        return [int(v) for v in value[:layers]]
    scalar = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    return [scalar] * layers


def _swa_layers(arch: str, meta: dict[str, Any], layers: int) -> list[bool]:
    """Which layers use a sliding window, as llama.cpp decides it: the GGUF's pattern array, else its
    pattern number, else the architecture's default; none when the GGUF states no window."""
    if not meta.get(f"{arch}.attention.sliding_window"):
        return [False] * layers
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) >= layers:
        return [bool(v) for v in pattern[:layers]]
    n, dense_first = SWA_PATTERNS.get(arch, (0, False)) if not isinstance(pattern, int) else (pattern, False)
    if n <= 0:  # unknown layout: count every layer as full attention (overestimates, never underestimates)
        return [False] * layers
    if dense_first:
        return [il % n != 0 for il in range(layers)]
    return [il % n < n - 1 for il in range(layers)]


def _cache_bytes(llamacpp_args: str) -> tuple[float, float]:
    """Bytes per cached K and V element under the `--cache-type-k/-v` flags of these args (f16 by default)."""
    k = v = 2.0
    try:
        argv = shlex.split(llamacpp_args or "")
    except ValueError:
        return k, v
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag in ("-ctk", "--cache-type-k"):
            k = CACHE_TYPE_BYTES.get(value.lower(), k)
        elif flag in ("-ctv", "--cache-type-v"):
            v = CACHE_TYPE_BYTES.get(value.lower(), v)
    return k, v


def layer_rows(meta: dict[str, Any], k_bytes: float = 2.0, v_bytes: float = 2.0) -> tuple[float, float, int] | None:
    """(bytes per cell over the full-attention layers, bytes per cell over the sliding-window layers,
    the window) from a GGUF's metadata, the way llama.cpp lays its KV cache out; None when the
    metadata does not say enough (no layer count, no attention)."""
    rows = kv_rows_by_layer(meta, k_bytes, v_bytes)
    if rows is None:
        return None
    full = sum(row for row, windowed in rows if not windowed)
    windowed = sum(row for row, windowed in rows if windowed)
    if full <= 0 and windowed <= 0:
        return None
    arch = str(meta.get("general.architecture", ""))
    return full, windowed, int(meta.get(f"{arch}.attention.sliding_window") or 0)


def kv_rows_by_layer(meta: dict[str, Any], k_bytes: float = 2.0, v_bytes: float = 2.0
                     ) -> list[tuple[float, bool]] | None:
    """For each layer, (bytes per KV cell, whether it is a sliding-window layer): where llama.cpp puts a
    layer's cache is where the layer is (one host's share of a model split over RPC workers,
    llamacpp.memory.split_need). A recurrent layer of a hybrid model has none (0). None when the
    metadata does not say enough."""
    arch = str(meta.get("general.architecture", ""))
    layers = meta.get(f"{arch}.block_count")
    heads = meta.get(f"{arch}.attention.head_count")
    embd = meta.get(f"{arch}.embedding_length")
    if not isinstance(layers, int) or layers <= 0:
        return None
    head_counts = _per_layer(heads, layers, 0)
    kv_heads = _per_layer(meta.get(f"{arch}.attention.head_count_kv", heads), layers, 0)
    width = (int(embd) // max(head_counts[0], 1)) if isinstance(embd, int) and head_counts[0] else 0
    key_len = int(meta.get(f"{arch}.attention.key_length") or width)
    value_len = int(meta.get(f"{arch}.attention.value_length") or key_len)
    swa_key = int(meta.get(f"{arch}.attention.key_length_swa") or key_len)
    swa_value = int(meta.get(f"{arch}.attention.value_length_swa") or value_len)
    lora_rank = meta.get(f"{arch}.attention.kv_lora_rank")
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count") or 0)
    interval = meta.get(f"{arch}.full_attention_interval")
    swa = _swa_layers(arch, meta, layers)
    window = int(meta.get(f"{arch}.attention.sliding_window") or 0)
    out: list[tuple[float, bool]] = []
    for il in range(layers):
        if isinstance(interval, int) and interval > 1 and il % interval != interval - 1:
            out.append((0.0, False))  # a recurrent layer of a hybrid model: its state does not grow with the context
            continue
        if isinstance(lora_rank, int) and lora_rank > 0:  # multi-head latent attention: one compressed row
            row = (lora_rank + rope_dim) * k_bytes
        else:
            kl, vl = (swa_key, swa_value) if swa[il] else (key_len, value_len)
            row = kv_heads[il] * (kl * k_bytes + vl * v_bytes)
        out.append((float(row), bool(swa[il] and window)))
    return out


def kv_layout(main_file: Path, llamacpp_args: str = "", parallel: int = 1, ubatch: int = 512) -> KvLayout | None:
    """The KV cache's cost for this GGUF, or None when its metadata does not say enough. `parallel`
    sequences each keep a window of a sliding-window layer (plus one micro-batch), as llama.cpp does."""
    try:
        meta = read_metadata(main_file, arrays=True)
    except (OSError, GGUFError):
        return None
    rows = layer_rows(meta, *_cache_bytes(llamacpp_args))
    if rows is None:
        return None
    arch = str(meta.get("general.architecture", ""))
    trained = meta.get(f"{arch}.context_length")
    trained = int(trained) if isinstance(trained, int) and trained > 0 else None
    full, windowed, window = rows
    return KvLayout(arch, trained, full, windowed * (window * max(parallel, 1) + ubatch))


def _gib(value: float) -> str:
    return f"{value / GiB:.1f} GiB"


def auto_context(need: MemoryNeed | None, free: int | None) -> ContextChoice:
    """`ctx_size: -1`: the largest context whose whole estimate (weights, KV cache, buffers and what
    grows while serving, backends/llamacpp/memory.py) fits `free` bytes, up to the trained length, in steps of
    256 tokens."""
    if need is None or not need.ctx:
        return ContextChoice(FALLBACK_CTX, f"automatic: {FALLBACK_CTX} tokens (the model's metadata does not say "
                                           "how large its KV cache is)")
    trained = need.ctx
    if free is None:
        ctx = min(trained, FALLBACK_CTX)
        return ContextChoice(ctx, f"automatic: {ctx} tokens (free memory could not be read)")
    fits = need.fit(free)
    budget = f"{_gib(free)} of memory free for it; {_gib(need.at(trained))} at {trained} tokens"
    if fits == trained:
        return ContextChoice(trained, f"automatic: the model's trained length ({trained} tokens); {budget}")
    if fits is None:
        ctx = need.ctx_min or min(trained, MIN_AUTO_CTX)
        return ContextChoice(ctx, f"automatic: {ctx} tokens, the smallest useful context, though it does not fit "
                                  f"({budget}): unload other models or set a smaller ctx_size")
    return ContextChoice(fits, f"automatic: {fits} tokens, the most that fits below the trained length "
                               f"({trained} tokens); {budget}")


def explicit_context(ctx_size: int) -> ContextChoice:
    return ContextChoice(ctx_size, f"ctx_size {ctx_size} as configured")


async def served_context(base_url: str, timeout: float = 10.0) -> tuple[int | None, int | None]:
    """(tokens one request may use, slots) as the running llama-server reports them in `/props`;
    (None, None) when it does not say (a `system` llama-server of another version, say)."""
    try:
        async with async_client(timeout=timeout) as client:
            resp = await client.get(base_url + "/props")
        props = resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None, None
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    slots = props.get("total_slots") if isinstance(props, dict) else None
    return (n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None,
            slots if isinstance(slots, int) and slots > 0 else None)
