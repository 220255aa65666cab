"""llama.cpp's GPU backends (`vulkan`, `rocm`, `cuda`, `metal`): which devices of this machine each
one can use, the official release archives of the pinned build, and the CMake flags and toolkit of
a source build.

The release asset names are the pinned build's own (`.github/workflows/release.yml` of llama.cpp
b11312: `llama-<tag>-bin-ubuntu-vulkan-x64.tar.gz`, `...-bin-ubuntu-rocm-10.0-x64.tar.gz`,
`...-bin-ubuntu-cuda-12.8-x64.tar.gz` plus its `cudart-...` runtime, `...-bin-macos-arm64.tar.gz`
whose build includes Metal, and the Windows zips). Where no archive is reachable the backend is
built from the same sources as `cpu`, with the backend's CMake switch, when its toolkit is present;
otherwise the install is refused with the names of what is missing.

Which backend is the default follows the configuration guide's decision tree: CUDA for an NVIDIA GPU
of compute capability 7.5 or newer, ROCm for an AMD GPU of a family the ROCm build targets, Vulkan
for any other Vulkan GPU, Metal on macOS, else the CPU.
"""

from __future__ import annotations

import platform
import re
import shutil
import sys
from pathlib import Path

from lemonade.system.devices import AMD_VENDOR, INTEL_VENDOR, NVIDIA_VENDOR, DeviceReport

GPU_BACKENDS = ("vulkan", "rocm", "cuda", "metal")
# The ISAs the pinned build's ROCm release is compiled for (release.yml, ubuntu-24-rocm gpu_targets).
ROCM_TARGETS = frozenset("gfx908 gfx90a gfx942 gfx950 gfx1010 gfx1011 gfx1012 gfx1030 gfx1031 gfx1032 gfx1033 "
                         "gfx1034 gfx1035 gfx1036 gfx1100 gfx1101 gfx1102 gfx1103 gfx1150 gfx1151 gfx1152 gfx1200 "
                         "gfx1201".split())
ROCM_RELEASE = "10.0"          # the ROCm version in the pinned build's archive names
MIN_CUDA_SM = 75               # the CUDA builds' oldest architecture (Turing)
_NAMES = {"vulkan": "Vulkan", "rocm": "ROCm", "cuda": "CUDA", "metal": "Metal"}
_VENDOR_KIND = {AMD_VENDOR: "amd_gpu", NVIDIA_VENDOR: "nvidia_gpu", INTEL_VENDOR: "intel_gpu"}


def _arch(machine: str | None = None) -> str | None:
    m = (machine or platform.machine()).lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(m)


def _os(system: str | None = None) -> str:
    s = system or sys.platform
    return "linux" if s.startswith("linux") else {"darwin": "macos", "win32": "windows"}.get(s, s)


# --- devices -----------------------------------------------------------------------------------


def _sm(family: str | None) -> int:
    return int(family[3:]) if family and family.startswith("sm_") and family[3:].isdigit() else 0


def backend_devices(backend: str, report: DeviceReport, system: str | None = None) -> list[str]:
    """The device kinds (`/v1/system-info` names) of this machine that `backend` can run on."""
    osname = _os(system)
    if backend == "cpu":
        return ["cpu"]
    if backend == "metal":
        return ["metal"] if osname == "macos" and report.gpus_of("metal") else []
    if osname == "macos":
        return []
    if backend == "vulkan":
        kinds = [_VENDOR_KIND.get(v.vendor_id, "gpu") for v in report.vulkan_gpus]
        return sorted(set(kinds), key=kinds.index)
    if backend == "rocm":
        return ["amd_gpu"] if any(g.family in ROCM_TARGETS for g in report.gpus_of("amd_gpu")) else []
    if backend == "cuda":
        return ["nvidia_gpu"] if any(_sm(g.family) >= MIN_CUDA_SM for g in report.gpus_of("nvidia_gpu")) else []
    return []


