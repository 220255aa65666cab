"""What a llama-server process may grow to, worked out from the GGUF header before it starts.

The parts, as llama-server b11312 allocates them (its log names each buffer; docs/memory.md has the
measurements this module was checked against):

- **weights**: every tensor of the model file(s), resident through the file mapping; on the CPU
  backend llama.cpp also copies the matrix weights of some quantisation types into a repacked
  layout its kernels read faster (`CPU_REPACK`), which is anonymous memory on top;
- **KV cache**: cleared (so touched) at start; full-attention layers hold every cell of the context,
  sliding-window layers `n_swa x (slots if unified else 1) + n_ubatch` cells (per stream when the
  cache is not unified), at the `--cache-type-k/-v` element sizes;
- **output buffer**: the logits of one token per slot, and of the tokens each slot drafts when it
  speculates (llama-server checks them in one batch: `n_outputs_max`, backends/llamacpp/spec.py);
- **compute buffer**: the intermediate tensors of the worst-case micro-batch, plus the attention
  masks, which grow with the context;
- **what grows while it serves**: the host-memory prompt cache (`--cache-ram`, 8 GiB by default in
  llama-server; we set it, so it is bounded) and the context checkpoints of sliding-window and
  recurrent models (`--ctx-checkpoints` per slot, 32 by default; we set it too);
- **the process itself**: code, threads, the tokenizer's tables.

A draft model and a vision projector add their own weights and buffers. The sum is the most the
engine may hold; the router admits a load only when it fits the memory budget
(lemonade.system.memory) and measures the engine after it starts.
"""

from __future__ import annotations

import dataclasses
import platform
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemonade.backends.engine import MemoryNeed
from lemonade.backends.llamacpp.context import (
    CACHE_TYPE_BYTES,
    FALLBACK_CTX,
    MIN_AUTO_CTX,
    UNKNOWN_TRAINED_CAP,
    kv_rows_by_layer,
    layer_rows,
)
from lemonade.backends.llamacpp.spec import draft_tokens_max
from lemonade.catalog.gguf_meta import GGUFError, GGUFLayout, gguf_layout

