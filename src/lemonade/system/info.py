"""Host facts for `/v1/system-info` and `/v1/system-stats`: truthful, null where unknown."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Any

import psutil


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


def devices() -> dict[str, Any]:
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return {
        "cpu": {"name": processor_name(), "cores": physical, "threads": psutil.cpu_count() or physical,
                "available": True},
        "amd_gpu": [],
        "nvidia_gpu": [],
        "amd_npu": {"available": False, "error": "No AMD NPU detected on this system"},
    }


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
    mem = psutil.virtual_memory()
    return {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "memory_gb": round((mem.total - mem.available) / 2**30, 2),
        "gpu_percent": None,
        "vram_gb": None,
        "npu_percent": None,
    }