def unsupported_message(backend: str, report: DeviceReport, system: str | None = None) -> str:
    """Why `backend` has no device here, in the user's terms (shown as the backend's `message`)."""
    osname = _os(system)
    if backend == "metal":
        return "Requires macOS" if osname != "macos" else "Requires a Metal GPU (none found by system_profiler)"
    if osname == "macos":
        return f"The {_NAMES[backend]} backend is not built for macOS; use llamacpp:metal"
    if backend == "vulkan":
        soft = [v.name for v in report.vulkan if not v.is_gpu]
        if soft:
            return f"Requires a Vulkan GPU; this machine has only the software renderer {soft[0]}"
        return "Requires a Vulkan GPU and its driver (vulkaninfo --summary lists none)"
    if backend == "rocm":
        amd = report.gpus_of("amd_gpu")
        if amd:
            fams = ", ".join(sorted({g.family or "unknown family" for g in amd}))
            return f"Requires an AMD GPU of a family ROCm targets (found {fams})"
        return "Requires an AMD GPU (RDNA2 or newer, or an Instinct accelerator)"
    if backend == "cuda":
        nv = report.gpus_of("nvidia_gpu")
        if nv:
            return f"Requires an NVIDIA GPU of compute capability 7.5 or newer (found {nv[0].family or 'unknown'})"
        return "Requires an NVIDIA GPU and its driver (neither NVML nor nvidia-smi found one)"
    return f"Unknown backend '{backend}'"


def best_backend(report: DeviceReport, system: str | None = None) -> str | None:
    """The GPU backend the configuration guide recommends for this machine, or None (use the CPU)."""
    for backend in ("metal", "cuda", "rocm", "vulkan"):
        if backend_devices(backend, report, system):
            return backend
    return None


def vulkan_visible_devices(report: DeviceReport) -> str | None:
    """`GGML_VK_VISIBLE_DEVICES` for a machine whose only Vulkan devices are software renderers:
    llama.cpp skips CPU-type Vulkan devices unless told to use them, so a forced `vulkan` backend
    on such a machine would otherwise silently run without a device. None when a GPU is there."""
    if report.vulkan_gpus or not report.vulkan:
        return None
    return ",".join(str(v.index) for v in report.vulkan)


def uses_gpu(backend: str, report: DeviceReport) -> bool:
    """Whether a model on `backend` runs on a real GPU (health `device`); a software Vulkan device
    (lavapipe) is the CPU."""
    return bool(backend_devices(backend, report)) if backend in GPU_BACKENDS else False


# --- release archives --------------------------------------------------------------------------


def release_assets(backend: str, tag: str, system: str | None = None, machine: str | None = None) -> list[str]:
    """The official archives of `backend` at `tag` for this OS/CPU, the main one first (CUDA adds
    its runtime libraries' archive); [] where upstream publishes none."""
    osname, arch = _os(system), _arch(machine)
    if arch is None:
        return []
    if backend == "vulkan":
        if osname == "linux":
            return [f"llama-{tag}-bin-ubuntu-vulkan-{arch}.tar.gz"]
        if osname == "windows" and arch == "x64":
            return [f"llama-{tag}-bin-win-vulkan-x64.zip"]
    elif backend == "rocm" and arch == "x64":
        if osname == "linux":
            return [f"llama-{tag}-bin-ubuntu-rocm-{ROCM_RELEASE}-x64.tar.gz"]
        if osname == "windows":
            return [f"llama-{tag}-bin-win-rocm-{ROCM_RELEASE}-x64.zip"]
    elif backend == "cuda":
        if osname == "linux":
            cuda = "12.8" if arch == "x64" else "13.4"
            return [f"llama-{tag}-bin-ubuntu-cuda-{cuda}-{arch}.tar.gz",
                    f"cudart-llama-{tag}-bin-ubuntu-cuda-{cuda}-{arch}.tar.gz"]
        if osname == "windows":
            cuda = "12.4" if arch == "x64" else "13.4"
            return [f"llama-{tag}-bin-win-cuda-{cuda}-{arch}.zip", f"cudart-llama-bin-win-cuda-{cuda}-{arch}.zip"]
    elif backend == "metal" and osname == "macos":
        return [f"llama-{tag}-bin-macos-{arch}.tar.gz"]
    return []


# --- source builds -----------------------------------------------------------------------------


def _first(*candidates: str | None) -> str | None:
    for c in candidates:
        if c and (shutil.which(c) or Path(c).is_file()):
            return shutil.which(c) or c
    return None


def vulkan_header_dir() -> Path | None:
    """Where CMake's FindVulkan takes the headers from: `$VULKAN_SDK/include` (the LunarG SDK's
    convention, searched first), else the system's."""
    import os

    roots = [Path(os.environ["VULKAN_SDK"]) / "include"] if os.environ.get("VULKAN_SDK") else []
    roots += [Path("/usr/include"), Path("/usr/local/include")]
    return next((r for r in roots if (r / "vulkan" / "vulkan.h").is_file()), None)


