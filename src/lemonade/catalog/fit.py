"""Hardware-based model filtering: built-in models this machine cannot hold are not offered.

guide-configuration-README.md: `disable_model_filtering` shows all models regardless of hardware;
`enable_dgpu_gtt` counts a discrete GPU's GTT (system memory it may map) too. What "hold" means is
Lemonade's rule: a model fits when its catalog `size` (GB) is at most the larger of the biggest
single device memory pool and 80 % of system RAM. A device pool is a discrete GPU's VRAM, an
integrated GPU's larger of its carve-out and its shared (GTT) memory, or, with `enable_dgpu_gtt`,
VRAM plus GTT for every GPU.

Only built-in models that are not downloaded are left out: models the user registered or dropped
in the extra models dir are the user's call, a downloaded model is on disk already (and must stay
visible to be deleted), and collections and cloud models hold no local weights of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from lemonade.model_info import ModelInfo
from lemonade.system.devices import DeviceReport, Gpu

RAM_SHARE = 0.8  # of system RAM a model may take (the OS and the server need the rest)
GIB = 2**30


@dataclass(frozen=True)
class MemoryBudget:
    system_ram_gb: float
    largest_pool_gb: float  # the biggest single device memory pool (0 without a GPU)

    @property
    def max_model_gb(self) -> float:
        return max(self.largest_pool_gb, RAM_SHARE * self.system_ram_gb)


def _pool_gb(gpu: Gpu, dgpu_gtt: bool) -> float:
    vram, shared = (gpu.vram_bytes or 0) / GIB, (gpu.shared_bytes or 0) / GIB
    if dgpu_gtt:
        return vram + shared
    if gpu.integrated:
        return max(vram, shared)
    return vram


def memory_budget(report: DeviceReport, dgpu_gtt: bool = False) -> MemoryBudget:
    """The budget of the machine `report` describes (lemonade.system.devices reads it)."""
    pools = [_pool_gb(g, dgpu_gtt) for g in report.gpus]
    return MemoryBudget(system_ram_gb=report.cpu.memory_bytes / GIB, largest_pool_gb=max(pools, default=0.0))


def too_big(model: ModelInfo, budget: MemoryBudget) -> str | None:
    """Why a built-in model is not offered on this machine, or None when it is (downloaded or not:
    the caller decides about downloaded ones)."""
    if model.origin != "builtin" or model.is_collection or not model.size:
        return None
    if model.size <= budget.max_model_gb:
        return None
    return (f"{model.public} needs about {model.size:.1f} GB of memory; this machine offers models up to "
            f"{budget.max_model_gb:.1f} GB (80 % of {budget.system_ram_gb:.1f} GB RAM, or its largest GPU memory). "
            "Set disable_model_filtering to list it anyway.")
