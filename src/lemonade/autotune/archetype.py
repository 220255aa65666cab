"""The machine's hardware archetype: the few facts that decide good performance parameters.

Two machines of the same archetype get the same recommendations (auto-tune.md, phase 1), so an
archetype is deliberately coarse: the device family (a GPU family such as Strix Halo or Apple M3,
or for a CPU its architecture and widest vector ISA), the memory bucket (VRAM of a discrete GPU,
else system RAM), whether that memory is unified with the CPU's or discrete, and the CPU's core
bucket. Memory bandwidth tier is implied by the family (no source on the machine reports it).

Detection is a pure function of device data in `/v1/system-info`'s `devices` format plus the CPU's
ISA flags and the RAM size, so recorded data of other machines can be fed to it (tests do);
`local_facts()` reads this machine's.

Each archetype has a lookup chain, most specific first: a profile for the exact id wins, then the
family's, then (for every backend a GPU profile does not cover, such as `cpu`) the CPU archetype's.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass, field
from typing import Any

MEMORY_BUCKETS_GB = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
CORE_BUCKETS = (2, 4, 8, 16, 32, 64, 128)

# GPU families whose memory is the system's (APUs, Apple silicon), by what identifies them in device
# data: the AMD gfx target (`family`) or words of the marketing name. Order matters (first match).
UNIFIED_FAMILIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("strix-halo", ("gfx1151",), ("8060s", "8050s", "8040s", "strix halo")),
    ("radeon-890m", ("gfx1150",), ("890m", "880m")),
    ("radeon-780m", ("gfx1103",), ("780m", "760m", "740m")),
)
APPLE = re.compile(r"\bapple\s+(m\d+)(?:\s+(pro|max|ultra))?", re.IGNORECASE)


@dataclass(frozen=True)
class MachineFacts:
    """What detection reads: `devices` as `/v1/system-info` reports them, and the CPU's details."""

    devices: dict[str, Any]
    memory_gb: float                      # system RAM
    cpu_arch: str = "x86_64"              # platform.machine()
    cpu_flags: frozenset[str] = field(default_factory=frozenset)  # /proc/cpuinfo flags (Features on ARM)


@dataclass(frozen=True)
class Archetype:
    id: str
    family: str          # e.g. "strix-halo", "apple-m3", "cpu-x86_64-avx512"
    device: str          # "gpu" or "cpu": what the archetype's memory and family describe
    memory: str          # "unified", "discrete" or "system" (CPU only)
    memory_gb: int | None  # the bucket (VRAM of a discrete GPU, else system RAM); None: not reported
    gpu: str | None      # the GPU's name, when the archetype is a GPU's
    cpu_id: str          # the CPU archetype (used for backends a GPU profile does not cover)
    cpu_isa: str
    cpu_cores: int       # physical cores (exact; the id carries the bucket)
    lookup: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["lookup"] = list(self.lookup)
        return out


