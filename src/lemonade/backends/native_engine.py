"""Backend state, install and uninstall of an engine whose one backend is `cpu`: pinned native sources
(a release archive where upstream publishes one, else a source build), installed by a `NativeInstall`.

Why a mixin: whisper.cpp and stable-diffusion.cpp answer these questions the same way, word for word
but for the product's name and build time; each engine keeps only what differs (`product`,
`build_minutes`, `release_asset`, `unsupported_message`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lemonade.backends.engine import BackendState, InstallError, Progress, install_action
from lemonade.backends.native_install import NativeInstall


class NativeCpuBackend:
    """Mixed into an `Engine` (before it): `state`, `install` and `uninstall` for the `cpu` backend."""

    recipe: str
    backends: tuple[str, ...]
    installer: NativeInstall
    check_request: Callable[..., None]  # the Engine's
    product = ""  # the upstream project's name, e.g. "whisper.cpp"
    build_minutes = ""  # a source build's time on 2 cores, e.g. "3 to 8"

    def release_asset(self) -> str | None:
        """The release archive upstream publishes for this machine, None where a source build is the way."""
        raise NotImplementedError

    def unsupported_message(self, backend: str) -> str:
        """Why `backend` (not cpu) cannot be used here, and what to use instead."""
        raise NotImplementedError

    def state(self, backend: str) -> BackendState:
        if backend != "cpu":
            return BackendState(self.recipe, backend, "unsupported", message=self.unsupported_message(backend))
        version = self.installer.version
        action = install_action(self.recipe, "cpu")
        installed = self.installer.installed_version("cpu")
        if self.installer.built_with_other_flags("cpu"):
            return BackendState(self.recipe, "cpu", "update_required", action=action, version=installed,
                                devices=["cpu"], message=f"The installed {self.product} was built with other "
                                "options than this Lemonade uses for this CPU (e.g. with AMX kernels); rebuild it.")
        if installed == version:
            return BackendState(self.recipe, "cpu", "installed", version=installed, devices=["cpu"])
        if installed is not None or self.installer.backend_dir("cpu").exists():
            return BackendState(self.recipe, "cpu", "update_required",
                                message=f"Backend update is required before use (installed {installed}, this "
                                        f"Lemonade uses {version}).",
                                action=action, version=installed, devices=["cpu"])
        how = (f"downloads the official {self.product} release archive, or builds it from source when that is "
               f"unreachable" if self._release_pinned() else f"builds {self.product} from source")
        return BackendState(self.recipe, "cpu", "installable",
                            message=f"Backend is supported but not installed. Installing it {how} "
                                    f"({self.build_minutes} minutes on 2 cores; needs cmake and a C++ compiler).",
                            action=action, version=version, devices=["cpu"])

    def _release_pinned(self) -> bool:
        """A release archive exists for this machine (used once its SHA-256 is checked against a pin or
        the digest GitHub publishes for it, release_digests.py)."""
        return self.release_asset() is not None

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend)
        return self.installer.install_pinned(backend, progress, force)

    def uninstall(self, backend: str) -> dict[str, Any]:
        if backend not in self.backends:
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: {', '.join(self.backends)}).",
                               code="unknown_backend")
        if backend != "cpu":
            raise InstallError(f"{self.recipe}:{backend} is not installed by this build: "
                               f"{self.unsupported_message(backend)}", code="unsupported_backend")
        return self.installer.remove(backend)
