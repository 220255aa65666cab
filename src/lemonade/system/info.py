"""Host facts for `/v1/system-info` and `/v1/system-stats`: truthful, null where unknown."""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import psutil

from lemonade.system.devices import DeviceReport, Gpu, detect_devices, gpu_usage


def processor_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def os_version() -> str:
    try:
        info = platform.freedesktop_os_release()
        return f"{info.get('PRETTY_NAME', 'Linux')} (kernel {platform.release()})"
    except (OSError, AttributeError):
        return f"{platform.system()} {platform.release()}"


def storage(path: Path) -> dict[str, Any]:
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return {"path": str(path), "used_bytes": usage.used, "total_bytes": usage.total, "free_bytes": usage.free}


def _gpu_entry(gpu: Gpu) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": gpu.name, "available": True}
    if gpu.vram_gb is not None:
        entry["vram_gb"] = gpu.vram_gb
    if gpu.shared_bytes:
        entry["virtual_mem_gb"] = round(gpu.shared_bytes / 2**30, 1)
    if gpu.family:
        entry["family"] = gpu.family
    if gpu.driver:
        entry["driver_version" if gpu.kind == "nvidia_gpu" else "driver"] = gpu.driver
    if gpu.integrated is not None:
        entry["integrated"] = gpu.integrated
    if gpu.kind == "nvidia_gpu":
        entry["index"] = gpu.index
    return entry


def devices(report: DeviceReport | None = None) -> dict[str, Any]:
    """`/v1/system-info` `devices`: the spec's cpu / amd_gpu / nvidia_gpu / amd_npu (and metal on
    macOS), plus `intel_gpu` and `vulkan` (the Vulkan loader's devices, software renderers included,
    with the index llama.cpp's `Vulkan<N>` device names use)."""
    report = report or detect_devices()
    cpu = report.cpu
    out: dict[str, Any] = {
        "cpu": {"name": cpu.name or processor_name(), "cores": cpu.cores, "threads": cpu.threads,
                "available": True, "family": cpu.arch, "isa": list(cpu.isa), "memory_gb": cpu.memory_gb},
        "amd_gpu": [_gpu_entry(g) for g in report.gpus_of("amd_gpu")],
        "nvidia_gpu": [_gpu_entry(g) for g in report.gpus_of("nvidia_gpu")],
        "intel_gpu": [_gpu_entry(g) for g in report.gpus_of("intel_gpu")],
        "vulkan": [{"index": v.index, "name": v.name, "type": v.type, "driver": v.driver,
                    "vendor_id": f"0x{v.vendor_id:04x}", "device_id": f"0x{v.device_id:04x}"} for v in report.vulkan],
    }
    metal = report.gpus_of("metal")
    if sys.platform == "darwin" or metal:
        out["metal"] = {**_gpu_entry(metal[0]), "family": "metal"} if metal else \
            {"available": False, "error": "No Metal GPU detected on this system"}
    if report.npus:
        npu = report.npus[0]
        out["amd_npu"] = {"name": npu.name, "available": True, "device": npu.device_node, "driver": npu.driver,
                          **({"family": npu.family} if npu.family else {})}
    else:
        out["amd_npu"] = {"available": False, "error": "No AMD NPU detected on this system"}
    return out


def system_info(model_storage: Path, recipes: dict[str, Any]) -> dict[str, Any]:
    return {
        "OS Version": os_version(),
        "Processor": processor_name(),
        "Physical Memory": f"{psutil.virtual_memory().total / 2**30:.1f} GB",
        "model_storage": storage(model_storage),
        "devices": devices(),
        "recipes": recipes,
    }


def system_stats() -> dict[str, Any]:
    """GPU figures are null only where no GPU reports them (no GPU, or a driver without counters;
    the amdxdna NPU driver exposes no utilisation counter)."""
    mem = psutil.virtual_memory()
    gpu = gpu_usage()
    return {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "memory_gb": round((mem.total - mem.available) / 2**30, 2),
        "gpu_percent": gpu.gpu_percent,
        "vram_gb": None if gpu.vram_used_bytes is None else round(gpu.vram_used_bytes / 2**30, 2),
        "npu_percent": gpu.npu_percent,
    }
