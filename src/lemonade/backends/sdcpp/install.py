"""The pinned stable-diffusion.cpp and how `sd-server` and `sd-cli` get into `<cache>/backends/sd-cpp/<backend>/`
(`cpu`, `vulkan`).

The pin is stable-diffusion.cpp master-596-90e87bc, the tree that the `stable-diffusion-cpp-python`
0.4.7 sdist on PyPI vendors under `vendor/stable-diffusion.cpp/` (every source file identical to
that tag; the sdist carries no git metadata). Its `examples/server` is sd-server, with the
OpenAI image routes and cancellable async jobs; `examples/cli` is sd-cli). Two ways to get it,
both through `native_build.py` / `native_install.py` like llama.cpp and whisper.cpp:

- the official release archive (`sd-master-<commit>-bin-<platform>.zip`), where upstream publishes
  one for this platform and GitHub is reachable (tried first, failing within seconds offline);
- a static CMake build of the sdist's sources, targets `sd-server` and `sd-cli` (WebP/WebM and the
  web frontend left out: nothing of ours uses them). Cold: 28 minutes measured on 2 cores shared
  with other builds (load average 15-20); expect 10-15 on an idle 2-core machine. With a warm
  ccache (`CMAKE_<LANG>_COMPILER_LAUNCHER=ccache`) a rebuild is a few minutes.

The `vulkan` backend is the same: upstream's Vulkan archive (`...-x86_64-vulkan.zip`,
`...-bin-win-vulkan-x64.zip`, the names upstream Lemonade installs), else the sources built with
`-DGGML_VULKAN=ON` (backends/llamacpp/gpu.py says what that needs). sd.cpp picks its ggml device at run time,
so its own sources compile the same for both backends and the Vulkan build takes them from ccache.

Environment knobs, as whisper.cpp's: `LEMONADE_SDCPP_SDIST=<path>` (a local sdist; skips the
release archive), `LEMONADE_SDCPP_RELEASE_BASE_URL=<url>` (a mirror of `.../releases/download`),
`LEMONADE_SDCPP_NO_RELEASE=1`.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from lemonade.backends.engine import InstallError
from lemonade.backends.native_build import (
    BuildLog,
    Progress,
    VendoredSource,
    emit,
)
from lemonade.backends.native_install import NativeInstall

log = logging.getLogger("lemonade.install")

SDCPP_VERSION = "master-596-90e87bc"  # upstream's release tag of the vendored commit
SDCPP_COMMIT = "90e87bc846f17059771efb8aaa31e9ef0cab6f78"
SDCPP_PYTHON_VERSION = "0.4.7"

RELEASE_BASE_URL = "https://github.com/leejet/stable-diffusion.cpp/releases/download"
ENV_SDIST = "LEMONADE_SDCPP_SDIST"
ENV_RELEASE_BASE_URL = "LEMONADE_SDCPP_RELEASE_BASE_URL"
ENV_NO_RELEASE = "LEMONADE_SDCPP_NO_RELEASE"

_EXE = ".exe" if sys.platform == "win32" else ""
SERVER_EXE = f"sd-server{_EXE}"
CLI_EXE = f"sd-cli{_EXE}"

SDCPP_SOURCE = VendoredSource(
    project="stable-diffusion.cpp", version=SDCPP_VERSION, commit=SDCPP_COMMIT,
    package="stable-diffusion-cpp-python", package_version=SDCPP_PYTHON_VERSION,
    filename=f"stable_diffusion_cpp_python-{SDCPP_PYTHON_VERSION}.tar.gz",
    vendor_path=("vendor", "stable-diffusion.cpp"),
    required=("examples/server/routes_openai.cpp", "examples/cli/main.cpp", "src/stable-diffusion.cpp", "ggml"),
    env_sdist=ENV_SDIST,
)

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # relocatable binaries
    "-DSD_BUILD_SHARED_LIBS=OFF",
    "-DSD_BUILD_EXAMPLES=ON",  # sd-cli and sd-server are examples
    # PNG is all we ask for; the web frontend needs pnpm and we serve our own app.
    "-DSD_WEBP=OFF",
    "-DSD_WEBM=OFF",
    "-DSD_SERVER_BUILD_FRONTEND=OFF",
    "-DGGML_OPENMP=OFF",  # ggml's own thread pool: no libgomp to ship next to a static binary
)


def release_asset_name(commit: str = SDCPP_COMMIT[:7], backend: str = "cpu") -> str | None:
    """The release archive of `backend` upstream's CI publishes for this OS/CPU at the pinned tag (its
    `sd-master-<short commit>-bin-*` assets: Linux x86-64 built on Ubuntu 24.04, Windows x64; the CPU
    one for AVX2), or None where there is none (macOS: its asset names carry the runner's OS version;
    build)."""
    machine = platform.machine().lower()
    if backend not in ("cpu", "vulkan"):
        return None
    if sys.platform == "win32" and machine in ("amd64", "x86_64"):
        return f"sd-master-{commit}-bin-win-{'avx2' if backend == 'cpu' else 'vulkan'}-x64.zip"
    if sys.platform.startswith("linux") and machine == "x86_64":
        return f"sd-master-{commit}-bin-Linux-Ubuntu-24.04-x86_64{'-vulkan' if backend == 'vulkan' else ''}.zip"
    return None


def tag_commit(tag: str) -> str | None:
    """The short commit a release tag names (`master-596-90e87bc` -> `90e87bc`), which the archive
    names carry; None for a tag of another shape."""
    m = re.fullmatch(r"master-\d+-([0-9a-f]{7,40})", tag)
    return m.group(1) if m else None


class SdCppInstall(NativeInstall):
    """The stable-diffusion.cpp `cpu` and `vulkan` backends under one cache dir."""

    recipe = "sd-cpp"
    version = SDCPP_VERSION
    executables = (SERVER_EXE, CLI_EXE)
    cmake_flags = CMAKE_FLAGS
    source = SDCPP_SOURCE
    build_targets = ("sd-server", "sd-cli")
    env_no_release = ENV_NO_RELEASE
    env_release_base_url = ENV_RELEASE_BASE_URL

    config_section = "sdcpp"
    upstream_repo = "leejet/stable-diffusion.cpp"

    def release_asset(self, backend: str = "cpu") -> str | None:
        commit = tag_commit(self.version)
        return release_asset_name(commit, backend) if commit else None

    def release_folder(self, backend: str = "cpu") -> str:
        return RELEASE_BASE_URL

    def _heading(self, backend: str) -> str:
        return (f"Lemonade install of sd-cpp:{backend} {SDCPP_VERSION} (stable-diffusion.cpp {SDCPP_COMMIT}, "
                f"stable-diffusion-cpp-python {SDCPP_PYTHON_VERSION})")

    def _verify(self, backend: str, staging: Path, blog: BuildLog, progress: Progress | None) -> dict[str, Any]:
        emit(progress, "install", "Checking the new sd-server and sd-cli", None)
        for exe, needle in ((SERVER_EXE, "--listen-port"), (CLI_EXE, "--upscale-model")):
            try:
                # A release archive's binaries load libstable-diffusion.so from their own folder.
                env = {**os.environ, "LD_LIBRARY_PATH": str(staging)}
                proc = subprocess.run([str(staging / exe), "--help"], capture_output=True, text=True, timeout=30,
                                      stdin=subprocess.DEVNULL, env=env)
                out = proc.stdout + proc.stderr
                ok, raw = needle in out, out[-2000:]
            except (OSError, subprocess.TimeoutExpired) as exc:
                ok, raw = False, f"{type(exc).__name__}: {exc}"
            blog.write(f"$ {exe} --help\n{raw}")
            if not ok:
                raise InstallError(f"The new {exe} does not run as expected (its --help failed; see the log).",
                                   code="verify_failed", log_path=blog.path)
        return self.version_fields()

    def version_fields(self) -> dict[str, Any]:
        if self.tag is not None:
            return {"version": self.tag}
        return {"version": SDCPP_VERSION, "commit": SDCPP_COMMIT, "stable-diffusion-cpp-python": SDCPP_PYTHON_VERSION}
