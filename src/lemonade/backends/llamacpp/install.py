"""The llama.cpp engine's installer, and its backends' states reported truthfully.

`engine.py` beside it describes the engine; the install mechanics (lock, temp folder, atomic swap,
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

Two ways to get the pinned llama.cpp (see `llamacpp/build.py`): the official GitHub release archive
(tried first, with a short connect timeout, and used only when its SHA-256 matches the one pinned in
`release_digests.py` or, for an asset without a pin, the one GitHub publishes for it: one that does not
match is refused and nothing is installed) and a source
build of the `llama-cpp-python` sdist's `vendor/llama.cpp`. Environment knobs:

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
from lemonade.backends.llamacpp.build import (
    ENV_NO_RELEASE,
    ENV_SDIST,
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_PYTHON_VERSION,
    LLAMA_CPP_VERSION,
    RPC_SERVER,
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
    release_url,
    staged_version,
)
from lemonade.backends.llamacpp.descriptor import DESCRIPTOR
from lemonade.backends.llamacpp.gpu import (
    GPU_BACKENDS,
    backend_devices,
    missing_toolkit,
    release_assets,
    unsupported_message,
)
from lemonade.backends.native_install import INSTALL_JSON, NativeInstall, copy_tree_contents, release_allowed, with_tail
from lemonade.system.devices import detect_devices

__all__ = [
    "PINNED_VERSION",
    "LLAMA_CPP_PYTHON_VERSION",
    "BackendInstaller",
    "BackendState",
    "InstallError",
]

log = logging.getLogger("lemonade.install")

PINNED_VERSION = LLAMA_CPP_VERSION
PINNED_BACKENDS = ("cpu", *GPU_BACKENDS)  # the ones Lemonade installs (release archive or source build)

_EXE = "llama-server.exe" if sys.platform == "win32" else "llama-server"


def _install_action(recipe: str, backend: str) -> str:
    return f"lemonade backends install {recipe}:{backend}"


def _assets(backend: str, tag: str = PINNED_VERSION) -> list[str]:
    """The release archives of `backend` at `tag` for this machine, the main one first."""
    if backend == "cpu":
        asset = release_asset_name(tag)
        return [asset] if asset else []
    return release_assets(backend, tag)


class BackendInstaller(NativeInstall):
    """Installs, removes and describes the llama.cpp backends under one cache dir.

    Cheap to construct; holds no state besides a small cache of `llama-server --version` results.
    """

    recipe = "llamacpp"
    version = PINNED_VERSION

    def __init__(self, cache_dir: Path, tag: str | None = None):
        super().__init__(cache_dir, tag)
        self._version_cache: dict[tuple[str, float], str | None] = {}

    # --- queries -------------------------------------------------------------------------------

    def llama_server_path(self, backend: str) -> Path | None:
        if backend == "system":
            found = shutil.which("llama-server")
            return Path(found) if found else None
        if backend not in PINNED_BACKENDS:
            return None
        exe = self.backend_dir(backend) / _EXE
        if exe.is_file() and os.access(exe, os.X_OK) and (self.backend_dir(backend) / INSTALL_JSON).is_file():
            return exe
        return None

    def rpc_server_path(self, backend: str) -> Path | None:
        """The llama.cpp RPC worker program of an installed backend (`ggml-rpc-server`; release
        archives before the rename ship it as `rpc-server`), or on PATH for `system`."""
        names = [RPC_SERVER, "rpc-server"]
        if sys.platform == "win32":
            names = [n + ".exe" for n in names]
        if backend == "system":
            found = next((shutil.which(n) for n in names if shutil.which(n)), None)
            return Path(found) if found else None
        if self.llama_server_path(backend) is None:
            return None
        return next((self.backend_dir(backend) / n for n in names if (self.backend_dir(backend) / n).is_file()), None)

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
        if backend in PINNED_BACKENDS:
            return self._pinned_state(backend)
        return BackendState(recipe, backend, "unsupported", message=f"Unknown backend '{backend}'")

    def _pinned_state(self, backend: str) -> BackendState:
        """A backend Lemonade installs. A GPU backend with no device here is `unsupported` until it is
        installed anyway (`force`); an installed one is reported as such, whatever the devices."""
        action = _install_action("llamacpp", backend)
        report = detect_devices()
        devices = backend_devices(backend, report)
        exe = self.backend_dir(backend) / _EXE
        if not exe.is_file():
            if not devices:
                return BackendState("llamacpp", backend, "unsupported", message=unsupported_message(backend, report),
                                    action="", devices=[])
            return BackendState(
                "llamacpp", backend, "installable",
                message=f"Backend is supported but not installed. Installing it {self._how(backend)}.",
                action=action, version=PINNED_VERSION, devices=devices,
            )  # fmt: skip
        info = self.read_install_info(backend)
        if info is None:
            return BackendState(
                "llamacpp", backend, "update_required",
                message="The installed backend has no readable install.json; reinstall it.",
                action=action, devices=devices,
            )  # fmt: skip
        version = info.get("version")
        if version != PINNED_VERSION or info.get("llama_cpp_python") != LLAMA_CPP_PYTHON_VERSION:
            return BackendState(
                "llamacpp", backend, "update_required",
                message=f"Backend update is required before use (installed {version}, "
                f"this Lemonade uses {PINNED_VERSION}).",
                action=action, version=version, devices=devices,
            )  # fmt: skip
        if info.get("source") == "source-build" and info.get("cmake_flags") != build_flags(backend):
            return BackendState(
                "llamacpp", backend, "update_required",
                message="The installed llama.cpp was built with other options than this Lemonade uses for this "
                "machine (e.g. with AMX kernels, which crashed, or for another GPU); rebuild it.",
                action=action, version=version, devices=devices,
            )  # fmt: skip
        return BackendState("llamacpp", backend, "installed", version=version, devices=devices)

    @staticmethod
    def _how(backend: str) -> str:
        if not _assets(backend):
            return "builds llama.cpp from source (about 10 minutes on 2 cores; longer for GPU backends)"
        return ("downloads the official llama.cpp release archive (checked against its SHA-256), or builds it "
                "from source when that is unreachable (about 10 minutes on 2 cores; longer for GPU backends)")

    def default_backend(self) -> str:
        """The best backend for this machine's devices (llamacpp.gpu.best_backend: CUDA, ROCm, Vulkan
        or Metal where there is such a GPU); else `cpu`, unless only a system llama-server is ready
        (then no build is needed to serve)."""
        from lemonade.backends.llamacpp.gpu import best_backend

        gpu = best_backend(detect_devices())
        if gpu is not None:
            return gpu
        cpu = self.state("llamacpp", "cpu").state
        if cpu != "installed" and self.state("llamacpp", "system").state == "installed":
            return "system"
        return "cpu"

    # --- install / uninstall -------------------------------------------------------------------

    def check_request(self, recipe: str, backend: str, force: bool = False) -> None:
        """Refuse unknown or unsupported recipe/backend pairs before any work starts. `force`
        bypasses the hardware filter (a GPU backend with no device here), never the OS: a Metal
        build cannot run on Linux."""
        if recipe != "llamacpp":
            raise InstallError(f"Unknown recipe '{recipe}'.", code="unknown_recipe")
        if backend not in DESCRIPTOR.backends:
            raise InstallError(
                f"Unknown llamacpp backend '{backend}' (known: {', '.join(DESCRIPTOR.backends)}).",
                code="unknown_backend",
            )
        if backend in GPU_BACKENDS and not _assets(backend) and "macOS" in missing_toolkit(backend):
            raise InstallError(f"llamacpp:{backend} cannot be installed: Requires macOS", code="unsupported_backend")
        if backend in PINNED_BACKENDS and not force:
            st = self.state(recipe, backend)
            if st.state == "unsupported":
                raise InstallError(
                    f"llamacpp:{backend} cannot be installed: {st.message}. Install it anyway with force "
                    f"(`lemonade backends install llamacpp:{backend} --force`, or \"force\": true).",
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
        self.check_request(recipe, backend, force)
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
        version = staged_version(staging / _EXE, blog, progress)
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
        assets = _assets(backend)
        if release_allowed(ENV_SDIST, ENV_NO_RELEASE, assets[0] if assets else None):
            try:
                self._unpack_releases(backend, assets, staging, work, blog, progress)
                src = self.source_dir()
                return {"source": "release", "assets": assets, "source_dir": str(src) if src else None}
            except InstallError:
                raise
            except Exception as exc:  # any failure here means: build from source
                release_error = f"{type(exc).__name__}: {exc}"
                blog.write(f"== release archive unavailable ({release_error}); building from source")
                log.info("llama.cpp release archive unavailable (%s); building from source", release_error)
                emit(progress, "download", "Release archive unavailable; building llama.cpp from source", None)

        try:
            tools = check_toolchain()
            missing = missing_toolkit(backend) if backend in GPU_BACKENDS else []
            if missing:
                raise InstallError(f"Cannot build the llama.cpp {backend} backend from source: {'; '.join(missing)} "
                                   "not found. Install it and try again.", code="toolchain_missing")
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
        flags = build_flags(backend)
        bin_dir = cmake_build(src, self.build_dir(backend), tools, blog, progress, flags=flags)
        emit(progress, "install", f"Copying binaries into {self.backend_dir(backend)}", None)
        for name in ("llama-server", "llama-gguf-split", RPC_SERVER):
            if (bin_dir / name).is_file():
                shutil.copy2(bin_dir / name, staging / name)
        return {"source": "source-build", "source_dir": str(src), "build_dir": str(self.build_dir(backend)),
                "cmake_flags": flags}

    def _unpack_releases(self, backend: str, assets: list[str], staging: Path, work: Path, blog: BuildLog,
                         progress: Callable[[dict], None] | None, tag: str = PINNED_VERSION) -> None:
        """The main archive (with llama-server), then any runtime archive (CUDA's libraries) next to it."""
        for i, asset in enumerate(assets):
            exe = _EXE if i == 0 else ("cudart64_*.dll" if sys.platform == "win32" else "libcudart.so*")
            folder = fetch_release(self.downloads_dir, work / f"a{i}", blog, progress, url=release_url(asset, tag),
                                   exe=exe)
            for item in folder.iterdir():
                if not (staging / item.name).exists():
                    copy_tree_contents(item.parent, staging, only=item.name)
            blog.write(f"== release archive {asset} unpacked from {folder}")

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