def _vulkan_headers_missing() -> str | None:
    """The pinned llama.cpp's ggml-vulkan uses VK_EXT_layer_settings (`vk::LayerSettingEXT`), which
    older headers lack (Debian 12's 1.3.239 does): say so before a long build fails on it."""
    root = vulkan_header_dir()
    if root is None:
        return "the Vulkan headers (Debian: libvulkan-dev; or the LunarG Vulkan SDK with VULKAN_SDK set)"
    core = root / "vulkan" / "vulkan_core.h"
    text = core.read_text(errors="replace") if core.is_file() else ""
    if "VK_EXT_layer_settings" not in text:
        m = re.search(r"VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(0, (\d+), (\d+), VK_HEADER_VERSION\)", text)
        n = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
        found = f"version {m.group(1)}.{m.group(2)}.{n.group(1)}" if m and n else "an unknown version"
        return (f"newer Vulkan headers: {root} has {found}, without VK_EXT_layer_settings, which the pinned llama.cpp "
                "uses (libvulkan-dev of Debian 13 or Ubuntu 24.04, or the LunarG Vulkan SDK with VULKAN_SDK "
                "pointing at it)")
    return None


def _spirv_headers() -> bool:
    roots = [Path(p) for p in ("/usr/share/cmake", "/usr/lib/x86_64-linux-gnu/cmake",
                               "/usr/lib/aarch64-linux-gnu/cmake", "/usr/local/share/cmake", "/usr/lib/cmake",
                               "/usr/local/lib/cmake")]
    return any((r / "SPIRV-Headers").is_dir() for r in roots)


def _libvulkan() -> bool:
    import ctypes.util

    return ctypes.util.find_library("vulkan") is not None


def missing_toolkit(backend: str) -> list[str]:
    """What a source build of `backend` needs and this machine lacks (Debian package names where
    that is how one gets it); [] when the build can start."""
    if backend == "vulkan":
        missing = []
        if not _first("glslc"):
            missing.append("the glslc shader compiler (Debian: glslc; or the Vulkan SDK)")
        headers = _vulkan_headers_missing()
        if headers:
            missing.append(headers)
        if not _libvulkan():
            missing.append("the Vulkan loader library (Debian: libvulkan1 and libvulkan-dev)")
        if not _spirv_headers():
            missing.append("SPIRV-Headers (Debian: spirv-headers)")
        return missing
    if backend == "rocm":
        return [] if _first("hipcc", "/opt/rocm/bin/hipcc") and _hip_clang() else \
            ["ROCm's HIP compiler (hipcc and /opt/rocm/llvm/bin/clang; install ROCm)"]
    if backend == "cuda":
        return [] if _first("nvcc", "/usr/local/cuda/bin/nvcc") else ["the CUDA toolkit's nvcc (install CUDA)"]
    if backend == "metal":
        if sys.platform != "darwin":
            return ["macOS"]
        return [] if _first("xcrun") else ["Xcode command line tools (xcode-select --install)"]
    return []


def _hip_clang() -> str | None:
    return _first("/opt/rocm/llvm/bin/clang")


def cmake_flags(backend: str, report: DeviceReport | None = None) -> tuple[str, ...]:
    """The backend's CMake switches on top of the CPU build's flags. ROCm and CUDA compile for this
    machine's GPU architectures only (a build for all of them takes hours)."""
    if backend == "vulkan":
        return ("-DGGML_VULKAN=ON",)
    if backend == "metal":
        return ("-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON")
    if backend == "rocm":
        targets = sorted({g.family for g in (report.gpus_of("amd_gpu") if report else []) if g.family in ROCM_TARGETS})
        flags = ["-DGGML_HIP=ON"]
        if _hip_clang():
            flags.append(f"-DCMAKE_HIP_COMPILER={_hip_clang()}")
        if targets:
            flags.append(f"-DGPU_TARGETS={';'.join(targets)}")
        return tuple(flags)
    if backend == "cuda":
        archs = sorted({str(_sm(g.family)) for g in (report.gpus_of("nvidia_gpu") if report else []) if _sm(g.family)})
        flags = ["-DGGML_CUDA=ON"]
        nvcc = _first("nvcc", "/usr/local/cuda/bin/nvcc")
        if nvcc:
            flags.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        # No NVIDIA GPU seen (a forced install): PTX for Turing, which the driver compiles for any newer GPU.
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs) if archs else '75-virtual'}")
        return tuple(flags)
    return ()
