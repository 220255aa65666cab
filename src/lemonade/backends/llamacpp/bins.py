"""`llamacpp.<backend>_bin`: which llama.cpp a backend runs (guide-configuration-README.md, "Backend
binary selection").

- `"builtin"` (or `""`): the version this Lemonade pins, installed by Lemonade (`install.py`);
- a release tag such as `"b8664"`: that upstream release's archive, installed next to the pinned
  one in `<cache>/backends/llamacpp/<backend>@<tag>/` (so switching back costs nothing). Release
  archives only: the source build fallback is of the pinned version;
- `"latest"`: the newest upstream release, resolved once per server process (GitHub's API,
  `LEMONADE_LLAMACPP_LATEST_URL` to ask another URL of the same shape), then installed like a tag.
  Offline or with `no_fetch_executables`, the newest tag installed before is used, with a warning;
- an absolute path: a folder you built yourself. Used as it is: never downloaded into, never
  removed, reported with the version it prints.

Which kind a value is, and whether it is well formed, is backends/llamacpp/settings.py's (config validation
checks values with it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from lemonade.backends.bin_select import latest_release_tag
from lemonade.backends.engine import BackendState, InstallError, Progress
from lemonade.backends.llamacpp.build import RPC_SERVER, BuildLog, emit, probe_version, staged_version
from lemonade.backends.llamacpp.descriptor import DESCRIPTOR
from lemonade.backends.llamacpp.gpu import backend_devices, unsupported_message
from lemonade.backends.llamacpp.install import PINNED_BACKENDS, BackendInstaller, _assets
from lemonade.system.devices import detect_devices

log = logging.getLogger("lemonade.install")

BIN_BACKENDS = DESCRIPTOR.bins  # the backends with a `*_bin` key of the llamacpp section
LATEST_URL = "https://api.github.com/repos/ggml-org/llama.cpp/releases/latest"
ENV_LATEST_URL = "LEMONADE_LLAMACPP_LATEST_URL"
_EXE = "llama-server.exe" if os.name == "nt" else "llama-server"


def resolve_latest() -> str:
    """The tag of the newest llama.cpp release (raises on any failure)."""
    return latest_release_tag(os.environ.get(ENV_LATEST_URL) or LATEST_URL)


class OwnBuild:
    """A llama.cpp build of the user's, in a folder of theirs: the installer's query API over it."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder = folder
        self.key = key  # the setting that names it, for messages
        self._version: tuple[float, str | None] | None = None

    def llama_server_path(self, backend: str) -> Path | None:
        exe = self.folder / _EXE
        return exe if exe.is_file() and os.access(exe, os.X_OK) else None

    def rpc_server_path(self, backend: str) -> Path | None:
        return next((self.folder / n for n in (RPC_SERVER, "rpc-server") if (self.folder / n).is_file()), None)

    def version(self, exe: Path) -> str | None:
        mtime = exe.stat().st_mtime
        if self._version is None or self._version[0] != mtime:
            try:
                found, _raw = probe_version(exe)
            except Exception:  # any failure to run it: version unknown (its start will say more)
                found = None
            self._version = (mtime, found)
        return self._version[1]

    def state(self, recipe: str, backend: str) -> BackendState:
        exe = self.llama_server_path(backend)
        if exe is None:
            return BackendState(recipe, backend, "unsupported",
                                message=f"{self.key} points at {self.folder}, which holds no runnable {_EXE}",
                                action=f"lemonade config set {self.key}=builtin")
        return BackendState(recipe, backend, "installed", version=self.version(exe), devices=[backend],
                            message=f"your own build in {self.folder} ({self.key})")

    def is_installed(self, backend: str) -> bool:
        return self.llama_server_path(backend) is not None

    def check_request(self, recipe: str, backend: str, force: bool = False) -> None:
        return None

    def install(self, recipe: str, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        st = self.state(recipe, backend)
        if st.state != "installed":
            raise InstallError(f"{st.message}. Lemonade never downloads into your own build's folder; fix it, or "
                               f"use the version Lemonade ships: {st.action}", code="not_found")
        emit(progress, "done", f"Using your own build in {self.folder}", 100.0)
        return {"status": "success", "recipe": recipe, "backend": backend, "version": st.version}

    def uninstall(self, recipe: str, backend: str) -> dict[str, Any]:
        raise InstallError(f"{self.key} points at your own build in {self.folder}; Lemonade does not remove it. "
                           f"Set {self.key}=builtin to use the version Lemonade ships.", code="unsupported_backend")


class TaggedInstaller(BackendInstaller):
    """One upstream release of llama.cpp, installed from its release archive beside the pinned one."""

    def __init__(self, cache_dir: Path, tag: str) -> None:
        super().__init__(cache_dir, tag)  # `<backend>@<tag>/` and its log, as NativeInstall lays out a tag

    def llama_server_path(self, backend: str) -> Path | None:
        if backend not in PINNED_BACKENDS:
            return super().llama_server_path(backend)
        info = self.read_install_info(backend) or {}
        exe = self.backend_dir(backend) / _EXE
        return exe if exe.is_file() and os.access(exe, os.X_OK) and info.get("version") == self.version else None

    def state(self, recipe: str, backend: str) -> BackendState:
        if backend not in PINNED_BACKENDS:
            return super().state(recipe, backend)
        action = f"lemonade backends install llamacpp:{backend}"
        if self.llama_server_path(backend) is not None:
            devices = backend_devices(backend, detect_devices()) or [backend]
            return BackendState(recipe, backend, "installed", version=self.version, devices=devices)
        devices = backend_devices(backend, detect_devices())
        if not devices:
            return BackendState(recipe, backend, "unsupported", message=unsupported_message(backend, detect_devices()))
        if not _assets(backend, self.version):
            return BackendState(recipe, backend, "unsupported",
                                message=f"llama.cpp publishes no {backend} release archive for this platform, and "
                                "Lemonade builds from source only the version it ships (llamacpp."
                                f"{backend}_bin=builtin)")
        return BackendState(recipe, backend, "installable", version=self.version, devices=devices, action=action,
                            message=f"Release {self.version} is not installed yet; installing it downloads the "
                                    "official release archive.")

    def _heading(self, backend: str) -> str:
        return f"Lemonade install of llamacpp:{backend} {self.version} (official release archive)"

    def _produce(self, backend: str, staging: Path, work: Path, blog: BuildLog, progress: Progress | None) -> dict:
        assets = _assets(backend, self.version)
        try:
            self._unpack_releases(backend, assets, staging, work, blog, progress, tag=self.version)
        except InstallError:
            raise
        except Exception as exc:
            raise InstallError(f"Could not download llama.cpp {self.version} ({', '.join(assets)}): "
                               f"{type(exc).__name__}: {exc}. Check the tag, or use the version Lemonade ships: "
                               f"lemonade config set llamacpp.{backend}_bin=builtin", code="download_failed") from exc
        return {"source": "release", "assets": assets}

    def _verify(self, backend: str, staging: Path, blog: BuildLog, progress: Progress | None) -> dict[str, Any]:
        version = staged_version(staging / _EXE, blog, progress)
        if version != self.version:
            raise InstallError(f"The downloaded llama-server reports {version!r}, not {self.version}.",
                               code="verify_failed", log_path=blog.path)
        return {"version": version}
