"""Where a model's layers go when it is spread over llama.cpp RPC workers, decided before anything starts.

llama.cpp (b11312, `llama_model_base::load_tensors`) gives each device a contiguous run of the
repeating layers in proportion to `--tensor-split` (by default to each device's free memory, which
an rpc-server's CPU device reports as all of its machine's RAM, cgroup caps notwithstanding), keeps
the input layer on the main host's CPU, and puts the output layer on the device of the last layer,
where a model whose output reuses its token embeddings (Gemma's 170 MiB of them, say) gets a second
copy. So Lemonade decides instead, from the shares `llamacpp.memory.split_need` works out and the
free memory each worker reports (`lemonade worker`, backends/llamacpp/worker.py):

- the output layer stays on the main host with the input layer (`--override-tensor ...=CPU`): a tied
  output then costs nothing more, and no device sends the logits (a MiB per token with a 262k
  vocabulary) back over the network;
- the repeating layers go to the devices in the order of `rpc_workers`, as many to each as its room
  allows in proportion to the rooms (`--tensor-split` with one count per device), so a small worker
  gets few layers and no worker gets more than it can hold;
- a set of workers that cannot hold the layers together is refused before anything starts, with
  what each host would have to hold and what it has (`split_refusal`).

A worker whose devices get no layer is left out of `--rpc`. Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lemonade.backends.engine import MemoryNeed
from lemonade.backends.llamacpp.memory import SplitNeed

# The output layer's tensors (and the token embeddings a tied output reuses) kept on the main host's CPU;
# anchored, so `blk.N.attn_output.weight` stays with its layer.
OUTPUT_ON_HOST = r"^(token_embd|output|output_norm)\.=CPU"
ALIGN = MemoryNeed.ALIGN


@dataclass(frozen=True)
class Device:
    """One device of one worker, as llama-server numbers them: workers in order, each one's devices in
    the order it lists them."""

    worker: str  # host:port
    name: str  # its device name on the worker (CPU, CUDA0, Vulkan0, ...)
    free: int  # bytes it can take, as the worker reported them


@dataclass(frozen=True)
class Placement:
    devices: tuple[Device, ...]
    counts: tuple[int, ...]  # repeating layers per device, in order
    ctx: int
    shares: tuple[int, ...]  # what each device holds then (SplitNeed.device_bytes)

    @property
    def workers(self) -> list[str]:
        """The workers whose devices hold layers, in order (the `--rpc` list)."""
        out: list[str] = []
        for dev, n in zip(self.devices, self.counts, strict=True):
            if n and dev.worker not in out:
                out.append(dev.worker)
        return out


def _fill(need: SplitNeed, devices: Sequence[Device], ctx: int, targets: Sequence[float] | None) -> list[int] | None:
    """Layer counts per device, in order: each device takes layers while they fit its room and, with
    `targets` (cumulative bytes of layers by the end of each device), while the layer's middle is before
    its target; the last device takes what is left if it can. None when some layers fit nowhere."""
    layers = len(need.layers)
    counts: list[int] = []
    first = 0
    done = 0.0
    for d, dev in enumerate(devices):
        n = 0
        while first + n < layers:
            if need.device_bytes(first, n + 1, ctx) > dev.free:
                break
            size = need.device_bytes(first + n, 1, ctx) - need.device_fixed
            if targets is not None and d < len(devices) - 1 and done + size / 2 > targets[d]:
                break
            done += size
            n += 1
        counts.append(n)
        first += n
    return counts if first == layers else None


def place(need: SplitNeed, devices: Sequence[Device], ctx: int) -> Placement | None:
    """Layers in proportion to the devices' free memory, every device within it; else as many as fit on
    each in order (which holds whenever any contiguous placement does); None when no placement fits."""
    if not devices:
        return None
    total = sum(need.device_bytes(i, 1, ctx) - need.device_fixed for i in range(len(need.layers)))
    rooms = [max(0, d.free - need.device_fixed) for d in devices]
    targets, acc = [], 0
    for room in rooms:
        acc += room
        targets.append(total * acc / max(1, sum(rooms)))
    counts = _fill(need, devices, ctx, targets) or _fill(need, devices, ctx, None)
    if counts is None:
        return None
    shares, first = [], 0
    for n in counts:
        shares.append(need.device_bytes(first, n, ctx))
        first += n
    return Placement(tuple(devices), tuple(counts), ctx, tuple(shares))


def largest_context(need: SplitNeed, devices: Sequence[Device], low: int, high: int) -> int | None:
    """The largest context from `low` to `high` (in steps of ALIGN) the devices can hold, or None."""
    if place(need, devices, low) is None:
        return None
    if place(need, devices, high) is not None:
        return high
    lo, hi = low, high
    while hi - lo > ALIGN:
        mid = (lo + hi) // 2 // ALIGN * ALIGN
        if mid <= lo:
            break
        lo, hi = (mid, hi) if place(need, devices, mid) is not None else (lo, mid)
    return lo


def split_args(placement: Placement) -> list[str]:
    """llama-server's flags for a placement, beside `-ngl 99` (every layer offloaded): one `--tensor-split`
    count per device of the `--rpc` workers (the last one also counts the output layer, which llama.cpp
    assigns to the last device's share and `--override-tensor` keeps on this host)."""
    kept = [n for dev, n in zip(placement.devices, placement.counts, strict=True) if dev.worker in placement.workers]
    kept[-1] += 1
    return ["--tensor-split", ",".join(str(n) for n in kept), "--override-tensor", OUTPUT_ON_HOST]


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def split_refusal(model: str, need: SplitNeed, devices: Sequence[Device], ctx: int, fixed_ctx: bool) -> str:
    """Why `devices` cannot hold the model at `ctx`: what each would hold with the layers spread in
    proportion to its free memory, what it has, and how much it is short."""
    layers = len(need.layers)
    total = sum(d.free for d in devices) or 1
    counts, given = [], 0
    for i, dev in enumerate(devices):  # in proportion to free memory, ignoring whether it fits
        n = layers - given if i == len(devices) - 1 else round(layers * dev.free / total)
        n = max(0, min(n, layers - given))
        counts.append(n)
        given += n
    lines, first = [], 0
    for dev, n in zip(devices, counts, strict=True):
        held = need.device_bytes(first, n, ctx)
        first += n
        short = f", {_mib(held - dev.free)} short" if held > dev.free else ""
        lines.append(f"{dev.worker} ({dev.name}) would hold {n} layer{'s' if n != 1 else ''}: {_mib(held)}, "
                     f"has {_mib(dev.free)} free{short}")
    hint = "a smaller ctx_size, " if fixed_ctx else ""
    return (f"Cannot load {model} over llama.cpp RPC: its {layers} layers with the KV cache for {ctx} tokens do not "
            f"fit the workers' free memory together. " + "; ".join(lines) + f". Try {hint}more workers or workers "
            "with more free memory (each one's share is its layers' weights and KV cache, a compute buffer and its "
            "largest tensor while it arrives; docs/scale-out.md).")
