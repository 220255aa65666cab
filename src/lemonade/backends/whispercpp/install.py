"""The pinned whisper.cpp and how its `whisper-server` gets into `<cache>/backends/whispercpp/<backend>/`
(`cpu`, `vulkan`).

The pin is whisper.cpp v1.8.5 (commit f24588a2), the tree the `pywhispercpp` 1.5.1 sdist on PyPI
vendors under `whisper.cpp/` (its `examples/server` is whisper-server; the files are identical to
the v1.8.5 tag). Two ways to get it, both through `native_build.py` / `native_install.py` like
llama.cpp:

- the official release archive, where upstream publishes one for this platform and GitHub is
  reachable (tried first, failing within seconds offline). For v1.8.5 that is Windows only
  (`whisper-bin-x64.zip`, `whisper-bin-Win32.zip`); Linux and macOS always build from source;
- a static CMake build of the sdist's sources, target `whisper-server` (3 to 8 minutes on 2
  shared cores; `CMAKE_<LANG>_COMPILER_LAUNCHER=ccache` from the environment makes a rebuild quick).

The `vulkan` backend is the same sources built with `-DGGML_VULKAN=ON` (backends/llamacpp/gpu.py says what the
build needs: glslc, the Vulkan headers and loader, SPIRV-Headers). ggml-org publishes no Vulkan
archive of whisper.cpp; upstream Lemonade takes its Vulkan builds from its own build repository,
lemonade-sdk/whisper.cpp-rocm (`whisper-<tag>-linux-vulkan-x86_64.tar.gz`,
`whisper-<tag>-windows-vulkan-x64.zip`; its `get_install_params`), and so does this one, checked
against the digest GitHub publishes for it (release_digests.py); where that is unreachable (or has
no build of the tag), the sources are built.

Environment knobs, as llama.cpp's: `LEMONADE_WHISPERCPP_SDIST=<path>` (a local pywhispercpp
sdist; skips the release archive), `LEMONADE_WHISPERCPP_RELEASE_BASE_URL=<url>` (a mirror of
`.../releases/download`, of both release folders: the asset names differ), `LEMONADE_WHISPERCPP_NO_RELEASE=1`.

whisper-server has no `--version`: an install is checked by running `whisper-server --help`, and
install.json records the pinned version.
"""

from __future__ import annotations

import logging
import platform
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

WHISPER_CPP_VERSION = "v1.8.5"  # also the GitHub release tag
WHISPER_CPP_COMMIT = "f24588a272ae8e23280d9c220536437164e6ed28"
PYWHISPERCPP_VERSION = "1.5.1"

RELEASE_BASE_URL = "https://github.com/ggml-org/whisper.cpp/releases/download"
# Upstream Lemonade's builds of whisper.cpp for its GPU backends (whispercpp_server.cpp, get_install_params)
GPU_RELEASE_BASE_URL = "https://github.com/lemonade-sdk/whisper.cpp-rocm/releases/download"
ENV_SDIST = "LEMONADE_WHISPERCPP_SDIST"
ENV_RELEASE_BASE_URL = "LEMONADE_WHISPERCPP_RELEASE_BASE_URL"
ENV_NO_RELEASE = "LEMONADE_WHISPERCPP_NO_RELEASE"

EXE = "whisper-server.exe" if sys.platform == "win32" else "whisper-server"

WHISPER_SOURCE = VendoredSource(
    project="whisper.cpp", version=WHISPER_CPP_VERSION, commit=WHISPER_CPP_COMMIT, package="pywhispercpp",
    package_version=PYWHISPERCPP_VERSION, filename=f"pywhispercpp-{PYWHISPERCPP_VERSION}.tar.gz",
    vendor_path=("whisper.cpp",), required=("examples/server/server.cpp", "src/whisper.cpp", "ggml"),
    env_sdist=ENV_SDIST,
)

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one relocatable binary
    "-DWHISPER_BUILD_TESTS=OFF",
    "-DWHISPER_BUILD_EXAMPLES=ON",  # whisper-server is an example
    "-DWHISPER_BUILD_SERVER=ON",
    # Nothing that reaches for the network or for libraries the machine may lack.
    "-DWHISPER_CURL=OFF",
    "-DWHISPER_SDL2=OFF",
    "-DWHISPER_FFMPEG=OFF",
)


def release_asset_name(tag: str = WHISPER_CPP_VERSION, backend: str = "cpu") -> str | None:
    """The release archive of `backend` published for this OS/CPU at `tag`, or None: for `cpu`,
    ggml-org's (v1.8.5: Windows only); for `vulkan`, Lemonade's build repository's (x86-64 Linux and
    Windows)."""
    machine = platform.machine().lower()
    if backend == "vulkan":
        if machine not in ("x86_64", "amd64"):
            return None
        if sys.platform.startswith("linux"):
            return f"whisper-{tag}-linux-vulkan-x86_64.tar.gz"
        return f"whisper-{tag}-windows-vulkan-x64.zip" if sys.platform == "win32" else None
    if backend != "cpu" or sys.platform != "win32":
        return None
    return {"amd64": "whisper-bin-x64.zip", "x86_64": "whisper-bin-x64.zip",
            "x86": "whisper-bin-Win32.zip", "i386": "whisper-bin-Win32.zip"}.get(machine)


class WhisperCppInstall(NativeInstall):
    """The whisper.cpp `cpu` and `vulkan` backends under one cache dir."""

    recipe = "whispercpp"
    version = WHISPER_CPP_VERSION
    executables = (EXE,)
    cmake_flags = CMAKE_FLAGS
    source = WHISPER_SOURCE
    build_targets = ("whisper-server",)
    env_no_release = ENV_NO_RELEASE
    env_release_base_url = ENV_RELEASE_BASE_URL

    config_section = "whispercpp"
    upstream_repo = "ggml-org/whisper.cpp"

    def release_asset(self, backend: str = "cpu") -> str | None:
        return release_asset_name(self.version, backend)

    def release_folder(self, backend: str = "cpu") -> str:
        return GPU_RELEASE_BASE_URL if backend != "cpu" else RELEASE_BASE_URL

    def _heading(self, backend: str) -> str:
        return (f"Lemonade install of whispercpp:{backend} {WHISPER_CPP_VERSION} (whisper.cpp {WHISPER_CPP_COMMIT}, "
                f"pywhispercpp {PYWHISPERCPP_VERSION})")

    def _verify(self, backend: str, staging: Path, blog: BuildLog, progress: Progress | None) -> dict[str, Any]:
        emit(progress, "install", "Checking the new whisper-server", None)
        try:
            proc = subprocess.run([str(staging / EXE), "--help"], capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL)
            ok, raw = proc.returncode == 0 and "--inference-path" in proc.stdout + proc.stderr, proc.stderr[-2000:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, raw = False, f"{type(exc).__name__}: {exc}"
        blog.write(f"$ whisper-server --help\n{raw}")
        if not ok:
            raise InstallError("The new whisper-server does not run as expected (its --help failed; see the log).",
                               code="verify_failed", log_path=blog.path)
        return self.version_fields()

    def version_fields(self) -> dict[str, Any]:
        if self.tag is not None:
            return {"version": self.tag}
        return {"version": WHISPER_CPP_VERSION, "commit": WHISPER_CPP_COMMIT, "pywhispercpp": PYWHISPERCPP_VERSION}
