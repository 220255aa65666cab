"""The llama.cpp engine's installer, and its backends' states reported truthfully.

`llamacpp.py` describes the engine; the install mechanics (lock, temp folder, atomic swap,
install.json, build log) are `native_install.py`'s, shared with whisper.cpp. The layout under
`<cache>/backends/llamacpp/`:

    cpu/                     the installed backend (appears only when complete)
      llama-server           executable (a static build, or a release archive's binary + libs)
      llama-gguf-split       (source builds)
      install.json           {"version", "source": "release"|"source-build", "llama_cpp_python", ...}
    cpu-build.log            full log of the last install attempt (kept after failures)
    _downloads/              llama-cpp-python sdist / release archive, reused by retries
    _src/llama.cpp-<ver>/    extracted llama.cpp sources (convert_hf_to_gguf.py, gguf-py)
    _build/cpu-<ver>/        CMake build folder, kept so a retried build is incremental
    .install.lock            serialises installs across threads and processes

An install is built in a temp sibling folder (`.cpu.tmp-*`) and renamed into place at the end, so
a failed or interrupted install never leaves something that looks installed.

Two ways to get the pinned llama.cpp (see `llamacpp_build`): the official GitHub release archive
(tried first, with a short connect timeout) and a source build of the `llama-cpp-python` sdist's
`vendor/llama.cpp`. Environment knobs:

- `LEMONADE_LLAMACPP_SDIST=<path>`: use this local sdist tarball instead of `pip download`; the
  release archive is then skipped (you asked for a build from that source).
- `LEMONADE_LLAMACPP_RELEASE_BASE_URL=<url>`: mirror of `.../releases/download` (folder per tag).
- `LEMONADE_LLAMACPP_NO_RELEASE=1`: never try the release archive.

The `system` backend is whatever `llama-server` is on PATH; Lemonade never installs or removes it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemonade.backends.engine import BackendState
from lemonade.backends.llamacpp_build import (
    ENV_NO_RELEASE,
    ENV_SDIST,
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_PYTHON_VERSION,
    LLAMA_CPP_VERSION,
    BuildLog,
    InstallError,
    build_flags,
    check_toolchain,
    cmake_build,
    emit,
    extract_llama_cpp,
    fetch_release,
    fetch_sdist,
    probe_version,
    release_asset_name,
)
from lemonade.backends.native_install import INSTALL_JSON, NativeInstall, copy_tree_contents, release_allowed, with_tail

__all__ = [
    "LLAMACPP_BACKENDS",
    "LLAMACPP_ALL_BACKENDS",
    "PINNED_VERSION",
    "LLAMA_CPP_PYTHON_VERSION",
    "BackendInstaller",
    "BackendState",
    "InstallError",
]

log = logging.getLogger("lemonade.install")

PINNED_VERSION = LLAMA_CPP_VERSION
LLAMACPP_BACKENDS = ("cpu", "system")  # the ones that can work on this machine
LLAMACPP_ALL_BACKENDS = ("cpu", "system", "vulkan", "rocm", "metal")  # what system-info lists

_EXE = "llama-server.exe" if sys.platform == "win32" else "llama-server"


def _install_action(recipe: str, backend: str) -> str:
    return f"lemonade backends install {recipe}:{backend}"


class BackendInstaller(NativeInstall):
    """Installs, removes and describes the llama.cpp backends under one cache dir.

    Cheap to construct; holds no state besides a small cache of `llama-server --version` results.
    """

    recipe = "llamacpp"
    version = PINNED_VERSION

    def __init__(self, cache_dir: Path):
        super().__init__(cache_dir)
        self._version_cache: dict[tuple[str, float], str | None] = {}

    # --- queries -------------------------------------------------------------------------------

    def llama_server_path(self, backend: str) -> Path | None:
        if backend == "system":
            found = shutil.which("llama-server")
            return Path(found) if found else None
        if backend not in LLAMACPP_BACKENDS:
            return None
        exe = self.backend_dir(backend) / _EXE
        if exe.is_file() and os.access(exe, os.X_OK) and (self.backend_dir(backend) / INSTALL_JSON).is_file():
            return exe
        return None

    def source_dir(self) -> Path | None:
        """Extracted llama.cpp sources (convert_hf_to_gguf.py, gguf-py), if present."""
        candidates: list[Path] = []
        info = self.read_install_info("cpu")
        if info and info.get("source_dir"):
            candidates.append(Path(info["source_dir"]))
        candidates.append(self.src_root / f"llama.cpp-{PINNED_VERSION}")
        for path in candidates:
            if (path / ".lemonade-extracted").is_file() and (path / "convert_hf_to_gguf.py").is_file():
                return path
        return None

    def ensure_source_dir(self, progress: Callable[[dict], None] | None = None) -> Path:
        """Make the llama.cpp sources available without building (e.g. after a release install)."""
        existing = self.source_dir()
        if existing:
            return existing
        with self._lock():
            blog = BuildLog(self.root / "source-extract.log")
            try:
                sdist = fetch_sdist(self.downloads_dir, blog, progress)
                return extract_llama_cpp(sdist, self.src_root, blog, progress)
            except InstallError as exc:
                raise InstallError(with_tail(str(exc), blog), code=exc.code, log_path=blog.path) from exc
            finally:
                blog.close()

    def _system_version(self, exe: Path) -> str | None:
        try:
            key = (str(exe.resolve()), exe.stat().st_mtime)
        except OSError:
            return None
        if key not in self._version_cache:
            try:
                version, _raw = probe_version(exe)
            except Exception:  # any failure to run it: version unknown, still installed
                version = None
            self._version_cache[key] = version
        return self._version_cache[key]

    def state(self, recipe: str, backend: str) -> BackendState:
        if recipe != "llamacpp":
            return BackendState(recipe, backend, "unsupported", message=f"Unknown recipe '{recipe}'.")
        if backend == "system":
            exe = self.llama_server_path("system")
            if exe is None:
                return BackendState(
                    recipe, backend, "unsupported",
                    message="llama-server not found on PATH",
                    action="install llama.cpp and put llama-server on PATH",
                )  # fmt: skip
            return BackendState(recipe, backend, "installed", version=self._system_version(exe), devices=["cpu"])
        if backend == "cpu":
            return self._cpu_state()
        return BackendState(recipe, backend, "unsupported", message=_unsupported_message(backend))

    def _cpu_state(self) -> BackendState:
        action = _install_action("llamacpp", "cpu")
        exe = self.backend_dir("cpu") / _EXE
        if not exe.is_file():
            how = (
                "downloads the official llama.cpp release archive, or builds it from source "
                "when that is unreachable (about 10 minutes on 2 cores)"
                if release_asset_name()
                else "builds llama.cpp from source (about 10 minutes on 2 cores)"
            )
            return BackendState(
                "llamacpp", "cpu", "installable",
                message=f"Backend is supported but not installed. Installing it {how}.",
                action=action, version=PINNED_VERSION, devices=["cpu"],
            )  # fmt: skip
        info = self.read_install_info("cpu")
        if info is None:
            return BackendState(
                "llamacpp", "cpu", "update_required",
                message="The installed backend has no readable install.json; reinstall it.",
                action=action, devices=["cpu"],
            )  # fmt: skip
        version = info.get("version")
        if version != PINNED_VERSION or info.get("llama_cpp_python") != LLAMA_CPP_PYTHON_VERSION:
            return BackendState(
                "llamacpp", "cpu", "update_required",
                message=f"Backend update is required before use (installed {version}, "
                f"this Lemonade uses {PINNED_VERSION}).",
                action=action, version=version, devices=["cpu"],
            )  # fmt: skip
        if info.get("source") == "source-build" and info.get("cmake_flags") != build_flags():
            return BackendState(
                "llamacpp", "cpu", "update_required",
                message="The installed llama.cpp was built with other options than this Lemonade uses for this "
                "CPU (e.g. with AMX kernels, which crashed); rebuild it.",
                action=action, version=version, devices=["cpu"],
            )  # fmt: skip
        return BackendState("llamacpp", "cpu", "installed", version=version, devices=["cpu"])

    def default_backend(self) -> str:
        """`cpu`, unless only a system llama-server is ready (then no build is needed to serve)."""
        cpu = self.state("llamacpp", "cpu").state
        if cpu != "installed" and self.state("llamacpp", "system").state == "installed":
            return "system"
        return "cpu"

    # --- install / uninstall -------------------------------------------------------------------

    def check_request(self, recipe: str, backend: str) -> None:
        """Refuse unknown or unsupported recipe/backend pairs before any work starts."""
        if recipe != "llamacpp":
            raise InstallError(f"Unknown recipe '{recipe}'.", code="unknown_recipe")
        if backend not in LLAMACPP_ALL_BACKENDS:
            raise InstallError(
                f"Unknown llamacpp backend '{backend}' (known: {', '.join(LLAMACPP_ALL_BACKENDS)}).",
                code="unknown_backend",
            )
        if backend not in LLAMACPP_BACKENDS:
            raise InstallError(
                f"llamacpp:{backend} cannot be installed: {_unsupported_message(backend)}",
                code="unsupported_backend",
            )

    def install(
        self,
        recipe: str,
        backend: str,
        progress: Callable[[dict], None] | None = None,
        force: bool = False,
    ) -> dict:
        """Install (or update) a backend; blocking. `force=True` reinstalls an up-to-date one.

        Returns {"status": "success", "recipe", "backend", "version"}; raises InstallError.
        """
        self.check_request(recipe, backend)
        result = {"status": "success", "recipe": recipe, "backend": backend}
        if backend == "system":
            st = self.state(recipe, backend)
            if st.state != "installed":
                raise InstallError(f"{st.message}: {st.action}.", code="not_found")
            emit(progress, "done", f"Using {self.llama_server_path('system')}", 100.0)
            return {**result, "version": st.version}

        return self.install_pinned(backend, progress, force)

    def is_installed(self, backend: str) -> bool:
        return self.state(self.recipe, backend).state == "installed"

    def _heading(self, backend: str) -> str:
        return (f"Lemonade install of llamacpp:{backend} {PINNED_VERSION} (llama.cpp {LLAMA_CPP_COMMIT}, "
                f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION})")

    def _verify(self, backend: str, staging: Path, blog: BuildLog, progress: Callable[[dict], None] | None
                ) -> dict[str, Any]:
        emit(progress, "install", "Checking the new llama-server", None)
        try:
            version, raw = probe_version(staging / _EXE)
        except Exception as exc:
            version, raw = None, f"{type(exc).__name__}: {exc}"
        blog.write(f"$ llama-server --version\n{raw}")
        if version != PINNED_VERSION:
            raise InstallError(
                f"The new llama-server does not run as expected (reported {version!r}, expected {PINNED_VERSION}).",
                code="verify_failed",
                log_path=blog.path,
            )
        return {"version": version, "commit": LLAMA_CPP_COMMIT, "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION}

    def _produce(
        self, backend: str, staging: Path, work: Path, blog: BuildLog, progress: Callable[[dict], None] | None
    ) -> dict:
        """Fill `staging` with the binaries; return the install.json fields known so far."""
        release_error: str | None = None
        if release_allowed(ENV_SDIST, ENV_NO_RELEASE, release_asset_name()):
            try:
                folder = fetch_release(self.downloads_dir, work, blog, progress)
                copy_tree_contents(folder, staging)
                blog.write(f"== release archive unpacked from {folder}")
                src = self.source_dir()
                return {"source": "release", "source_dir": str(src) if src else None}
            except InstallError:
                raise
            except Exception as exc:  # any failure here means: build from source
                release_error = f"{type(exc).__name__}: {exc}"
                blog.write(f"== release archive unavailable ({release_error}); building from source")
                log.info("llama.cpp release archive unavailable (%s); building from source", release_error)
                emit(progress, "download", "Release archive unavailable; building llama.cpp from source", None)

        try:
            tools = check_toolchain()
        except InstallError as exc:
            if release_error:
                raise InstallError(
                    f"Could not download the llama.cpp release archive ({release_error}), and {exc}",
                    code=exc.code,
                ) from exc
            raise
        blog.write("== toolchain: " + ", ".join(f"{k}={v}" for k, v in tools.items() if v))
        sdist = fetch_sdist(self.downloads_dir, blog, progress)
        src = extract_llama_cpp(sdist, self.src_root, blog, progress)
        bin_dir = cmake_build(src, self.build_dir(backend), tools, blog, progress)
        emit(progress, "install", f"Copying binaries into {self.backend_dir(backend)}", None)
        for name in ("llama-server", "llama-gguf-split"):
            if (bin_dir / name).is_file():
                shutil.copy2(bin_dir / name, staging / name)
        return {"source": "source-build", "source_dir": str(src), "build_dir": str(self.build_dir(backend)),
                "cmake_flags": build_flags()}

    def uninstall(self, recipe: str, backend: str) -> dict:
        """Remove an installed backend (binaries and its build folder).

        The shared `_downloads/` and `_src/` stay: they hold the converter scripts and let a
        reinstall work offline. Uninstalling something that is not installed succeeds.
        """
        self.check_request(recipe, backend)
        if backend == "system":
            raise InstallError(
                "The system backend is the llama-server on PATH; Lemonade does not manage it. "
                "Remove it with the tool that installed it.",
                code="unsupported_backend",
            )
        return self.remove(backend)


# --- helpers -----------------------------------------------------------------------------------


def _unsupported_message(backend: str) -> str:
    if backend == "metal" and sys.platform != "darwin":
        return "Requires macOS"
    names = {"vulkan": "Vulkan", "rocm": "ROCm", "metal": "Metal"}
    return (
        f"The {names.get(backend, backend)} backend is not available in this build of Lemonade; "
        "use llamacpp:cpu or llamacpp:system."
    )
