"""What compute hardware this machine has: CPU facts, GPUs, Vulkan devices and NPUs.

One entry point, `detect_devices()`, returns a typed `DeviceReport`. Everything in it comes from a
real source on the machine, never from a guess: NVML (`nvidia-ml-py`) or `nvidia-smi` for NVIDIA,
sysfs (`/sys/class/drm/*/device`, vendor 0x1002 / 0x8086) plus `rocm-smi` where installed for AMD
and Intel GPUs, `vulkaninfo --summary` for Vulkan devices (including Mesa's software lavapipe),
`system_profiler` for Apple Metal, and `/dev/accel/*` bound to the `amdxdna` driver for AMD NPUs.
A source that is missing simply contributes nothing.

Each parser takes the text a tool printed (or a sysfs root), so tests feed them recorded outputs of
real machines. `/v1/system-info`, `/v1/system-stats`, backend filtering (which llama.cpp backends a
machine may use) and auto-tune's archetypes all read this one report.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

log = logging.getLogger("lemonade.devices")

GpuKind = Literal["amd_gpu", "nvidia_gpu", "intel_gpu", "metal"]
VulkanType = Literal["discrete", "integrated", "virtual", "cpu", "other"]

AMD_VENDOR, NVIDIA_VENDOR, INTEL_VENDOR = 0x1002, 0x10DE, 0x8086
_GPU_KIND_BY_VENDOR: dict[int, GpuKind] = {AMD_VENDOR: "amd_gpu", NVIDIA_VENDOR: "nvidia_gpu",
                                           INTEL_VENDOR: "intel_gpu"}
# ISA features that matter to ggml's CPU kernels (x86 /proc/cpuinfo names, then Arm's).
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
              "asimd", "asimddp", "i8mm", "sve", "sve2", "bf16")
_TOOL_TIMEOUT = 10.0
# amdxdna PCI device ids: 0x1502 Phoenix/Hawk Point (XDNA), 0x17f0 Strix/Krackan (XDNA2).
_XDNA_FAMILY = {0x1502: "XDNA", 0x17F0: "XDNA2"}


@dataclass(frozen=True)
class CpuFacts:
    """What auto-tune and the CPU backend need to know about the processor and memory."""

    name: str
    arch: str                  # "x86_64" or "arm64" (system-info's `family`)
    cores: int                 # physical cores
    threads: int               # logical CPUs
    isa: tuple[str, ...]       # e.g. ("avx2", "avx512f", "amx_tile")
    memory_bytes: int          # total RAM

    @property
    def memory_gb(self) -> float:
        return round(self.memory_bytes / 2**30, 1)


@dataclass(frozen=True)
class VulkanDevice:
    """One physical device as the Vulkan loader lists it (`vulkaninfo --summary`, GPU<index>)."""

    index: int                 # the loader's order: llama.cpp's Vulkan<index> and GGML_VK_VISIBLE_DEVICES
    name: str
    type: VulkanType
    vendor_id: int
    device_id: int
    driver: str                # driverName, e.g. "radv", "llvmpipe", "NVIDIA"
    api_version: str = ""

    @property
    def is_gpu(self) -> bool:
        """False for software renderers (lavapipe/llvmpipe report type CPU)."""
        return self.type in ("discrete", "integrated", "virtual")


@dataclass(frozen=True)
class Gpu:
    """A graphics processor with the facts backends and auto-tune use."""

    kind: GpuKind
    name: str
    index: int                 # per kind (nvidia-smi index, nth AMD card, ...)
    vram_bytes: int | None = None        # dedicated memory (carve-out on an APU)
    shared_bytes: int | None = None      # GTT / system memory the GPU may map
    integrated: bool | None = None       # shares the CPU's memory (APU, Apple silicon, Intel iGPU)
    family: str | None = None            # "gfx1151", "sm_86", "metal", ...
    driver: str | None = None
    pci_slot: str | None = None          # "0000:03:00.0" (links sysfs, NVML and Vulkan views)
    device_id: int | None = None
    vulkan_index: int | None = None      # the same GPU in the Vulkan list, when it is there
    source: str = ""                     # where the facts came from: "nvml", "sysfs", ...

    @property
    def vram_gb(self) -> float | None:
        return None if self.vram_bytes is None else round(self.vram_bytes / 2**30, 1)


@dataclass(frozen=True)
class Npu:
    kind: Literal["amd_npu"]
    name: str
    family: str | None         # "XDNA" / "XDNA2"
    device_node: str           # "/dev/accel/accel0"
    driver: str = "amdxdna"


@dataclass(frozen=True)
class DeviceReport:
    cpu: CpuFacts
    gpus: tuple[Gpu, ...] = ()
    vulkan: tuple[VulkanDevice, ...] = ()
    npus: tuple[Npu, ...] = ()
    errors: tuple[str, ...] = field(default=(), compare=False)  # a tool that ran and failed

    def gpus_of(self, kind: GpuKind) -> list[Gpu]:
        return [g for g in self.gpus if g.kind == kind]

    @property
    def vulkan_gpus(self) -> list[VulkanDevice]:
        return [v for v in self.vulkan if v.is_gpu]


@dataclass(frozen=True)
class GpuUsage:
    """Live figures for `/v1/system-stats`; None where no source reports them."""

    gpu_percent: float | None = None
    vram_used_bytes: int | None = None
    npu_percent: float | None = None


# --- CPU ---------------------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model name, ISA features of interest) from /proc/cpuinfo (x86 `flags`, Arm `Features`)."""
    name, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not name:
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return name, tuple(f for f in _ISA_FLAGS if f in flags)


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFacts:
    import psutil

    try:
        name, isa = parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:
        name, isa = "", ()
    if sys.platform == "darwin":
        name = name or _run(["sysctl", "-n", "machdep.cpu.brand_string"]) or ""
        if platform.machine() == "arm64":
            isa = ("asimd",)  # every Apple silicon core has NEON / dot product
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x86_64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    threads = psutil.cpu_count() or os.cpu_count() or 1
    return CpuFacts(name=name or platform.processor() or machine, arch=arch,
                    cores=psutil.cpu_count(logical=False) or threads, threads=threads, isa=isa,
                    memory_bytes=psutil.virtual_memory().total)