def bucket(value: float, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `value` (RAM is reported a little under its nominal size)."""
    return next((b for b in buckets if value <= b), buckets[-1])


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cpu_isa(arch: str, flags: frozenset[str]) -> str:
    """The widest vector ISA tier the CPU has (the one llama.cpp's CPU kernels are built around)."""
    arch = arch.lower()
    if arch in ("x86_64", "amd64", "i686", "x86"):
        if {"avx512f", "avx512bw", "avx512vl"} <= flags:
            return "avx512"
        if {"avx2", "fma"} <= flags:
            return "avx2"
        return "avx" if "avx" in flags else "sse"
    if arch in ("aarch64", "arm64"):
        if "sve" in flags:
            return "sve"
        return "neon-dotprod" if "asimddp" in flags else "neon"
    return "generic"


def _cpu(facts: MachineFacts) -> tuple[str, str, int, tuple[str, ...]]:
    cpu = facts.devices.get("cpu") or {}
    cores = int(cpu.get("cores") or cpu.get("threads") or 1)
    arch = "x86_64" if facts.cpu_arch.lower() in ("amd64", "x86_64") else \
        ("aarch64" if facts.cpu_arch.lower() in ("arm64", "aarch64") else slug(facts.cpu_arch))
    isa = cpu_isa(arch, facts.cpu_flags)
    base = f"cpu-{arch}-{isa}"
    with_cores = f"{base}-{bucket(cores, CORE_BUCKETS)}c"
    exact = f"{with_cores}-{bucket(facts.memory_gb, MEMORY_BUCKETS_GB)}gb"
    return exact, isa, cores, (exact, with_cores, base)


def _gpus(devices: dict[str, Any]) -> list[dict[str, Any]]:
    """Available GPUs as (vendor, entry) dicts, whatever key the device data lists them under."""
    found = []
    for key, value in devices.items():
        if key in ("cpu", "vulkan") or "npu" in key:  # `vulkan` lists the same GPUs (and software renderers)
            continue
        for entry in value if isinstance(value, list) else [value]:
            if isinstance(entry, dict) and entry.get("available", True) and entry.get("name"):
                found.append({**entry, "_vendor": key})
    return found


def _classify(gpu: dict[str, Any], memory_gb: float) -> tuple[str, str, float | None] | None:
    """(family, memory kind, memory in GB or None when no source reported it) of one GPU, or None
    when it cannot carry a model."""
    name = str(gpu.get("name", ""))
    lowered = name.lower()
    gfx = str(gpu.get("family") or gpu.get("arch") or "").lower()
    apple = APPLE.search(name)
    if apple or gpu["_vendor"] in ("metal", "apple_gpu"):
        family = f"apple-{apple.group(1).lower()}" if apple else "apple"
        return family, "unified", memory_gb
    for family, targets, words in UNIFIED_FAMILIES:
        if gfx in targets or any(w in lowered for w in words):
            return family, "unified", memory_gb
    vram = float(gpu["vram_gb"]) if isinstance(gpu.get("vram_gb"), (int, float)) else None
    integrated = bool(gpu.get("integrated")) or gpu.get("type") == "integrated"
    if integrated:
        return (f"{slug(gpu['_vendor'].split('_')[0])}-{gfx or slug(name)}-igpu", "unified", memory_gb)
    if vram is not None and vram < 2:
        return None  # a display adapter with a sliver of VRAM: not a place for a model
    vendor = gpu["_vendor"].split("_")[0]
    short = re.sub(r"^(nvidia|amd|intel)\s+|\b(geforce|radeon|graphics|\(tm\)|\(r\))\b", " ", lowered)
    return f"{slug(vendor)}-{slug(short) or gfx}", "discrete", vram


def detect(facts: MachineFacts) -> Archetype:
    cpu_id, isa, cores, cpu_chain = _cpu(facts)
    ram_bucket = bucket(facts.memory_gb, MEMORY_BUCKETS_GB)
    candidates = []
    for gpu in _gpus(facts.devices):
        kind = _classify(gpu, facts.memory_gb)
        if kind is not None:
            candidates.append((kind, gpu))
    if candidates:
        # The discrete GPU with the most VRAM, else the unified one (it holds as much as RAM allows).
        (family, memory, gb), gpu = max(candidates, key=lambda c: (c[0][1] == "discrete", c[0][2] or 0))
        mem_bucket = bucket(gb, MEMORY_BUCKETS_GB) if gb else None
        exact = f"{family}-{mem_bucket}gb" if mem_bucket else family  # VRAM unknown: the family alone
        chain = (exact, family) if exact != family else (family,)
        return Archetype(id=exact, family=family, device="gpu", memory=memory, memory_gb=mem_bucket,
                         gpu=str(gpu.get("name")), cpu_id=cpu_id, cpu_isa=isa, cpu_cores=cores,
                         lookup=(*chain, *cpu_chain))
    return Archetype(id=cpu_id, family=cpu_chain[-1], device="cpu", memory="system", memory_gb=ram_bucket,
                     gpu=None, cpu_id=cpu_id, cpu_isa=isa, cpu_cores=cores, lookup=cpu_chain)


def cpu_flags() -> frozenset[str]:
    """ISA flags of this CPU from /proc/cpuinfo (`flags` on x86, `Features` on ARM); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def facts_from_devices(devices: dict[str, Any]) -> MachineFacts:
    """MachineFacts from a `/v1/system-info` `devices` object alone (its `cpu` carries the ISA flags,
    architecture and RAM), e.g. one a user attached to a bug report or a bench contribution."""
    cpu = devices.get("cpu") or {}
    return MachineFacts(devices=devices, memory_gb=float(cpu.get("memory_gb") or 0),
                        cpu_arch=str(cpu.get("family") or "x86_64"), cpu_flags=frozenset(cpu.get("isa") or ()))


def local_facts() -> MachineFacts:
    """This machine's facts, from the same device report `/v1/system-info` shows (system/devices.py)."""
    from lemonade.system.info import devices

    facts = facts_from_devices(devices())
    if not facts.memory_gb or not facts.cpu_flags:  # a report without them: read the machine directly
        import psutil

        facts = MachineFacts(devices=facts.devices,
                             memory_gb=facts.memory_gb or psutil.virtual_memory().total / 2**30,
                             cpu_arch=platform.machine() or os.uname().machine,
                             cpu_flags=facts.cpu_flags or cpu_flags())
    return facts
