"""Hardware-based model filtering: built-in models this machine cannot hold are not offered.

guide-configuration-README.md: `disable_model_filtering` shows all models regardless of hardware;
`enable_dgpu_gtt` counts a discrete GPU's GTT (system memory it may map) too. What "hold" means is
Lemonade's rule: a model fits when its catalog `size` (GB) is at most the larger of the biggest
single device memory pool and 80 % of system RAM, where system RAM is what the server may ever use:
the machine's RAM, or the limit of the memory cgroup it runs in when that is lower (a container's;
lemonade.system.memory, the budget every memory decision reads). A device pool is a discrete GPU's VRAM, an
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


def memory_budget(report: DeviceReport, dgpu_gtt: bool = False, cap_bytes: int | None = None) -> MemoryBudget:
    """The budget of the machine `report` describes (lemonade.system.devices reads it); `cap_bytes`: the
    most the server may use (its cgroup's limit, when lower than the RAM)."""
    pools = [_pool_gb(g, dgpu_gtt) for g in report.gpus]
    ram = min(report.cpu.memory_bytes, cap_bytes) if cap_bytes else report.cpu.memory_bytes
    return MemoryBudget(system_ram_gb=ram / GIB, largest_pool_gb=max(pools, default=0.0))


def too_big(model: ModelInfo, budget: MemoryBudget) -> str | None:
    """Why a built-in model is not offered on this machine, or None when it is (downloaded or not:
    the caller decides about downloaded ones)."""
    if model.origin != "builtin" or model.is_collection or not model.size:
        return None
    if model.size <= budget.max_model_gb:
        return None
    return (f"{model.public} needs about {model.size:.1f} GB of memory; this server offers models up to "
            f"{budget.max_model_gb:.1f} GB (80 % of the {budget.system_ram_gb:.1f} GB of RAM it may use, or its "
            "largest GPU memory). Set disable_model_filtering to list it anyway.")
