"""The pinned llama.cpp and how to get its `llama-server`: the official release archive, or a build
from source (the shared machinery is `native_build.py`).

Both paths end in a folder that holds `llama-server` (plus, for a release archive, the shared
libraries next to it). `install.py` owns everything around that: the on-disk layout, locking,
`install.json`, and swapping a finished install into place.

The pinned engine is the llama.cpp that the `llama-cpp-python` sdist on PyPI vendors under
`vendor/llama.cpp`. The sdist carries no git metadata (its `.git` is a dangling submodule pointer),
so the release tag and commit are constants here. Upstream names release tags `b<build number>`
after the commit count; for 0.3.36 (CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098")
that is `b11312`. We pass both to CMake so a source build reports the same `--version` as the
release archive does.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from lemonade.backends.engine import InstallError  # noqa: F401 - part of this module's API
from lemonade.backends.native_build import (  # noqa: F401 - part of this module's API
    BuildLog,
    Progress,
    VendoredSource,
    cpu_cmake_flags,
    emit,
    extract_vendored,
    run_logged,
)
from lemonade.backends.native_build import check_toolchain as _check_toolchain
from lemonade.backends.native_build import cmake_build as _cmake_build
from lemonade.backends.native_build import fetch_release as _fetch_release
from lemonade.backends.native_build import fetch_sdist as _fetch_sdist

# --- the pinned engine -------------------------------------------------------------------------

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_BUILD_NUMBER = 11312
LLAMA_CPP_VERSION = f"b{LLAMA_CPP_BUILD_NUMBER}"  # also the GitHub release tag

RELEASE_BASE_URL = "https://github.com/ggml-org/llama.cpp/releases/download"

# Environment overrides (documented in install.py's module docstring).
ENV_SDIST = "LEMONADE_LLAMACPP_SDIST"  # local sdist tarball instead of `pip download`
ENV_RELEASE_BASE_URL = "LEMONADE_LLAMACPP_RELEASE_BASE_URL"  # mirror of the GitHub release folder
ENV_NO_RELEASE = "LEMONADE_LLAMACPP_NO_RELEASE"  # "1": never try the release archive

# Targets we build and copy. llama-gguf-split is small and handy for tests (sharded models);
# ggml-rpc-server is the worker of llama.cpp's distributed engine (`lemonade worker`, backends/llamacpp/rpc.py).
RPC_SERVER = "ggml-rpc-server"  # upstream's target; older releases named the program `rpc-server`
BUILD_TARGETS = ("llama-server", "llama-gguf-split", RPC_SERVER)

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # One self-contained binary: a shared build hard-codes the build folder as RUNPATH.
    "-DBUILD_SHARED_LIBS=OFF",
    # Keep configure and build off the network.
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    # llama.cpp's RPC backend, in every build rather than a separate `rpc` one: it gives
    # `llama-server --rpc host:port,...` and the `ggml-rpc-server` worker (docs/scale-out.md). The
    # official release archives are built with it too, so both install paths end in the same
    # layout; the backend only acts when `--rpc` is given. Adding it changed the recorded flags, so a
    # cpu build of an older Lemonade is rebuilt once (with ccache that is mostly a relink).
    "-DGGML_RPC=ON",
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT[:9]}",
)


def build_flags(backend: str = "cpu") -> list[str]:
    """Every CMake flag a source build of `backend` on this machine uses; recorded in install.json, so
    a build made with other flags (an older Lemonade's, e.g. with AMX kernels, or for another GPU)
    is rebuilt rather than trusted. GPU backends add their switch (llamacpp.gpu.cmake_flags)."""
    from lemonade.backends.llamacpp.gpu import GPU_BACKENDS, cmake_flags
    from lemonade.system.devices import detect_devices

    gpu = cmake_flags(backend, detect_devices()) if backend in GPU_BACKENDS else ()
    return [*CMAKE_FLAGS, *cpu_cmake_flags(), *gpu]


LLAMA_SOURCE = VendoredSource(
    project="llama.cpp", version=LLAMA_CPP_VERSION, commit=LLAMA_CPP_COMMIT, package="llama-cpp-python",
    package_version=LLAMA_CPP_PYTHON_VERSION, filename=f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz",
    vendor_path=("vendor", "llama.cpp"), required=("tools/server", "convert_hf_to_gguf.py", "gguf-py"),
    env_sdist=ENV_SDIST,
)


def check_toolchain() -> dict[str, str]:
    return _check_toolchain("llama.cpp")


# --- version probe -----------------------------------------------------------------------------

# `--version` prints e.g. "version: 0.5.0-dev (build 11312, commit 0c1e57098)"; older builds
# printed "version: 11312 (0c1e5709)".
_VERSION_RES = (
    re.compile(r"\(build (\d+), commit ([0-9a-fA-F]+|unknown)\)"),
    re.compile(r"version:\s*(\d+)\s*\(([0-9a-fA-F]+|unknown)\)"),
)


def probe_version(binary: Path | str, timeout: float = 20.0) -> tuple[str | None, str]:
    """Run `<binary> --version`; return ("b<build>", or the commit when the build number is unknown,
    or None) and the raw output. Raises OSError / subprocess.TimeoutExpired when it cannot run."""
    proc = subprocess.run(
        [str(binary), "--version"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    raw = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        return None, raw
    for pattern in _VERSION_RES:
        m = pattern.search(raw)
        if m:
            number = int(m.group(1))
            return (f"b{number}" if number > 0 else m.group(2)), raw
    return None, raw


def staged_version(binary: Path, blog: BuildLog, progress: Progress | None) -> str | None:
    """The version a freshly staged llama-server reports (None when it does not run), its output
    written to the install log: the check every llama.cpp install makes before it is swapped in."""
    emit(progress, "install", "Checking the new llama-server", None)
    try:
        version, raw = probe_version(binary)
    except Exception as exc:
        version, raw = None, f"{type(exc).__name__}: {exc}"
    blog.write(f"$ llama-server --version\n{raw}")
    return version


# --- release archive ---------------------------------------------------------------------------


def release_asset_name(tag: str = LLAMA_CPP_VERSION) -> str | None:
    """The CPU release archive for this OS/CPU, or None where upstream publishes none."""
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if arch is None:
        return None
    if sys.platform.startswith("linux"):
        return f"llama-{tag}-bin-ubuntu-{arch}.tar.gz"
    if sys.platform == "darwin":
        return f"llama-{tag}-bin-macos-{arch}.tar.gz"
    if sys.platform == "win32":
        return f"llama-{tag}-bin-win-cpu-{arch}.zip"
    return None


def release_url(asset: str, tag: str = LLAMA_CPP_VERSION) -> str:
    base = os.environ.get(ENV_RELEASE_BASE_URL) or RELEASE_BASE_URL
    return f"{base.rstrip('/')}/{tag}/{asset}"


def fetch_release(downloads_dir: Path, work_dir: Path, blog: BuildLog, progress: Progress | None,
                  url: str | None = None, exe: str | None = None) -> Path:
    """Download + unpack a release archive (the CPU one unless `url` is given) into `work_dir`; return
    the folder holding `exe` (llama-server, or a glob such as `libcudart.so*`). Raises on any
    failure; the caller falls back to the source build."""
    if url is None:
        asset = release_asset_name()
        if asset is None:
            raise RuntimeError(f"no llama.cpp release archive for {sys.platform}/{platform.machine()}")
        url = release_url(asset)
    exe = exe or ("llama-server.exe" if sys.platform == "win32" else "llama-server")
    return _fetch_release(url, exe, downloads_dir, work_dir, blog, progress, no_release_env=ENV_NO_RELEASE,
                          publisher=RELEASE_BASE_URL)


def sdist_filename() -> str:
    return LLAMA_SOURCE.filename


def fetch_sdist(downloads_dir: Path, blog: BuildLog, progress: Progress | None) -> Path:
    """The llama-cpp-python sdist: $LEMONADE_LLAMACPP_SDIST, a cached download, or `pip download`."""
    return _fetch_sdist(LLAMA_SOURCE, downloads_dir, blog, progress)


def extract_llama_cpp(sdist: Path, src_root: Path, blog: BuildLog, progress: Progress | None) -> Path:
    """Unpack the sdist's `vendor/llama.cpp` into `<src_root>/llama.cpp-<version>/` (once)."""
    return extract_vendored(LLAMA_SOURCE, sdist, src_root, blog, progress)


def cmake_build(src: Path, build_dir: Path, tools: dict[str, str], blog: BuildLog, progress: Progress | None,
                flags: list[str] | None = None) -> Path:
    """Configure + build llama-server (and llama-gguf-split) with `flags` (the CPU build's by
    default); the folder with the binaries."""
    return _cmake_build("llama.cpp", src, build_dir, tools, blog, progress, flags=flags or build_flags(),
                        targets=BUILD_TARGETS, binary="llama-server")