# --- Vulkan ------------------------------------------------------------------------------------

_VK_TYPES: dict[str, VulkanType] = {"DISCRETE_GPU": "discrete", "INTEGRATED_GPU": "integrated",
                                    "VIRTUAL_GPU": "virtual", "CPU": "cpu"}


def parse_vulkaninfo_summary(text: str) -> list[VulkanDevice]:
    """The `Devices:` section of `vulkaninfo --summary` (Vulkan-Tools 1.2.1xx and later)."""
    devices: list[VulkanDevice] = []
    section = re.split(r"^Devices:\s*$", text, maxsplit=1, flags=re.M)
    if len(section) < 2:
        return devices
    current: dict[str, str] = {}
    index = -1

    def flush() -> None:
        if index >= 0 and current.get("deviceName"):
            kind = current.get("deviceType", "").replace("PHYSICAL_DEVICE_TYPE_", "")
            devices.append(VulkanDevice(
                index=index, name=current["deviceName"], type=_VK_TYPES.get(kind, "other"),
                vendor_id=_int(current.get("vendorID")) or 0, device_id=_int(current.get("deviceID")) or 0,
                driver=current.get("driverName", ""), api_version=current.get("apiVersion", "").split()[0]
                if current.get("apiVersion") else ""))

    for line in section[1].splitlines():
        head = re.match(r"^GPU(\d+):\s*$", line.strip())
        if head:
            flush()
            index, current = int(head.group(1)), {}
            continue
        key, sep, value = line.partition("=")
        if sep and index >= 0:
            current[key.strip()] = value.strip()
    flush()
    return devices


def vulkan_devices() -> tuple[list[VulkanDevice], str | None]:
    exe = shutil.which("vulkaninfo")
    if exe is None:
        return [], None
    out = _run([exe, "--summary"], env={**os.environ, "DISPLAY": ""})
    if out is None:
        return [], "vulkaninfo --summary failed"
    return parse_vulkaninfo_summary(out), None


# --- NVIDIA ------------------------------------------------------------------------------------

NVIDIA_SMI_QUERY = "index,name,uuid,pci.bus_id,compute_cap,driver_version,memory.total,memory.used,utilization.gpu"