MiB = 1 << 20
# Set by us at every launch unless the user's flags set them (backends/llamacpp/engine.py): the prompt cache
# holds as much as the KV cache itself, within PROMPT_CACHE_SHARE of the budget's cap; each slot keeps
# at most CHECKPOINTS context checkpoints (sliding-window and recurrent models only).
PROMPT_CACHE_SHARE = 0.10
CHECKPOINTS = 2
# Warm swaps of a sliding-window model need its window layers' whole cache (`--swa-full`): a restored
# state holds only the last window of them otherwise, and the next turn would be read again from the
# start (docs/warm-swaps.md). Chosen when that costs at most this share of the memory the server may use.
SWA_FULL_SHARE = 0.05
# Measured on llama-server b11312, x86-64 (docs/memory.md, "Calibration"): the process without its
# buffers (code, threads, heap: 15-17 MiB for MiniLM and a tiny Qwen3), and what the tokenizer's tables
# add per vocabulary entry (Gemma 3's 262,144 entries: about 25 MiB more).
PROCESS_BYTES = 16 * MiB
PER_VOCAB_BYTES = 100
# llama-server answers HTTP on (slots + 4) threads; each one's allocator arena grows by about this much
# while requests are parsed and answered (Gemma 3 270M: 45-60 MiB for the whole process). An embedding
# model's answers are a few vectors: MiniLM's peak grew 6.2 MiB from 1 to 16 slots, each slot given its
# own batch of long inputs at once (docs/memory.md, "Embedding models' slots"). A reranker's was not
# measured; it keeps the chat figure, which can only over-count.
PER_HTTP_THREAD_BYTES = {"chat": 2 * MiB, "embeddings": MiB // 2, "reranking": 2 * MiB}
# An embedding or reranking model's first answers add about this much whatever its slots (MiniLM at
# ctx 512: 66 MiB after the load, 111-114 MiB after one batch of four inputs with 1 slot and with 8
# sharing a cache; 129 MiB at the benchmark's peak with 1 slot, docs/memory.md)
EMBEDDING_ANSWER_BYTES = 50 * MiB
# What the process grows by per token of prompt its slots hold, besides its buffers: heap and the HTTP
# threads' allocator arenas (the prompt's tokens in the task, the slot and n-gram speculation's lookup).
# Gemma 3 270M, one slot, smaps by mapping: heap + arenas +8 MiB after a 6,539-token prompt at 8,192
# tokens of context, +19 MiB after a 26,200-token one at 32,768: 4.6 MiB and 540 bytes a token (docs/memory.md).
PROMPT_TOKEN_BYTES = 600
# The compute buffer: per token of the micro-batch, f32 values alive at the worst point of the graph,
# bounded by these multiples of the embedding, feed-forward and query widths (llama-server reports
# 36 KB a token for Gemma 3 270M, 12 KB for MiniLM, 2 KB for a tiny Qwen3; the rule gives 46, 31 and
# 3 KB), plus the attention masks: one f16 value per micro-batch token per KV cell of a stream.
COMPUTE_EMBD_FLOATS = 4
COMPUTE_FF_FLOATS = 3
COMPUTE_QUERY_FLOATS = 3
MASK_BYTES = 2
# Quantisation types whose matrix weights llama.cpp's CPU backend repacks (ggml-cpu/repack.cpp), by CPU
REPACKED_X86 = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
REPACKED_X86_AVX512 = REPACKED_X86 | {"Q2_K"}
REPACKED_ARM = frozenset({"Q4_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "MXFP4", "Q8_0"})
NOT_MATMUL = ("token_embd.", "per_layer_token_embd.")  # read by row lookups, never repacked


@dataclass(frozen=True)
class EngineFlags:
    """The llama-server flags that change what it allocates."""

    slots: int = 4
    unified: bool = True
    batch: int = 2048
    ubatch: int = 512
    k_bytes: float = 2.0
    v_bytes: float = 2.0
    swa_full: bool = False
    flash_attn: bool = True
    cache_ram_mib: int | None = None  # given by the user (-1: no limit); None: ours
    checkpoints: int | None = None  # given by the user; None: ours


def engine_flags(args: str) -> EngineFlags:
    """Read the flags that matter here from `llamacpp_args` (the user's, the profile's, the admin's)."""
    try:
        argv = shlex.split(args or "")
    except ValueError:
        argv = []
    values: dict[str, str] = {}
    switches: set[str] = set()
    for i, token in enumerate(argv):
        flag, eq, inline = token.partition("=")
        nxt = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        values.setdefault(flag, nxt)
        switches.add(flag)

    def number(*names: str) -> int | None:
        for name in names:
            raw = values.get(name, "")
            if raw.lstrip("-").isdigit():
                return int(raw)
        return None

    slots = number("-np", "--parallel")
    auto = slots is None or slots < 0  # llama-server's automatic choice: 4 slots sharing one cache
    unified = auto or bool(switches & {"-kvu", "--kv-unified"})
    if switches & {"-no-kvu", "--no-kv-unified"}:
        unified = False
    ubatch = number("-ub", "--ubatch-size") or 512
    batch = number("-b", "--batch-size") or ubatch  # a chat model's n_batch is one ubatch (engine.batch_args)
    ubatch = min(ubatch, batch)
    fa = values.get("-fa", values.get("--flash-attn", "auto")).lower()
    return EngineFlags(
        slots=4 if auto else max(1, slots or 1), unified=unified, batch=batch, ubatch=ubatch,
        k_bytes=CACHE_TYPE_BYTES.get(values.get("-ctk", values.get("--cache-type-k", "f16")).lower(), 2.0),
        v_bytes=CACHE_TYPE_BYTES.get(values.get("-ctv", values.get("--cache-type-v", "f16")).lower(), 2.0),
        swa_full="--swa-full" in switches, flash_attn=fa not in ("off", "0", "false", "disabled"),
        cache_ram_mib=number("-cram", "--cache-ram"),
        checkpoints=number("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"))


def repacked_types(backend: str) -> frozenset[str]:
    """The weight types this machine's CPU backend repacks (none on a GPU backend: the weights live there)."""
    if backend not in ("cpu", "system"):
        return frozenset()
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return REPACKED_ARM
    if machine in ("x86_64", "amd64"):
        from lemonade.system.devices import detect_devices

        flags = set(detect_devices().cpu.isa)
        if "avx2" not in flags:
            return frozenset()
        return REPACKED_X86_AVX512 if "avx512f" in flags else REPACKED_X86
    return frozenset()


def weights_bytes(layout: GGUFLayout, repack: frozenset[str]) -> tuple[int, int]:
    """(tensor data in the file, the repacked copies the CPU backend adds)."""
    data = sum(t.nbytes for t in layout.tensors)
    extra = sum(t.nbytes for t in layout.tensors if t.type in repack and len(t.dims) >= 2 and t.dims[1] % 8 == 0
                and not t.name.startswith(NOT_MATMUL))
    return data, extra


def _layouts(paths: list[Path]) -> list[GGUFLayout]:
    out = []
    for path in paths:
        if path.name.lower().endswith(".gguf"):
            try:
                out.append(gguf_layout(path))
            except (OSError, GGUFError):
                continue
    return out


def _file_bytes(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


def sliding_window(files: dict[str, list[Path]]) -> bool:
    """Whether the model keeps only a window of its cache in some layers (Gemma 3: five layers in six)."""
    mains = _layouts(files.get("main") or [])
    rows = layer_rows(mains[0].meta) if mains else None
    return bool(rows and rows[1] and rows[2])


def swa_full_chosen(files: dict[str, list[Path]], options: dict[str, Any], cap_bytes: int | None) -> bool:
    """Whether a warm-swapping load of this sliding-window model gets a full-size window cache: when the
    user's flags ask for it, or when it adds at most SWA_FULL_SHARE of the cap at the largest context."""
    flags = engine_flags(str(options.get("llamacpp_args") or ""))
    if flags.swa_full:
        return True
    mains = _layouts(files.get("main") or [])
    if not mains or cap_bytes is None:
        return False
    meta = mains[0].meta
    rows = layer_rows(meta, flags.k_bytes, flags.v_bytes)
    if rows is None or not rows[1] or not rows[2]:
        return False
    arch = str(meta.get("general.architecture", ""))
    asked = options.get("ctx_size", -1)
    ctx = asked if isinstance(asked, int) and asked > 0 else int(meta.get(f"{arch}.context_length") or FALLBACK_CTX)
    streams = 1 if flags.unified else flags.slots
    cells = _pad(rows[2] * (flags.slots if flags.unified else 1) + flags.ubatch) * streams
    return rows[1] * max(0, ctx - cells) <= SWA_FULL_SHARE * cap_bytes


def memory_need(files: dict[str, list[Path]], options: dict[str, Any], backend: str = "cpu",
                cap_bytes: int | None = None, mode: str = "chat", swa_full: bool = False) -> MemoryNeed | None:
    """The most this load may hold, or None when the main file cannot be read as a GGUF. `cap_bytes`:
    the most the server could ever use here (the budget's cap), which bounds the prompt cache;
    `mode`: the model's deployment mode (an embedding or reranking model keeps no KV cache to speak of);
    `swa_full`: the load gets a full-size window cache (`swa_full_chosen`)."""
    mains = _layouts(files.get("main") or [])
    if not mains:
        return None
    meta = mains[0].meta
    arch = str(meta.get("general.architecture", ""))
    flags = engine_flags(str(options.get("llamacpp_args") or ""))
    if swa_full:
        flags = dataclasses.replace(flags, swa_full=True)
    repack = repacked_types(backend)
    data = extra = 0
    for layout in mains:
        d, e = weights_bytes(layout, repack)
        data, extra = data + d, extra + e
    vocab, embd, ff, heads, query = _widths(mains[0], arch)
    embeddings = mode in ("embeddings", "reranking")
    rows = layer_rows(meta, flags.k_bytes, flags.v_bytes)
    ctx, ctx_min = _context(meta, arch, options, rows)
    ub = flags.ubatch
    terms: list[tuple[float, int | None]] = []
    parts: dict[str, int] = {"weights": data, "repacked_weights": extra}
    kv, masks, checkpoint_bytes = ([], [], 0.0) if embeddings else _kv_terms(rows, flags)
    terms += masks + kv
    if kv and not flags.flash_attn:  # K x Q scores, materialised without flash attention
        terms.append((4.0 * ub * heads / (1 if flags.unified else flags.slots), None))
    recurrent = _recurrent_state(meta, arch) * flags.slots
    if recurrent:
        parts["recurrent_state"] = recurrent
        checkpoint_bytes += recurrent / flags.slots
    parts["output"] = _outputs(files, options, mode, flags) * vocab * 4
    parts["compute"] = ub * 4 * (COMPUTE_EMBD_FLOATS * embd + COMPUTE_FF_FLOATS * ff + COMPUTE_QUERY_FLOATS * query)
    parts["process"] = _process_bytes(vocab, mode, flags)
    _host_extras(files, options, backend, cap_bytes, mode, flags, rows, kv, checkpoint_bytes, parts, terms)
    fixed = sum(parts.values())
    return MemoryNeed(fixed, tuple(terms), ctx, ctx_min, parts)


def _widths(layout: GGUFLayout, arch: str) -> tuple[int, int, int, int, int]:
    """(vocabulary, embedding, feed-forward, heads, query width) of a model."""
    meta = layout.meta
    vocab = int(meta.get(f"{arch}.vocab_size") or layout.array_lengths.get("tokenizer.ggml.tokens", 0))
    embd = int(meta.get(f"{arch}.embedding_length") or 0)
    ff = meta.get(f"{arch}.feed_forward_length")
    ff = max(ff) if isinstance(ff, list) and ff else int(ff or 4 * embd) if not isinstance(ff, list) else 4 * embd
    heads = int(_first(meta.get(f"{arch}.attention.head_count")) or 1)
    query = heads * int(meta.get(f"{arch}.attention.key_length") or (embd // heads if heads else embd))
    return vocab, embd, ff, heads, query


def _context(meta: dict[str, Any], arch: str, options: dict[str, Any], rows: Any) -> tuple[int, int | None]:
    """(the context asked, the smallest worth loading with -1): as asked, or with -1 anything from the
    smallest useful one to the trained length."""
    trained = meta.get(f"{arch}.context_length")
    trained = int(trained) if isinstance(trained, int) and trained > 0 else None
    asked = options.get("ctx_size", -1)
    if isinstance(asked, int) and asked > 0:
        return asked, None
    ctx = trained or (UNKNOWN_TRAINED_CAP if rows is not None else FALLBACK_CTX)
    return ctx, min(MIN_AUTO_CTX, ctx)


def _outputs(files: dict[str, list[Path]], options: dict[str, Any], mode: str, flags: EngineFlags) -> int:
    """Tokens whose logits the output buffer holds: one per slot (embedding models' too), and those of its
    drafted tokens when it speculates."""
    outputs = min(flags.batch, flags.slots * (1 + draft_tokens_max(files, options, mode)))
    return max(flags.slots, outputs)


def _process_bytes(vocab: int, mode: str, flags: EngineFlags) -> int:
    threads = PER_HTTP_THREAD_BYTES.get(mode, PER_HTTP_THREAD_BYTES["chat"])
    answers = EMBEDDING_ANSWER_BYTES if mode in ("embeddings", "reranking") else 0
    return PROCESS_BYTES + PER_VOCAB_BYTES * vocab + threads * (flags.slots + 4) + answers


def _host_extras(files: dict[str, list[Path]], options: dict[str, Any], backend: str, cap_bytes: int | None,
                 mode: str, flags: EngineFlags, rows: tuple[float, float, int] | None,
                 kv: list[tuple[float, int | None]], checkpoint_bytes: float, parts: dict[str, int],
                 terms: list[tuple[float, int | None]]) -> None:
    """What llama-server keeps in host memory besides its buffers, added to `parts` and `terms`: the
    context checkpoints and the prompt cache (copies of KV cache states), the projector, a draft model."""
    # what grows while it serves: both bounded by the flags we set at launch. A slot makes context
    # checkpoints only while it holds more than a window of prompt, so at most ctx / window slots hold
    # them at once (a slot's are cleared, or moved into the bounded prompt cache, when it takes a new task)
    if checkpoint_bytes and mode not in ("embeddings", "reranking"):
        n = max(0, flags.checkpoints if flags.checkpoints is not None else CHECKPOINTS)
        window = rows[2] if rows is not None and rows[2] else 0
        if window and n:
            terms.append((n * checkpoint_bytes / window, flags.slots * window))
        elif n:
            parts["context_checkpoints"] = int(n * flags.slots * checkpoint_bytes)
    if kv:  # the prompt cache: as much as the KV cache (llama-server's `--cache-ram`, which we set)
        if flags.cache_ram_mib is None:
            terms.extend(kv)
        elif flags.cache_ram_mib >= 0:
            parts["prompt_cache"] = flags.cache_ram_mib * MiB
        else:  # -1, no limit but its own: the context's worth of tokens
            terms.extend(kv)
        if flags.cache_ram_mib != 0:
            terms.extend(_saved_state_terms(rows, flags))
        terms.append((PROMPT_TOKEN_BYTES, None))

    projector = _file_bytes(files.get("mmproj") or [])
    if projector:  # its encoder runs one image at a time: buffers of about a third of its weights (docs/memory.md)
        parts["mmproj"] = projector + projector // 3
    if files.get("draft"):  # a draft model: its own weights, buffers and KV cache, for the same slots and context
        draft = memory_need({"main": files["draft"]}, {**options, "llamacpp_args": f"-np {flags.slots}"},
                            backend, cap_bytes, mode)
        if draft is not None:
            parts["draft"] = draft.fixed
            terms.extend(draft.terms)


def _kv_terms(rows: tuple[float, float, int] | None, flags: EngineFlags
              ) -> tuple[list[tuple[float, int | None]], list[tuple[float, int | None]], float]:
    """(the KV cache's terms, the attention masks' terms, one slot's context checkpoint in bytes)."""
    if rows is None:
        return [], [], 0.0
    full, swa, window = rows
    ub = flags.ubatch
    streams = 1 if flags.unified else flags.slots  # a mask covers one stream's cells
    kv: list[tuple[float, int | None]] = [(full, None)]  # full-attention layers: every cell of the context
    masks: list[tuple[float, int | None]] = [(MASK_BYTES * ub / streams, None)]
    checkpoint = 0.0
    if swa:
        per_stream = _pad(window * (flags.slots if flags.unified else 1) + ub)
        cells = per_stream * streams
        kv.append((swa, None if flags.swa_full else cells))  # a window per slot, fewer for a small context
        masks.append((MASK_BYTES * ub / streams, None if flags.swa_full else cells))
        checkpoint = 0.0 if flags.swa_full else swa * window  # a full window cache needs no checkpoints
    return kv, masks, checkpoint


def _saved_state_terms(rows: tuple[float, float, int] | None, flags: EngineFlags) -> list[tuple[float, int | None]]:
    """One saved prompt over `--cache-ram`: llama-server copies a slot's state into the prompt cache
    before it evicts the oldest ones to bring the cache back under its limit, so a full cache holds one
    state more for a moment. A state is the slot's tokens in the full-attention layers and the last
    window of the sliding-window layers, with a full window cache too (b11312's log: "saving prompt with
    length 26200, total state size = 84.564 MiB" for Gemma 3 270M: 3 KB a token and 7.5 MiB of window);
    a slot holds the whole context when the cache is unified, its share otherwise."""
    if rows is None:
        return []
    full, swa, window = rows
    share = 1 if flags.unified else flags.slots
    terms: list[tuple[float, int | None]] = [(full / share, None)]
    if swa and window:
        terms.append((swa, window))
    return terms


def prompt_cache_mib(main: Path, llamacpp_args: str, ctx: int, cap_bytes: int | None, swa_full: bool = False) -> int:
    """`--cache-ram` for a load at context `ctx`: the KV cache's size at that context (what
    `memory_need` counted for the prompt cache), within PROMPT_CACHE_SHARE of the cap. 0 turns the cache
    off: nothing worth keeping."""
    try:
        meta = gguf_layout(main).meta
    except (OSError, GGUFError):
        return 0
    flags = engine_flags(llamacpp_args)
    if swa_full:
        flags = dataclasses.replace(flags, swa_full=True)
    kv, _, _ = _kv_terms(layer_rows(meta, flags.k_bytes, flags.v_bytes), flags)
    size = sum(rate * (ctx if cap is None else min(ctx, cap)) for rate, cap in kv)
    if cap_bytes is not None:
        size = min(size, PROMPT_CACHE_SHARE * cap_bytes)
    return int(size) // MiB


def _pad(cells: int) -> int:
    return -(-cells // 256) * 256


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _recurrent_state(meta: dict[str, Any], arch: str) -> int:
    """Bytes of one sequence's recurrent state (Mamba-style and linear-attention layers), f32."""
    d_inner = meta.get(f"{arch}.ssm.inner_size", 0)
    d_state = meta.get(f"{arch}.ssm.state_size", 0)
    d_conv = meta.get(f"{arch}.ssm.conv_kernel", 0)
    layers = meta.get(f"{arch}.block_count", 0)
    if not all(isinstance(v, int) and v > 0 for v in (d_inner, d_state, d_conv, layers)):
        return 0
    interval = meta.get(f"{arch}.full_attention_interval")
    recurrent_layers = layers - (layers // interval if isinstance(interval, int) and interval > 1 else 0)
    return int(recurrent_layers * 4 * (d_inner * d_state + (d_conv - 1) * (d_inner + 2 * d_state)))


# ----- a model spread over llama.cpp RPC workers (backends/llamacpp/split.py places the layers) -----------------------
# Measured on llama-server b11312 with Gemma 3 270M over three ggml-rpc-servers (docs/scale-out.md): a device
# holding layers gets a compute buffer as a local CPU would (16.5 MiB at a 512-token micro-batch; the rule
# above gives 23) plus the attention masks of its layers (2 bytes per micro-batch token per cell), and the
# main host's CPU, which then runs only the input and output layers, 2.5 MiB plus the masks it builds.
# An rpc-server receives each tensor whole into a message buffer before copying it into place, so it
# holds its largest tensor twice for a moment; RPC_DEVICE_BYTES is its own growth while it serves.
RPC_DEVICE_BYTES = 8 * MiB
OUTPUT_LAYER = ("token_embd.", "output.", "output_norm.")  # kept on the main host (backends/llamacpp/split.py)


@dataclass(frozen=True)
class LayerCost:
    """One repeating layer, as it lands on the device that holds it."""

    weights: int  # its tensors
    largest: int  # its largest tensor (received whole before it is put in place)
    kv_rate: float  # bytes per KV cache cell
    windowed: bool  # a sliding-window layer: at most `SplitNeed.window_cells` cells


@dataclass(frozen=True)
class SplitNeed:
    """What a load spread over RPC workers holds on each host. `main`: the main host's share, which the
    router admits against this server's budget (the input and output layers, the logits, the CPU's
    compute buffer and masks, and what llama-server keeps in host memory: prompt cache, context
    checkpoints, its process). The rest goes with the layers: a device holding layers `first` to
    `first + count` needs `device_bytes` of them."""

    main: MemoryNeed
    layers: tuple[LayerCost, ...]
    device_fixed: int  # compute buffer and the rpc-server's growth, on a device holding any layer
    mask_rate: float  # bytes per KV cell of the attention masks, per kind of layer it holds
    window_cells: int | None  # cells of a sliding-window layer's cache (None: it has none, or --swa-full)

    def device_bytes(self, first: int, count: int, ctx: int) -> int:
        if count <= 0:
            return 0
        held = self.layers[first:first + count]
        window = ctx if self.window_cells is None else min(ctx, self.window_cells)
        kv = sum(layer.kv_rate * (window if layer.windowed else ctx) for layer in held)
        masks = self.mask_rate * (ctx * any(not layer.windowed for layer in held)
                                  + window * any(layer.windowed for layer in held))
        return int(sum(layer.weights for layer in held) + max(layer.largest for layer in held) + kv + masks
                   + self.device_fixed)


def split_need(files: dict[str, list[Path]], options: dict[str, Any], backend: str = "cpu",
               cap_bytes: int | None = None, mode: str = "chat") -> SplitNeed | None:
    """The per-host shares of a load whose repeating layers go to RPC devices and whose input and output
    layers stay on this host (what llamacpp.split.split_args tells llama-server), or None when it cannot
    be told: no readable GGUF, a model with recurrent state, no per-layer tensors. Local loads keep
    `memory_need`."""
    mains = _layouts(files.get("main") or [])
    if not mains:
        return None
    meta = mains[0].meta
    arch = str(meta.get("general.architecture", ""))
    flags = engine_flags(str(options.get("llamacpp_args") or ""))
    rows_by_layer = kv_rows_by_layer(meta, flags.k_bytes, flags.v_bytes)
    count = meta.get(f"{arch}.block_count")
    if not isinstance(count, int) or count <= 0 or _recurrent_state(meta, arch):
        return None
    weights, largest = [0] * count, [0] * count
    host: list[Any] = []
    for layout in mains:
        for t in layout.tensors:
            name = t.name.split(".")
            if name[0] == "blk" and len(name) > 1 and name[1].isdigit() and int(name[1]) < count:
                il = int(name[1])
                weights[il] += t.nbytes
                largest[il] = max(largest[il], t.nbytes)
            else:
                host.append(t)
    if not any(weights):
        return None
    embeddings = mode in ("embeddings", "reranking")
    rows = None if embeddings else layer_rows(meta, flags.k_bytes, flags.v_bytes)
    kv_rows = [(0.0, False)] * count if embeddings or rows_by_layer is None else rows_by_layer
    layers = tuple(LayerCost(weights[il], largest[il], kv_rows[il][0], kv_rows[il][1]) for il in range(count))

    vocab, embd, ff, heads, query = _widths(mains[0], arch)
    ctx, ctx_min = _context(meta, arch, options, rows)
    ub = flags.ubatch
    kv, masks, checkpoint_bytes = _kv_terms(rows, flags)
    # the output matmul on this host's CPU: a repacked copy of its weights when their type repacks
    output = next((t for t in host if t.name == "output.weight"), None) or \
        next((t for t in host if t.name == "token_embd.weight"), None)
    repack = repacked_types(backend)
    outputs = _outputs(files, options, mode, flags)
    parts: dict[str, int] = {
        "input_output_weights": sum(t.nbytes for t in host),
        "repacked_weights": output.nbytes if output is not None and output.type in repack and len(output.dims) >= 2
        and output.dims[1] % 8 == 0 else 0,
        "output": outputs * vocab * 4,
        "compute": ub * 4 * 2 * embd + (0 if embeddings else outputs * vocab * 4),
        "process": _process_bytes(vocab, mode, flags),
    }
    terms: list[tuple[float, int | None]] = list(masks)
    _host_extras(files, options, backend, cap_bytes, mode, flags, rows, kv, checkpoint_bytes, parts, terms)
    main = MemoryNeed(sum(parts.values()), tuple(terms), ctx, ctx_min, parts,
                      share="on this host, its share of a load whose layers the RPC workers hold")
    streams = 1 if flags.unified else flags.slots
    window = rows[2] if rows is not None else 0
    window_cells = None if flags.swa_full or not window else \
        _pad(window * (flags.slots if flags.unified else 1) + ub) * streams
    device_fixed = ub * 4 * (COMPUTE_EMBD_FLOATS * embd + COMPUTE_FF_FLOATS * ff + COMPUTE_QUERY_FLOATS * query) \
        + RPC_DEVICE_BYTES
    # per cell: the masks, and without flash attention the K x Q scores the device materialises
    mask_rate = MASK_BYTES * ub / streams + (0.0 if flags.flash_attn else 4.0 * ub * heads / streams)
    return SplitNeed(main, layers, device_fixed, mask_rate, window_cells)