def parse_nvidia_smi_csv(text: str) -> list[tuple[Gpu, GpuUsage]]:
    """`nvidia-smi --query-gpu=<fields> --format=csv[,nounits]`, read by its header line, so any
    subset of NVIDIA_SMI_QUERY's fields in any order works. Memory is in MiB; a field the GPU does not
    report (`[N/A]`, `[Not Supported]`) becomes None."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()).lower() for h in rows[0]]
    header = [{"gpu_name": "name", "gpu_bus_id": "pci.bus_id", "gpu_uuid": "uuid"}.get(h, h) for h in header]
    result = []
    for n, row in enumerate(rows[1:]):
        if len(row) != len(header):
            continue
        f = {h: _unit_free(v) for h, v in zip(header, row, strict=True)}
        index = _int(f.get("index"))
        gpu = Gpu(kind="nvidia_gpu", name=f.get("name") or "NVIDIA GPU", index=n if index is None else index,
                  vram_bytes=_mib(f.get("memory.total")), integrated=False, family=_sm(f.get("compute_cap") or ""),
                  driver=f.get("driver_version"), pci_slot=_pci(f.get("pci.bus_id")), source="nvidia-smi")
        result.append((gpu, GpuUsage(gpu_percent=_float(f.get("utilization.gpu")),
                                     vram_used_bytes=_mib(f.get("memory.used")))))
    return result


def _unit_free(value: str) -> str | None:
    """A CSV cell without its unit (" MiB", " %" when `nounits` was not given); None for N/A."""
    value = value.strip()
    if not value or value.startswith("[") or value in ("N/A", "Not Supported"):
        return None
    return re.sub(r"\s+(MiB|%|W|MHz)$", "", value)


def _nvml() -> list[tuple[Gpu, GpuUsage]] | None:
    """NVIDIA GPUs through NVML (`nvidia-ml-py`), or None when the library or driver is absent."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            try:
                util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = None
            gpu = Gpu(kind="nvidia_gpu", name=_text(pynvml.nvmlDeviceGetName(h)), index=i, vram_bytes=int(mem.total),
                      integrated=False, family=f"sm_{major}{minor}", driver=driver,
                      pci_slot=_pci(_text(pynvml.nvmlDeviceGetPciInfo(h).busId)), source="nvml")
            out.append((gpu, GpuUsage(gpu_percent=util, vram_used_bytes=int(mem.used))))
        return out
    except Exception as exc:
        log.info("NVML query failed: %s", exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def nvidia_gpus() -> list[tuple[Gpu, GpuUsage]]:
    via_nvml = _nvml()
    if via_nvml is not None:
        return via_nvml
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    out = _run([exe, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,nounits"])
    return parse_nvidia_smi_csv(out or "")


# --- AMD and Intel through sysfs ---------------------------------------------------------------


@dataclass(frozen=True)
class SysfsCard:
    """The files of one `/sys/class/drm/cardN/device` we read."""

    card: str
    vendor: int
    device_id: int
    pci_slot: str | None
    driver: str | None
    product_name: str | None
    vram_total: int | None
    vram_used: int | None
    gtt_total: int | None
    busy_percent: float | None


def read_drm_cards(sys_root: Path = Path("/sys")) -> list[SysfsCard]:
    """Every DRM card (not its connectors) with a PCI vendor, in card order."""
    cards: list[SysfsCard] = []
    drm = sys_root / "class" / "drm"
    try:
        names = sorted((p.name for p in drm.iterdir() if re.fullmatch(r"card\d+", p.name)),
                       key=lambda n: int(n[4:]))
    except OSError:
        return cards
    for name in names:
        dev = drm / name / "device"
        vendor = _int(_read(dev / "vendor"))
        if vendor is None:
            continue
        driver = None
        try:
            driver = (dev / "driver").resolve().name if (dev / "driver").exists() else None
        except OSError:
            pass
        slot = None
        try:
            slot = _pci(dev.resolve().name)
        except OSError:
            pass
        cards.append(SysfsCard(
            card=name, vendor=vendor, device_id=_int(_read(dev / "device")) or 0, pci_slot=slot, driver=driver,
            product_name=_read(dev / "product_name") or None, vram_total=_int(_read(dev / "mem_info_vram_total")),
            vram_used=_int(_read(dev / "mem_info_vram_used")), gtt_total=_int(_read(dev / "mem_info_gtt_total")),
            busy_percent=_float(_read(dev / "gpu_busy_percent"))))
    return cards


def kfd_gfx_targets(sys_root: Path = Path("/sys")) -> dict[int, str]:
    """PCI device id → `gfxNNNN` ISA from the ROCm kernel driver's topology (`gfx_target_version`,
    e.g. 110501 → gfx1151), for AMD GPUs whose amdgpu driver exposes /sys/class/kfd."""
    targets: dict[int, str] = {}
    nodes = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    try:
        entries = list(nodes.iterdir())
    except OSError:
        return targets
    for node in entries:
        props = dict(line.split(None, 1) for line in (_read(node / "properties") or "").splitlines()
                     if len(line.split(None, 1)) == 2)
        version = _int(props.get("gfx_target_version"))
        device = _int(props.get("device_id"))
        if version and device:
            major, minor, step = version // 10000, (version // 100) % 100, version % 100
            targets[device] = f"gfx{major}{minor:x}{step:x}"
    return targets


def parse_rocm_smi_json(text: str) -> dict[str, dict[str, str]]:
    """`rocm-smi --showproductname --showmeminfo vram --showuse --json`: {"card0": {...}, ...}."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and k.startswith("card")}


def parse_amd_smi_static(text: str) -> dict[str, dict[str, str]]:
    """`amd-smi static --asic --bus` (rocm-smi's successor, plain text): PCI address →
    {"MARKET_NAME", "TARGET_GRAPHICS_VERSION", "DEVICE_ID", ...}, to name AMD cards sysfs leaves unnamed."""
    gpus: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if re.match(r"^GPU:\s*\d+", line):
            current = {}
            continue
        key, sep, value = line.strip().partition(":")
        if current is None or not sep or not value.strip():
            continue
        current[key.strip()] = value.strip()
        if key.strip() == "BDF" and _pci(value.strip()):
            gpus[_pci(value.strip()) or ""] = current
    return gpus


def sysfs_gpus(cards: list[SysfsCard], gfx: dict[int, str], rocm: dict[str, dict[str, str]],
               vulkan: list[VulkanDevice], amd_smi: dict[str, dict[str, str]] | None = None
               ) -> list[tuple[Gpu, GpuUsage]]:
    """AMD and Intel GPUs from sysfs cards, named by rocm-smi, amd-smi or Vulkan where sysfs has no name."""
    out: list[tuple[Gpu, GpuUsage]] = []
    per_kind: dict[str, int] = {}
    for card in cards:
        kind = _GPU_KIND_BY_VENDOR.get(card.vendor)
        if kind is None or kind == "nvidia_gpu":  # NVIDIA comes from NVML / nvidia-smi
            continue
        smi = rocm.get(card.card, {})
        amd = (amd_smi or {}).get(card.pci_slot or "", {})
        vk = next((v for v in vulkan if v.vendor_id == card.vendor and v.device_id == card.device_id and v.is_gpu),
                  None)
        name = (smi.get("Card Series") or amd.get("MARKET_NAME") or card.product_name or (vk.name if vk else None)
                or f"{'AMD' if kind == 'amd_gpu' else 'Intel'} GPU 0x{card.device_id:04x}")
        family = smi.get("GFX Version") or amd.get("TARGET_GRAPHICS_VERSION") or gfx.get(card.device_id)
        integrated = None
        if vk is not None:
            integrated = vk.type == "integrated"
        elif kind == "intel_gpu" and card.vram_total is None:
            integrated = True  # Intel iGPUs have no local memory (i915 lists lmem only on Arc)
        vram = card.vram_total if card.vram_total is not None else _int(smi.get("VRAM Total Memory (B)"))
        used = card.vram_used if card.vram_used is not None else _int(smi.get("VRAM Total Used Memory (B)"))
        busy = card.busy_percent if card.busy_percent is not None else _float(smi.get("GPU use (%)"))
        index = per_kind.get(kind, 0)
        per_kind[kind] = index + 1
        gpu = Gpu(kind=kind, name=name, index=index, vram_bytes=vram, shared_bytes=card.gtt_total,
                  integrated=integrated, family=family, driver=card.driver, pci_slot=card.pci_slot,
                  device_id=card.device_id, vulkan_index=vk.index if vk else None,
                  source="rocm-smi" if smi else "amd-smi" if amd else "sysfs")
        out.append((gpu, GpuUsage(gpu_percent=busy, vram_used_bytes=used)))
    return out


def _amd_smi() -> dict[str, dict[str, str]]:
    exe = shutil.which("amd-smi")
    return parse_amd_smi_static(_run([exe, "static", "--asic", "--bus"]) or "") if exe else {}


def _rocm_smi() -> dict[str, dict[str, str]]:
    exe = shutil.which("rocm-smi")
    if exe is None:
        return {}
    return parse_rocm_smi_json(_run([exe, "--showproductname", "--showmeminfo", "vram", "--showuse", "--json"])
                               or "")


# --- Apple Metal -------------------------------------------------------------------------------


def parse_system_profiler_displays(text: str, memory_bytes: int) -> list[Gpu]:
    """`system_profiler SPDisplaysDataType -json`: Apple silicon GPUs share the machine's memory."""
    try:
        items = json.loads(text).get("SPDisplaysDataType") or []
    except (ValueError, AttributeError):
        return []
    gpus = []
    for i, item in enumerate(items):
        name = item.get("sppci_model") or item.get("_name") or "Apple GPU"
        name = re.sub(r"^kHW_Apple(\w+)Item$", r"Apple \1", name)  # how M1-era macOS names it
        metal = item.get("spdisplays_mtlgpufamilysupport") or item.get("spdisplays_metalfamily") or ""
        if not metal and "Apple" not in name:
            continue
        unified = "Apple" in name
        vram = memory_bytes if unified else _vram_text(item.get("spdisplays_vram") or item.get("_spdisplays_vram"))
        gpus.append(Gpu(kind="metal", name=name, index=i, vram_bytes=vram, integrated=unified, family="metal",
                        driver=metal or None, source="system_profiler"))
    return gpus


# --- AMD NPU -----------------------------------------------------------------------------------


def amd_npus(dev_root: Path = Path("/dev"), sys_root: Path = Path("/sys"), cpu_name: str = "") -> list[Npu]:
    """`/dev/accel/accelN` nodes whose driver is `amdxdna` (Ryzen AI NPUs)."""
    npus: list[Npu] = []
    try:
        nodes = sorted(p.name for p in (dev_root / "accel").iterdir() if p.name.startswith("accel"))
    except OSError:
        return npus
    for node in nodes:
        dev = sys_root / "class" / "accel" / node / "device"
        try:
            driver = (dev / "driver").resolve().name
        except OSError:
            continue
        if driver != "amdxdna":
            continue
        family = _XDNA_FAMILY.get(_int(_read(dev / "device")) or 0)
        npus.append(Npu(kind="amd_npu", name=cpu_name or "AMD NPU", family=family,
                        device_node=str(dev_root / "accel" / node), driver=driver))
    return npus


# --- the report --------------------------------------------------------------------------------

_cache_lock = threading.Lock()
_cache: tuple[float, DeviceReport, GpuUsage] | None = None
_CACHE_SECONDS = 300.0  # devices do not come and go while the server runs; usage is re-read


def detect_devices(refresh: bool = False) -> DeviceReport:
    """Everything this machine has, from real sources (memoised for five minutes: tools like
    vulkaninfo take a fraction of a second and the answer does not change under a running server)."""
    global _cache
    with _cache_lock:
        if not refresh and _cache is not None and time.monotonic() - _cache[0] < _CACHE_SECONDS:
            return _cache[1]
        report, usage = _detect()
        _cache = (time.monotonic(), report, usage)
        return report


def _detect() -> tuple[DeviceReport, GpuUsage]:
    cpu = cpu_facts()
    errors: list[str] = []
    vulkan, vk_error = vulkan_devices()
    if vk_error:
        errors.append(vk_error)
    found: list[tuple[Gpu, GpuUsage]] = []
    if sys.platform == "darwin":
        profile = _run(["system_profiler", "SPDisplaysDataType", "-json"]) or ""
        found += [(g, GpuUsage()) for g in parse_system_profiler_displays(profile, cpu.memory_bytes)]
    else:
        found += _with_vulkan(nvidia_gpus(), vulkan)
        cards = read_drm_cards()
        amd = any(c.vendor == AMD_VENDOR for c in cards)  # the AMD tools only where there is an AMD card
        found += sysfs_gpus(cards, kfd_gfx_targets(), _rocm_smi() if amd else {}, vulkan, _amd_smi() if amd else {})
    npus = amd_npus(cpu_name=cpu.name) if sys.platform.startswith("linux") else []
    report = DeviceReport(cpu=cpu, gpus=tuple(g for g, _ in found), vulkan=tuple(vulkan), npus=tuple(npus),
                          errors=tuple(errors))
    return report, _total_usage([u for _, u in found])


def _with_vulkan(found: list[tuple[Gpu, GpuUsage]], vulkan: list[VulkanDevice]) -> list[tuple[Gpu, GpuUsage]]:
    """Link NVIDIA GPUs to their Vulkan entries (same vendor, in order)."""
    vk = [v for v in vulkan if v.vendor_id == NVIDIA_VENDOR and v.is_gpu]
    return [(replace(g, vulkan_index=vk[i].index) if i < len(vk) else g, u) for i, (g, u) in enumerate(found)]


def _total_usage(usages: list[GpuUsage]) -> GpuUsage:
    busy = [u.gpu_percent for u in usages if u.gpu_percent is not None]
    used = [u.vram_used_bytes for u in usages if u.vram_used_bytes is not None]
    return GpuUsage(gpu_percent=max(busy) if busy else None, vram_used_bytes=sum(used) if used else None)


def gpu_usage() -> GpuUsage:
    """Live GPU busy % (the busiest GPU) and VRAM in use (all GPUs); None where no GPU reports it.
    Re-reads the sources each call (sysfs is cheap; NVML / nvidia-smi only run on NVIDIA machines)."""
    report = detect_devices()
    if not report.gpus:
        return GpuUsage()
    usages: list[GpuUsage] = []
    if report.gpus_of("nvidia_gpu"):
        usages += [u for _, u in nvidia_gpus()]
    if report.gpus_of("amd_gpu") or report.gpus_of("intel_gpu"):
        usages += [u for _, u in sysfs_gpus(read_drm_cards(), {}, {}, [])]
    return _total_usage(usages)


@dataclass(frozen=True)
class MemoryUse:
    """How full the memory models live in is, now: GPU memory where GPUs report it, else system RAM
    (where CPU-served models live). The router's pressure eviction compares `fraction` with
    `auto_evict_threshold_pct`."""

    used_bytes: int
    total_bytes: int
    source: Literal["vram", "ram"]

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else 0.0


def memory_use() -> MemoryUse:
    """A live reading (gpu_usage re-reads NVML / nvidia-smi / sysfs; psutil reads /proc/meminfo)."""
    total_vram = sum(g.vram_bytes or 0 for g in detect_devices().gpus)
    if total_vram > 0:
        used = gpu_usage().vram_used_bytes
        if used is not None:
            return MemoryUse(used, total_vram, "vram")
    from lemonade.system.memory import read_budget

    # Host RAM within the server's memory cgroup, when a cgroup limit is what binds (a container)
    budget = read_budget()
    cgroup = budget.cgroup
    if cgroup is not None and cgroup.limit_bytes is not None and cgroup.limit_bytes < budget.ram_bytes:
        return MemoryUse(cgroup.working_set_bytes, cgroup.limit_bytes, "ram")
    return MemoryUse(budget.ram_bytes - budget.available_bytes, budget.ram_bytes, "ram")


# --- small helpers -----------------------------------------------------------------------------


def _run(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("%s failed: %s", argv[0], exc)
        return None
    if proc.returncode != 0:
        log.info("%s exited %s: %s", argv[0], proc.returncode, proc.stderr.strip()[-300:])
        return None
    return proc.stdout


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _mib(text: str | None) -> int | None:
    value = _float(text)
    return None if value is None else int(value * 2**20)


def _vram_text(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)\s*(MB|GB)", text or "")
    if not m:
        return None
    return int(m.group(1)) * (2**30 if m.group(2) == "GB" else 2**20)


def _sm(cap: str) -> str | None:
    m = re.fullmatch(r"(\d+)\.(\d+)", cap)
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


def _pci(bus: str | None) -> str | None:
    """Normalise PCI addresses: NVML's "00000000:01:00.0" and sysfs's "0000:01:00.0" alike."""
    m = re.search(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.(\d)$", bus or "")
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
